"""pyalk 0049: apply sql/versions/0049_rotation_drains_first.sql."""

from pyalk.schema.migrate import apply_version

revision = "0049"
down_revision = "0048"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0049")
