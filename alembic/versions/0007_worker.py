"""pyalk 0007: apply sql/versions/0007_worker.sql."""

from pyalk.migrate import apply_version

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0007")
