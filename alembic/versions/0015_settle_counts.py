"""pyalk 0015: apply sql/versions/0015_settle_counts.sql."""

from pyalk.migrate import apply_version

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0015")
