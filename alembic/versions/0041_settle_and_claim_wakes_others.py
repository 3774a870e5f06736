"""pyalk 0041: apply sql/versions/0041_settle_and_claim_wakes_others.sql."""

from pyalk.schema.migrate import apply_version

revision = "0041"
down_revision = "0040"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0041")
