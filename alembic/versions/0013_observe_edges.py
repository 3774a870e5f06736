"""pyalk 0013: apply sql/versions/0013_observe_edges.sql."""

from pyalk.migrate import apply_version

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("0013")
