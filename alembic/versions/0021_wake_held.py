"""pyalk 0021: apply sql/versions/0021_wake_held.sql."""

from pyalk.migrate import apply_version

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0021")
