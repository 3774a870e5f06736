"""pyalk 0053: apply sql/versions/0053_pending_priorities_due_by.sql."""

from pyalk.schema.migrate import apply_version

revision = "0053"
down_revision = "0052"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0053")
