"""pyalk 0023: apply sql/versions/0023_counts_prune_trigger.sql."""

from pyalk.migrate import apply_version

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0023")
