"""Apply pyalk's migration chain through Alembic, with pyalk's own version
table (``alk.alembic_version``) so it never meets the user's Alembic history.

From Python: ``pyalk.schema.migrate.upgrade("dbname=app")``. From a user's own
Alembic environment: see docs/migrations.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import alembic
import psycopg
from alembic import command, op
from alembic.config import Config
from sqlalchemy import create_engine, pool

from pyalk.schema.install import VERSION_TABLE, versions
from pyalk.schema.resources import alembic_dir


def alembic_config(connection: Any = None) -> Config:
    """An Alembic Config for pyalk's chain; ``connection`` is a SQLAlchemy
    Connection to run on (env.py uses it instead of opening its own)."""
    config = Config()
    config.set_main_option("script_location", str(alembic_dir()))
    config.set_main_option("version_table", VERSION_TABLE)
    config.set_main_option("version_table_schema", "alk")
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def upgrade_connection(connection: Any, revision: str = "head") -> None:
    """Run pyalk's chain on a SQLAlchemy Connection, also from inside another
    Alembic run (one of your revisions, or your env.py): docs/migrations.md.

    Alembic's ``context`` and ``op`` are module-level proxies that a nested
    run replaces and then empties; the outer run's are put back afterwards,
    so your revision's ``op.execute`` and your env.py's ``context.configure``
    keep working."""
    with _outer_alembic_kept():
        command.upgrade(alembic_config(connection), revision)


@contextmanager
def _outer_alembic_kept() -> Iterator[None]:
    outer = [getattr(module, "_proxy", None) for module in (alembic.context, alembic.op)]
    try:
        yield
    finally:
        for proxy in outer:
            if proxy is not None:
                proxy._install_proxy()


def upgrade(conninfo: str, revision: str = "head") -> None:
    """Migrate the database at ``conninfo`` (libpq conninfo or URI)."""
    engine = create_engine(
        "postgresql+psycopg://",
        creator=lambda: psycopg.connect(conninfo),
        poolclass=pool.NullPool,
    )
    try:
        with engine.connect() as connection:
            upgrade_connection(connection, revision)
            connection.commit()
    finally:
        engine.dispose()


def current(conninfo: str) -> str | None:
    """The installed version, or None where pyalk is not installed."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        exists = conn.execute("SELECT to_regclass('alk.alembic_version') IS NOT NULL").fetchone()
        if not exists or not exists[0]:
            return None
        row = conn.execute("SELECT max(version_num) FROM alk.alembic_version").fetchone()
        return row[0] if row else None


def apply_version(number: str) -> None:
    """Run one versioned SQL file inside the running Alembic migration."""
    (version,) = [v for v in versions() if v.number == number]
    # The raw psycopg connection: no parameters means the simple query
    # protocol, which runs a multi-statement script as the server reads it.
    run_script(op.get_bind(), version.sql())


def run_script(connection: Any, script: str) -> None:
    """Run a multi-statement SQL script on a SQLAlchemy connection."""
    connection.connection.driver_connection.execute(script)
