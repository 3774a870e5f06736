"""pyalk 0042: apply sql/versions/0042_rotation_moves_with_settled.sql."""

from pyalk.schema.migrate import apply_version

revision = "0042"
down_revision = "0041"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0042")
