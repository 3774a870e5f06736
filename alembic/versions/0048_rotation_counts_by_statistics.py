"""pyalk 0048: apply sql/versions/0048_rotation_counts_by_statistics.sql."""

from pyalk.schema.migrate import apply_version

revision = "0048"
down_revision = "0047"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0048")
