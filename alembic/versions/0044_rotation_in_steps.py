"""pyalk 0044: apply sql/versions/0044_rotation_in_steps.sql."""

from pyalk.schema.migrate import apply_version

revision = "0044"
down_revision = "0043"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0044")
