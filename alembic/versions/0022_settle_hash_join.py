"""pyalk 0022: apply sql/versions/0022_settle_hash_join.sql."""

from pyalk.migrate import apply_version

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0022")
