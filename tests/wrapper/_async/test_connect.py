"""Connecting: a conninfo that cannot connect fails the first call at once
with a ConnectError naming the host and the database, without a pool
retrying (and logging) in the background; the connect timeout is an option;
no source is ``$PYALK_DSN``, else libpq's environment, and a source passed
in wins over both."""

from __future__ import annotations

import logging
import time

import pytest
from psycopg.conninfo import conninfo_to_dict

from pyalk import AlkError, AsyncAlk, ConnectError, InvalidArgument

#: The libpq variable of each conninfo parameter the test server's DSN may hold.
LIBPQ_VARIABLES = {"host": "PGHOST", "port": "PGPORT", "dbname": "PGDATABASE", "user": "PGUSER",
                   "password": "PGPASSWORD"}
#: A database no test can reach: where a source that must not be used points.
UNREACHABLE = "host=/nonexistent/pyalk-socket-dir dbname=unreachable connect_timeout=2"

# "At once" on a loaded machine: well under the pool's 30 s and libpq's 2 s minimum timeout.
PROMPT = 1.5


@pytest.mark.parametrize("conninfo", [
    "host=/nonexistent/pyalk-socket-dir dbname=x",
    "DBNAME_OF_THE_TEST_SERVER",
])
async def test_a_bad_conninfo_fails_at_once_naming_host_and_database(dsn, caplog, conninfo):
    if conninfo == "DBNAME_OF_THE_TEST_SERVER":
        conninfo = dsn + " dbname=pyalk_no_such_database"
    caplog.set_level(logging.DEBUG)
    started = time.monotonic()
    async with AsyncAlk(conninfo) as alk:
        with pytest.raises(ConnectError) as caught:
            await alk.queue("x").enqueue({})
    assert time.monotonic() - started < PROMPT
    assert isinstance(caught.value, AlkError)
    message = str(caught.value)
    if "nonexistent" in conninfo:
        assert "host=/nonexistent/pyalk-socket-dir" in message and "dbname=x" in message
        assert "No such file or directory" in message
    else:
        assert "dbname=pyalk_no_such_database" in message
        assert 'database "pyalk_no_such_database" does not exist' in message
    # No pool was opened: nothing retries or warns in the background.
    assert [r for r in caplog.records if r.name.startswith("psycopg.pool")] == []


async def test_the_next_call_tries_again_and_a_good_conninfo_works(dsn):
    async with AsyncAlk(dsn) as alk:
        assert await alk.queue("x").enqueue({"n": 1}) > 0


async def test_the_connect_timeout_is_an_option(dsn):
    with pytest.raises(InvalidArgument, match="connect_timeout must be a whole number of seconds >= 1, got 0"):
        AsyncAlk(dsn, connect_timeout=0)
    async with AsyncAlk(dsn, connect_timeout=3) as alk:
        assert alk.executor.listen_conninfo().endswith("connect_timeout=3")
        assert await alk.queue("x").enqueue({}) > 0


@pytest.fixture
def no_ambient_database(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Neither PYALK_DSN nor any libpq variable from outside the test."""
    for variable in ("PYALK_DSN", "PGSERVICE", "PGHOSTADDR", *LIBPQ_VARIABLES.values()):
        monkeypatch.delenv(variable, raising=False)
    return monkeypatch


def libpq_environment(monkeypatch: pytest.MonkeyPatch, dsn: str) -> None:
    """The test database as libpq's PG* variables, not as a conninfo."""
    for key, value in conninfo_to_dict(dsn).items():
        if key in LIBPQ_VARIABLES:
            monkeypatch.setenv(LIBPQ_VARIABLES[key], str(value))


async def current_database(alk: AsyncAlk) -> str:
    return str(await alk.executor.value("SELECT current_database()"))


async def test_no_source_is_pyalk_dsn_before_libpq_environment(dsn, no_ambient_database):
    no_ambient_database.setenv("PYALK_DSN", dsn)
    no_ambient_database.setenv("PGDATABASE", "pyalk_no_such_database")  # PYALK_DSN names its own
    async with AsyncAlk() as alk:
        assert await current_database(alk) == conninfo_to_dict(dsn)["dbname"]
        assert await alk.queue("x").enqueue({}) > 0


async def test_no_source_and_no_pyalk_dsn_is_libpq_environment(dsn, no_ambient_database):
    libpq_environment(no_ambient_database, dsn)
    async with AsyncAlk() as alk:
        assert await current_database(alk) == conninfo_to_dict(dsn)["dbname"]
        assert await alk.queue("x").enqueue({}) > 0


async def test_no_source_and_nothing_set_names_where_libpq_went(no_ambient_database):
    no_ambient_database.setenv("PGHOST", "/nonexistent/pyalk-socket-dir")
    async with AsyncAlk() as alk:
        with pytest.raises(ConnectError, match="host=/nonexistent/pyalk-socket-dir"):
            await alk.queue("x").enqueue({})


@pytest.mark.parametrize("explicit", ["the test database", "an empty conninfo"])
async def test_a_source_passed_in_wins_over_pyalk_dsn(dsn, no_ambient_database, explicit):
    no_ambient_database.setenv("PYALK_DSN", UNREACHABLE)
    if explicit == "an empty conninfo":  # libpq's environment alone, PYALK_DSN ignored
        libpq_environment(no_ambient_database, dsn)
    async with AsyncAlk(dsn if explicit == "the test database" else "") as alk:
        assert await current_database(alk) == conninfo_to_dict(dsn)["dbname"]
