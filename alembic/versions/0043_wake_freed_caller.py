"""pyalk 0043: apply sql/versions/0043_wake_freed_caller.sql."""

from pyalk.schema.migrate import apply_version

revision = "0043"
down_revision = "0042"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0043")
