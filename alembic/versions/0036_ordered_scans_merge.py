"""pyalk 0036: apply sql/versions/0036_ordered_scans_merge.sql."""

from pyalk.schema.migrate import apply_version

revision = "0036"
down_revision = "0035"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0036")
