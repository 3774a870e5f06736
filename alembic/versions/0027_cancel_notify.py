"""pyalk 0027: apply sql/versions/0027_cancel_notify.sql."""

from pyalk.schema.migrate import apply_version

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0027")
