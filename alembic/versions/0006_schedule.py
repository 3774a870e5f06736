"""pyalk 0006: apply sql/versions/0006_schedule.sql."""

from pyalk.migrate import apply_version

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0006")
