"""pyalk 0001: apply sql/versions/0001_core.sql."""

from pyalk.migrate import apply_version

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0001")
