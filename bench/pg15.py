"""A throwaway Debian PostgreSQL 15 server for the router row and the router
tests (tests/router): PL/Proxy is packaged for it (postgresql-15-plproxy),
not for the embedded PostgreSQL 18.

PostgreSQL refuses to run as root, so under root the server runs as the
``postgres`` system user (created by the Debian package)."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

BIN = Path("/usr/lib/postgresql/15/bin")
PLPROXY = Path("/usr/lib/postgresql/15/lib/plproxy.so")
PORT = 5415


def missing(*, plproxy: bool = True) -> str | None:
    """Why a PostgreSQL 15 server (with PL/Proxy, unless ``plproxy`` is
    false) cannot run here, or None."""
    if not (BIN / "postgres").exists():
        return f"PostgreSQL 15 is not installed ({BIN}): apt-get install postgresql-15"
    if plproxy and not PLPROXY.exists():
        return f"PL/Proxy for PostgreSQL 15 is not installed ({PLPROXY}): apt-get install postgresql-15-plproxy"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no postgres system user to run PostgreSQL 15 as"
    return None


class Pg15:
    """initdb + pg_ctl start in a temp dir; unix socket only."""

    def __init__(self, settings: str = "") -> None:
        self.settings = settings
        self.root = Path(tempfile.mkdtemp(prefix="pyalk-pg15-"))
        self.data = self.root / "data"
        self._as: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
            self._as = ["runuser", "-u", "postgres", "--"]

    def _run(self, *argv: str) -> None:
        subprocess.run([*self._as, *argv], check=True, capture_output=True, cwd=self.root)

    def start(self) -> None:
        self._run(str(BIN / "initdb"), "-D", str(self.data), "--auth=trust", "-U", "postgres", "-E", "UTF8")
        options = f"-k {self.root} -p {PORT} -c listen_addresses='' -c max_connections=200 -c fsync=off {self.settings}"
        self._run(str(BIN / "pg_ctl"), "-D", str(self.data), "-o", options,
                  "-l", str(self.root / "log"), "-w", "start")

    def stop(self) -> None:
        self._run(str(BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def dsn(self, dbname: str) -> str:
        return f"host={self.root} port={PORT} user=postgres dbname={dbname}"
