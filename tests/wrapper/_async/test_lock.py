"""The lock wrapper: try_lock returns a lock or None, the lock renews,
releases, and releases on context exit; the SQL's refusals map to pyalk's
errors."""

from __future__ import annotations

from collections.abc import AsyncIterator

import psycopg
import pytest

from pyalk import AsyncAlk, AsyncLock, InvalidArgument, InvalidName

NOW = 1_700_000_000


class Boom(Exception):
    pass


@pytest.fixture
async def conn(dsn: str) -> AsyncIterator[psycopg.AsyncConnection]:
    """One autocommit connection whose clock the test drives."""
    connection = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    await pin(connection, NOW)
    yield connection
    await connection.close()


@pytest.fixture
def alk(conn: psycopg.AsyncConnection) -> AsyncAlk:
    return AsyncAlk(conn)


async def pin(connection: psycopg.AsyncConnection, at: int) -> None:
    await connection.execute("SELECT set_config('alk.now', %s, false)", [str(at)])


def holder(db: psycopg.Connection, name: str) -> tuple[str, int] | None:
    return db.execute("SELECT owner, expires_at FROM alk.locks WHERE name = %s", [name]).fetchone()


async def test_try_lock_returns_the_lock_or_none(alk, db):
    lock = await alk.try_lock("report", "a", 60)
    assert isinstance(lock, AsyncLock)
    assert (lock.name, lock.owner) == ("report", "a")
    assert holder(db, "report") == ("a", NOW + 60)
    assert await alk.try_lock("report", "b", 60) is None
    assert holder(db, "report") == ("a", NOW + 60)


async def test_the_context_manager_releases_on_exit_even_on_error(alk, db):
    lock = await alk.try_lock("report", "a", 60)
    assert lock is not None
    with pytest.raises(Boom):
        async with lock as held:
            assert held is lock
            raise Boom
    assert holder(db, "report") is None
    assert await alk.try_lock("report", "b", 60) is not None


async def test_release_is_true_once_and_exit_does_not_release_twice(alk, db):
    lock = await alk.try_lock("report", "a", 60)
    assert lock is not None
    async with lock:
        assert await lock.release() is True
        other = await alk.try_lock("report", "b", 60)
        assert other is not None
    # Leaving the block did not touch b's lock.
    assert holder(db, "report") == ("b", NOW + 60)
    assert await lock.release() is False


async def test_renew_gives_a_new_window_and_expires_at_reports_it(alk, conn):
    lock = await alk.try_lock("report", "a", 60)
    assert lock is not None
    assert await lock.expires_at() == NOW + 60
    await pin(conn, NOW + 50)
    assert await lock.renew(30) is True
    assert await lock.expires_at() == NOW + 80


async def test_a_lost_lock_cannot_renew_or_release(alk, conn, db):
    lock = await alk.try_lock("report", "a", 60)
    assert lock is not None
    await pin(conn, NOW + 60)
    thief = await alk.try_lock("report", "b", 60)
    assert thief is not None
    assert await lock.expires_at() is None
    assert await lock.renew(60) is False
    async with lock:
        pass  # exiting releases nothing that is not a's
    assert holder(db, "report") == ("b", NOW + 120)
    assert await thief.release() is True
    assert await thief.expires_at() is None


async def test_the_holder_retrying_gets_the_lock_again_with_a_new_window(alk, conn):
    first = await alk.try_lock("report", "a", 60)
    await pin(conn, NOW + 30)
    second = await alk.try_lock("report", "a", 60)
    assert first is not None and second is not None
    assert await second.expires_at() == NOW + 90


@pytest.mark.parametrize("ttl", [0, -1, -(2**63)])
async def test_a_non_positive_ttl_is_refused(alk, db, ttl):
    with pytest.raises(InvalidArgument, match=f"ttl must be a positive number of seconds, got {ttl}") as caught:
        await alk.try_lock("report", "a", ttl)
    assert caught.value.sqlstate == "LK002"
    lock = await alk.try_lock("report", "a", 60)
    assert lock is not None
    with pytest.raises(InvalidArgument, match="ttl"):
        await lock.renew(ttl)
    assert holder(db, "report") == ("a", NOW + 60)


async def test_integers_outside_bigint_are_refused_before_sending(alk, db):
    with pytest.raises(InvalidArgument, match="ttl must fit in a signed 64-bit integer"):
        await alk.try_lock("report", "a", 2**63)
    assert holder(db, "report") is None


async def test_bad_names_are_refused(alk, db):
    with pytest.raises(InvalidName, match="reserved prefix"):
        await alk.try_lock("alk:scheduler", "a", 60)
    with pytest.raises(InvalidName, match="name must be a non-empty name"):
        await alk.try_lock("", "a", 60)
    with pytest.raises(InvalidName, match="owner"):
        await alk.try_lock("report", "", 60)
    assert db.execute("SELECT count(*) FROM alk.locks").fetchone() == (0,)


async def test_pyalk_itself_takes_reserved_locks(alk, conn, db):
    leader = AsyncLock(alk.executor, "alk:scheduler", "host-a", reserved=True)
    assert await leader.try_acquire(30) is True
    assert await AsyncLock(alk.executor, "alk:scheduler", "host-b", reserved=True).try_acquire(30) is False
    assert await leader.expires_at() == NOW + 30
    await pin(conn, NOW + 20)
    assert await leader.renew(30) is True
    assert holder(db, "alk:scheduler") == ("host-a", NOW + 50)
    async with leader:
        pass
    assert holder(db, "alk:scheduler") is None


async def test_the_lock_handle_binds_every_lock_function(alk, db):
    lock = alk.lock("report", "a")
    assert isinstance(lock, AsyncLock)
    assert await lock.get() is None  # creating the handle takes nothing
    assert await lock.try_acquire(60) is True
    info = await lock.get()
    assert info is not None
    assert (info.name, info.owner, info.acquired_at, info.expires_at) == ("report", "a", NOW, NOW + 60)
    assert await alk.lock("report", "b").try_acquire(60) is False
    assert await alk.lock("report", "b").expires_at() is None
    assert await lock.renew(30) is True
    assert holder(db, "report") == ("a", NOW + 30)
    assert await lock.release() is True
    assert await lock.get() is None


async def test_a_lock_handle_without_owner_is_its_own_contender(alk, db):
    first, second = alk.lock("report"), alk.lock("report")
    assert first.owner != second.owner
    assert await first.try_acquire(60) is True
    assert await second.try_acquire(60) is False
