"""pyalk 0009: apply sql/versions/0009_security.sql."""

from pyalk.migrate import apply_version

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0009")
