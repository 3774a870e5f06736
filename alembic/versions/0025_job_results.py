"""pyalk 0025: apply sql/versions/0025_job_results.sql."""

from pyalk.schema.migrate import apply_version

revision = "0025"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0025")
