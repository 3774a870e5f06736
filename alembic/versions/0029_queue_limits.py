"""pyalk 0029: apply sql/versions/0029_queue_limits.sql."""

from pyalk.schema.migrate import apply_version

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0029")
