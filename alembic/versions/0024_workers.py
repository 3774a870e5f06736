"""pyalk 0024: apply sql/versions/0024_workers.sql."""

from pyalk.schema.migrate import apply_version

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0024")
