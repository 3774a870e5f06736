"""pyalk 0047: apply sql/versions/0047_job_slots_replaced.sql."""

from pyalk.schema.migrate import apply_version

revision = "0047"
down_revision = "0046"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0047")
