"""pyalk 0026: apply sql/versions/0026_job_results.sql."""

from pyalk.schema.migrate import apply_version

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0026")
