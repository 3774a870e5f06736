"""pyalk 0034: apply sql/versions/0034_turns_without_hot_path_triggers.sql."""

from pyalk.schema.migrate import apply_version

revision = "0034"
down_revision = "0033"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0034")
