"""pyalk 0038: apply sql/versions/0038_rotation_after_drain.sql."""

from pyalk.schema.migrate import apply_version

revision = "0038"
down_revision = "0037"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0038")
