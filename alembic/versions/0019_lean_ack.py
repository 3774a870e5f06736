"""pyalk 0019: apply sql/versions/0019_lean_ack.sql."""

from pyalk.migrate import apply_version

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0019")
