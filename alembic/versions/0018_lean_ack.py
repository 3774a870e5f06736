"""pyalk 0018: apply sql/versions/0018_lean_ack.sql."""

from pyalk.migrate import apply_version

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0018")
