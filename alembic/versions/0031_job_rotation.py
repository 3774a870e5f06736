"""pyalk 0031: apply sql/versions/0031_job_rotation.sql."""

from pyalk.schema.migrate import apply_version

revision = "0031"
down_revision = "0030"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0031")
