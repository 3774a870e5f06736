"""pyalk 0039: apply sql/versions/0039_ordered_scans_merge_before_18.sql."""

from pyalk.schema.migrate import apply_version

revision = "0039"
down_revision = "0038"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0039")
