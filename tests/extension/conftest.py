"""Fixtures of the extension tests: PostgreSQL 15 (Debian, started here with
bench.pg15) and the session's embedded PostgreSQL 18, each with the generated
extension files in its share/extension directory for the session, removed after
(the directory is left as found)."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from bench.pg15 import Pg15
from bench.pg15 import missing as pg15_missing
from pyalk.schema import extension


@dataclass
class ExtServer:
    """A server whose share dir holds the alk extension; makes databases dropped after the test."""

    name: str
    maintenance: str  # conninfo of the postgres database
    share: Path  # <sharedir>/extension
    bindir: Path
    made: list[str]

    def dsn(self, dbname: str, **options: str) -> str:
        return make_conninfo(self.maintenance, dbname=dbname, **options)

    def db(self, owner: str | None = None) -> str:
        """A new empty database (owned by ``owner`` when given)."""
        name = f"pyalk_ext_{secrets.token_hex(5)}"
        query = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if owner:
            query += sql.SQL(" OWNER {}").format(sql.Identifier(owner))
        with psycopg.connect(self.maintenance, autocommit=True) as conn:
            conn.execute(query)
        self.made.append(name)
        return self.dsn(name)

    def drop_made(self) -> None:
        with psycopg.connect(self.maintenance, autocommit=True) as conn:
            for name in self.made:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        self.made.clear()


def _setting(dsn: str, name: str) -> Path:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT setting FROM pg_catalog.pg_config WHERE name = %s", [name]).fetchone()
    assert row is not None
    return Path(row[0])


def share_missing(share: Path) -> str | None:
    """Why the generated files cannot go into ``share``, or None."""
    if not share.is_dir():
        return f"the server's extension directory {share} is not on this machine"
    if not os.access(share, os.W_OK):
        return f"cannot write the server's extension directory {share} (root can on Debian)"
    present = sorted(p.name for p in share.iterdir()
                     if p.name == f"{extension.NAME}.control" or p.name.startswith(f"{extension.NAME}--"))
    if present:
        return f"an alk extension is already installed in {share} ({', '.join(present)}): not overwriting it"
    return None


def _installed(server: ExtServer) -> Iterator[ExtServer]:
    """The generated files in the server's share dir while the session runs."""
    reason = share_missing(server.share)
    if reason:
        pytest.skip(reason)
    before = sorted(os.listdir(server.share))
    written = extension.write(server.share)
    try:
        yield server
    finally:
        server.drop_made()
        for path in written:
            path.unlink(missing_ok=True)
        assert sorted(os.listdir(server.share)) == before, f"{server.share} was not left as found"


@pytest.fixture(scope="session")
def pg15_ext() -> Iterator[ExtServer]:
    reason = pg15_missing(plproxy=False)
    if reason:
        pytest.skip(reason)
    pg = Pg15()
    pg.start()
    try:
        maintenance = pg.dsn("postgres")
        server = ExtServer("pg15", maintenance, _setting(maintenance, "SHAREDIR") / "extension",
                           _setting(maintenance, "BINDIR"), [])
        yield from _installed(server)
    finally:
        pg.stop()


@pytest.fixture(scope="session")
def pg18_ext(pg_server) -> Iterator[ExtServer]:
    if pg_server.version // 10000 != 18:
        pytest.skip(f"the session's server is PostgreSQL {pg_server.version // 10000}, not the embedded 18")
    server = ExtServer("pg18", pg_server.dsn, _setting(pg_server.dsn, "SHAREDIR") / "extension",
                       _setting(pg_server.dsn, "BINDIR"), [])
    yield from _installed(server)


@pytest.fixture(params=["pg15", "pg18"])
def ext(request: pytest.FixtureRequest) -> Iterator[ExtServer]:
    """Each server in turn; databases made by a test are dropped after it."""
    server: ExtServer = request.getfixturevalue(f"{request.param}_ext")
    try:
        yield server
    finally:
        server.drop_made()
