"""pyalk 0004: apply sql/versions/0004_outbox.sql."""

from pyalk.migrate import apply_version

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0004")
