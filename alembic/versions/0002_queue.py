"""pyalk 0002: apply sql/versions/0002_queue.sql."""

from pyalk.migrate import apply_version

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0002")
