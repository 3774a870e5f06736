"""pyalk 0003: apply sql/versions/0003_stream.sql."""

from pyalk.migrate import apply_version

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0003")
