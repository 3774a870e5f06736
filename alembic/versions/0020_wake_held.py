"""pyalk 0020: apply sql/versions/0020_wake_held.sql."""

from pyalk.migrate import apply_version

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0020")
