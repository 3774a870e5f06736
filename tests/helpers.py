"""Helpers shared by the test suites: polling with a deadline, one-value
queries, SQLSTATE assertions and threads on their own connections."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

#: Seconds `until` waits by default: long enough for a loaded 2-core machine;
#: it only bounds how long a broken test takes to fail.
DEADLINE = 60.0
#: Seconds between two looks at the predicate: a polling interval, not a synchronisation.
INTERVAL = 0.005


def until(predicate: Callable[[], bool], what: str, deadline: float = DEADLINE) -> None:
    """Return once ``predicate()`` is true; fail naming ``what`` after ``deadline`` seconds."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(INTERVAL)
    raise AssertionError(f"timed out waiting for {what}")


def until_a_second_old(db: psycopg.Connection, other: psycopg.Connection, what: str) -> None:
    """Return once ``other``'s transaction is over a second old by the
    server's clock (what the rotation calls an old transaction), polling."""
    until(lambda: one(db, "SELECT clock_timestamp() - xact_start > interval '1 second' FROM pg_stat_activity"
                          " WHERE pid = %s", other.info.backend_pid) is True, what)


async def until_async(predicate: Callable[[], bool], what: str, deadline: float = DEADLINE) -> None:
    """`until` for a coroutine: the event loop keeps running while it polls."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if predicate():
            return
        await asyncio.sleep(INTERVAL)
    raise AssertionError(f"timed out waiting for {what}")


def one(db: psycopg.Connection, query: str, *params: Any, **named: Any) -> Any:
    """The single value of a one-row query (positional ``%s`` or named ``%(name)s`` parameters)."""
    assert not (params and named), "positional or named parameters, not both"
    row = db.execute(query, named or params).fetchone()
    assert row is not None, query
    return row[0]


def calls_of(db: psycopg.Connection, function: str) -> int:
    """How many times ``function`` (a regprocedure, e.g. 'alk._slot_live(bigint,
    bigint, boolean)') ran in this database, by track_functions (which the
    session sets): this backend's counts flushed first, read afresh. The
    table statistics are flushed with them."""
    db.execute("SELECT pg_stat_force_next_flush()")
    db.execute("SELECT pg_stat_clear_snapshot()")
    return int(one(db, "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions WHERE funcid = %s::regprocedure",
                   function))


def sqlstate_of(db: psycopg.Connection, query: str, *params: Any) -> tuple[str | None, str]:
    """The SQLSTATE and primary message of the error ``query`` must raise."""
    with pytest.raises(psycopg.Error) as caught:
        db.execute(query, params)
    return caught.value.sqlstate, caught.value.diag.message_primary or ""


@contextmanager
def raises_lk(code: str, *fragments: str) -> Iterator[None]:
    """The block raises SQLSTATE ``code`` with every fragment in its message."""
    with pytest.raises(psycopg.Error) as caught:
        yield
    assert caught.value.sqlstate == code, caught.value
    message = caught.value.diag.message_primary or ""
    for fragment in fragments:
        assert fragment in message, message


def guarded(dsn: str, errors: list[BaseException], body: Callable[[psycopg.Connection], None]) -> threading.Thread:
    """A thread (not started) that runs ``body`` on its own autocommit
    connection and keeps what it raises in ``errors``, for the test thread to
    report."""
    def run() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                body(conn)
        except BaseException as error:  # reported by the test thread
            errors.append(error)
    return threading.Thread(target=run)
