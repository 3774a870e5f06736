"""pyalk 0010: apply sql/versions/0010_schedule.sql."""

from pyalk.migrate import apply_version

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0010")
