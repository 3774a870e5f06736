"""pyalk 0028: apply sql/versions/0028_queue_limits.sql."""

from pyalk.schema.migrate import apply_version

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0028")
