"""pyalk 0033: apply sql/versions/0033_freed_slot_wakes.sql."""

from pyalk.schema.migrate import apply_version

revision = "0033"
down_revision = "0032"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0033")
