"""pyalk 0045: apply sql/versions/0045_slot_live_keyed.sql."""

from pyalk.schema.migrate import apply_version

revision = "0045"
down_revision = "0044"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0045")
