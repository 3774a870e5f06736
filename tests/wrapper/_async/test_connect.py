"""Connecting: a conninfo that cannot connect fails the first call at once
with a ConnectError naming the host and the database, without a pool
retrying (and logging) in the background; the connect timeout is an option."""

from __future__ import annotations

import logging
import time

import pytest

from pyalk import AlkError, AsyncAlk, ConnectError, InvalidArgument

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
