"""Alembic environment for pyalk's own migration chain.

Runs every pending revision in one transaction after taking pyalk's
migration advisory lock, so concurrent ``pyalk migrate`` runs queue up and the
later ones find nothing to do.
"""

from __future__ import annotations

from alembic import context

from pyalk.schema.extension import refuse_extension_behind
from pyalk.schema.install import BOOTSTRAP, VERSION_TABLE
from pyalk.schema.migrate import run_script


def run_migrations_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is None:
        raise RuntimeError("pyalk's Alembic environment needs a connection: use pyalk.schema.migrate.upgrade")
    context.configure(
        connection=connection,
        version_table=VERSION_TABLE,
        version_table_schema="alk",
        transaction_per_migration=False,
    )
    with context.begin_transaction():
        # Lock, schema and version table before Alembic reads the version.
        run_script(connection, BOOTSTRAP)
        refuse_extension_behind(connection.connection.driver_connection)  # ALTER EXTENSION upgrades those
        context.run_migrations()


if context.is_offline_mode():
    raise RuntimeError("pyalk migrations run online; for a SQL script use `pyalk sql`")
run_migrations_online()
