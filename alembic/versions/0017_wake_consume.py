"""pyalk 0017: apply sql/versions/0017_wake_consume.sql."""

from pyalk.migrate import apply_version

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0017")
