"""pyalk 0005: apply sql/versions/0005_lock.sql."""

from pyalk.migrate import apply_version

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0005")
