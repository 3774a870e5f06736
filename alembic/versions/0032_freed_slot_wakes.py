"""pyalk 0032: apply sql/versions/0032_freed_slot_wakes.sql."""

from pyalk.schema.migrate import apply_version

revision = "0032"
down_revision = "0031"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0032")
