"""pyalk 0030: apply sql/versions/0030_job_outcome.sql."""

from pyalk.schema.migrate import apply_version

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0030")
