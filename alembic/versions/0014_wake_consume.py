"""pyalk 0014: apply sql/versions/0014_wake_consume.sql."""

from pyalk.migrate import apply_version

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0014")
