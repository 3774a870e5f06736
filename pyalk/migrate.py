"""``pyalk.migrate``: the public name of the migration chain's entry points.

The code is in :mod:`pyalk.schema.migrate`; this path stays because every
landed Alembic revision (alembic/versions/*.py, immutable once landed) imports
``apply_version`` from it, and docs/migrations.md documents
``pyalk.migrate.upgrade`` for users.
"""

from pyalk.schema.migrate import alembic_config, apply_version, upgrade, upgrade_connection

__all__ = ["alembic_config", "apply_version", "upgrade", "upgrade_connection"]
