"""pyalk 0012: apply sql/versions/0012_security.sql."""

from pyalk.migrate import apply_version

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0012")
