"""pyalk 0052: apply sql/versions/0052_pending_priorities_once.sql."""

from pyalk.schema.migrate import apply_version

revision = "0052"
down_revision = "0051"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0052")
