"""pyalk 0011: apply sql/versions/0011_observe.sql."""

from pyalk.migrate import apply_version

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0011")
