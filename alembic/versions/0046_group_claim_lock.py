"""pyalk 0046: apply sql/versions/0046_group_claim_lock.sql."""

from pyalk.schema.migrate import apply_version

revision = "0046"
down_revision = "0045"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0046")
