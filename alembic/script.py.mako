"""${message}"""

from pyalk.migrate import apply_version

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version(${repr(up_revision)})
