"""pyalk 0051: apply sql/versions/0051_claim_walks_once.sql."""

from pyalk.schema.migrate import apply_version

revision = "0051"
down_revision = "0050"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0051")
