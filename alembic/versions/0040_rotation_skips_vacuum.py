"""pyalk 0040: apply sql/versions/0040_rotation_skips_vacuum.sql."""

from pyalk.schema.migrate import apply_version

revision = "0040"
down_revision = "0039"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0040")
