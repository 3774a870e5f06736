"""pyalk 0016: apply sql/versions/0016_claim_split_burial.sql."""

from pyalk.migrate import apply_version

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0016")
