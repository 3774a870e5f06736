"""pyalk 0050: apply sql/versions/0050_rotation_even_split_when_held.sql."""

from pyalk.schema.migrate import apply_version

revision = "0050"
down_revision = "0049"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0050")
