"""pyalk 0035: apply sql/versions/0035_live_slots_pruned.sql."""

from pyalk.schema.migrate import apply_version

revision = "0035"
down_revision = "0034"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0035")
