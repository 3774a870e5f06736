"""pyalk 0008: apply sql/versions/0008_schema.sql."""

from pyalk.migrate import apply_version

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0008")
