"""pyalk 0037: apply sql/versions/0037_settle_unparks_once.sql."""

from pyalk.schema.migrate import apply_version

revision = "0037"
down_revision = "0036"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0037")
