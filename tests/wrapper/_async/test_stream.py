"""The stream wrapper: binding and decoding, the transactional forms, and
subscribe (replay from the checkpoint, tail through LISTEN/NOTIFY, checkpoint
saves, and surviving the loss of its listening connection without losing an
event).

Waits are polling with deadlines on what the server reports, never sleeps.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from pyalk import AsyncAlk, AsyncStream, AsyncSubscription, CodecError, InvalidArgument, InvalidName, StreamEvent
from tests.helpers import until

DEADLINE = 30.0


class Boom(Exception):
    pass


@pytest.fixture
async def alk(dsn: str) -> AsyncIterator[AsyncAlk]:
    async with AsyncAlk(dsn) as client:
        yield client


@pytest.fixture
async def business(dsn: str) -> AsyncIterator[psycopg.AsyncConnection]:
    """The application's own connection, transactions under its control."""
    conn = await psycopg.AsyncConnection.connect(dsn)
    yield conn
    await conn.close()


def stored(db: psycopg.Connection, stream: str = "s") -> list[int]:
    rows = db.execute("SELECT event_offset FROM alk.stream_events WHERE stream = %s ORDER BY 1", [stream])
    return [row[0] for row in rows.fetchall()]


def checkpoint(db: psycopg.Connection, consumer: str, stream: str = "s") -> int:
    return db.execute("SELECT alk.get_offset(%s, %s)", [stream, consumer]).fetchone()[0]  # type: ignore[index]


def publish_from(dsn: str, stream: str, payloads: list[Any]) -> None:
    """Publish on a connection of its own, one commit per event."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for payload in payloads:
            conn.execute("SELECT alk.publish(%s, %s::jsonb)", [stream, psycopg.types.json.Jsonb(payload)])


def listener_read_after(db: psycopg.Connection, pid: int, since: Any) -> bool:
    """The listener ran a read that started after ``since`` and is now idle:
    it found nothing and is waiting for a notification."""
    row = db.execute(
        "SELECT state = 'idle' AND query LIKE '%%alk.read_since%%' AND query_start > %s"
        " FROM pg_stat_activity WHERE pid = %s",
        [since, pid],
    ).fetchone()
    return bool(row and row[0])


def server_now(db: psycopg.Connection) -> Any:
    return db.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def target() -> None:
        try:
            fn()
        except BaseException as error:  # surfaced by the caller
            errors.append(error)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, errors


# the surface ---------------------------------------------------------------


async def test_publish_read_round_trip(alk, db):
    stream = alk.stream("orders")
    assert isinstance(stream, AsyncStream)
    assert repr(stream) == f"{type(stream).__name__}('orders')"
    assert await stream.publish({"id": 1, "tags": ["a", None], "x": 2.5}) == 1
    assert await stream.publish("two", key="k2") == 2
    assert await stream.publish_with_key("k3", None) == 3
    events = await stream.read_since(0)
    assert [(e.stream, e.offset, e.key, e.payload) for e in events] == [
        ("orders", 1, None, {"id": 1, "tags": ["a", None], "x": 2.5}),
        ("orders", 2, "k2", "two"),
        ("orders", 3, "k3", None),
    ]
    assert all(isinstance(e, StreamEvent) and isinstance(e.created_at, int) for e in events)
    assert [e.offset for e in await stream.read_since(1, 1)] == [2]
    with pytest.raises(dataclasses.FrozenInstanceError):
        events[0].offset = 9  # type: ignore[misc]


async def test_publish_batch_offsets_and_keys(alk):
    stream = alk.stream("s")
    assert await stream.publish_batch([1, 2, 3], keys=["a", None, "c"]) == [1, 2, 3]
    assert await stream.publish_batch(x for x in ["4", "5"]) == [4, 5]
    assert await stream.publish_batch([]) == []
    assert [(e.offset, e.key) for e in await stream.read_since(0, 3)] == [(1, "a"), (2, None), (3, "c")]
    with pytest.raises(InvalidArgument, match="keys"):
        await stream.publish_batch([1, 2], keys=["only one"])


@pytest.mark.parametrize("n", [0, -1, -(2**63)])
async def test_read_extents_read_nothing(alk, n):
    stream = alk.stream("s")
    await stream.publish_batch([1, 2])
    assert await stream.read_since(0, n) == []
    assert await stream.read_from_consumer("c", n) == []


async def test_checkpoints_and_trim(alk):
    stream = alk.stream("s")
    await stream.publish_batch(list(range(5)))
    assert await stream.get_offset("c") == 0
    assert [e.offset for e in await stream.read_from_consumer("c")] == [1, 2, 3, 4, 5]
    assert await stream.save_offset("c", 3) is True
    assert await stream.save_offset("c", 2) is False
    assert await stream.save_offset("c", 3) is False
    assert await stream.get_offset("c") == 3
    assert [e.offset for e in await stream.read_from_consumer("c", 1)] == [4]
    assert await stream.save_offset("neg", -4) is True
    assert await stream.get_offset("neg") == -4
    assert await stream.trim_to(-1) == 0
    assert await stream.trim_to(2) == 2
    assert await stream.trim_to(2**63 - 1) == 3
    assert await stream.publish("after") == 6


async def test_refusals_store_nothing(alk, db):
    stream = alk.stream("s")
    with pytest.raises(CodecError):
        await stream.publish(math.nan)
    with pytest.raises(CodecError):
        await stream.publish_batch([1, {1, 2}])
    with pytest.raises(CodecError):
        await stream.publish("nul \x00 inside")
    with pytest.raises(InvalidArgument):
        await stream.read_since(2**63)
    with pytest.raises(InvalidArgument):
        await stream.save_offset("c", -(2**63) - 1)
    with pytest.raises(InvalidArgument):
        await stream.trim_to(1.5)  # type: ignore[arg-type]
    with pytest.raises(InvalidName):
        await alk.stream("").publish(1)
    with pytest.raises(InvalidName):
        await alk.stream("alk:mine").read_since(0)
    with pytest.raises(InvalidName):
        await stream.save_offset("", 1)
    assert stored(db) == []
    assert db.execute("SELECT count(*) FROM alk.stream_consumers").fetchone() == (0,)


async def test_channel_is_the_sql_one(alk, db):
    assert await alk.stream("s").channel() == db.execute("SELECT alk.stream_channel('s')").fetchone()[0]


# transactional forms -------------------------------------------------------


async def test_transactional_forms_join_the_callers_transaction(alk, business, db):
    stream = alk.stream("s")
    with pytest.raises(Boom):
        async with business.transaction():
            assert await stream.publish("one", conn=business) == 1
            assert await stream.publish_batch(["two"], conn=business) == [2]
            assert [e.offset for e in await stream.read_since(0, conn=business)] == [1, 2]
            assert await stream.save_offset("c", 2, conn=business) is True
            assert await stream.get_offset("c", conn=business) == 2
            assert [e.offset for e in await stream.read_from_consumer("c", conn=business)] == []
            assert stored(db) == []  # nobody else sees it yet
            raise Boom
    assert stored(db) == []
    assert checkpoint(db, "c") == 0
    async with business.transaction():
        assert await stream.publish("one", conn=business) == 1  # the rolled-back offsets are drawn again
        await stream.save_offset("c", 1, conn=business)
    assert stored(db) == [1]
    assert checkpoint(db, "c") == 1


# subscribe -----------------------------------------------------------------


async def test_subscribe_replays_from_the_checkpoint_then_tails(alk, db, dsn):
    stream = alk.stream("s")
    await stream.publish_batch(["a", "b", "c"])
    await stream.save_offset("billing", 1)
    # A poll interval far beyond the deadline: only a notification can wake it.
    async with stream.subscribe("billing", poll_interval=3600) as sub:
        assert isinstance(sub, AsyncSubscription)
        assert sub.last_offset is None
        replayed = [await sub.__anext__(), await sub.__anext__()]
        assert [(e.offset, e.payload) for e in replayed] == [(2, "b"), (3, "c")]
        assert sub.last_offset == 3
        pid = sub.listener_pid
        assert pid is not None
        since = server_now(db)

        def publish_when_waiting() -> None:
            until(lambda: listener_read_after(db, pid, since), "the subscription to wait")
            publish_from(dsn, "s", ["d"])
            publish_from(dsn, "other", ["not for us"])

        thread, errors = in_thread(publish_when_waiting)
        started = time.monotonic()
        tailed = await sub.__anext__()
        thread.join(DEADLINE)
        assert errors == []
        assert (tailed.offset, tailed.payload) == (4, "d")
        assert time.monotonic() - started < DEADLINE
    assert checkpoint(db, "billing") == 1  # no auto-save: the checkpoint is the caller's to move


async def test_subscription_save_offset_saves_the_last_yielded(alk, db):
    stream = alk.stream("s")
    await stream.publish_batch(list(range(5)))
    sub = stream.subscribe("c")
    try:
        assert await sub.save_offset() is False  # nothing yielded yet
        first = await sub.__anext__()
        second = await sub.__anext__()
        assert (first.offset, second.offset) == (1, 2)
        assert await sub.save_offset() is True
        assert checkpoint(db, "c") == 2
        assert await sub.save_offset() is False  # monotone: at the checkpoint
        # Another process moved the checkpoint further: ours does not move it back.
        await stream.save_offset("c", 4)
        assert (await sub.__anext__()).offset == 3
        assert await sub.save_offset() is False
        assert checkpoint(db, "c") == 4
    finally:
        await sub.aclose()
    with pytest.raises(StopAsyncIteration):
        await sub.__anext__()
    # A new subscription replays from the saved checkpoint.
    async with stream.subscribe("c") as again:
        assert (await again.__anext__()).offset == 5


async def test_subscription_save_offset_joins_the_callers_transaction(alk, business, db):
    stream = alk.stream("s")
    await stream.publish_batch([1, 2])
    async with stream.subscribe("c") as sub:
        await sub.__anext__()
        with pytest.raises(Boom):
            async with business.transaction():
                assert await sub.save_offset(conn=business) is True
                raise Boom
        assert checkpoint(db, "c") == 0
        async with business.transaction():
            assert await sub.save_offset(conn=business) is True
        assert checkpoint(db, "c") == 1


async def test_auto_save_every_n_events_and_when_caught_up(alk, db):
    stream = alk.stream("s")
    await stream.publish_batch(list(range(5)))
    sub = stream.subscribe("c", auto_save_every=2, batch=2)
    seen = []
    async for event in sub:
        seen.append(event.offset)
        # Asking for event k means events < k are processed.
        assert checkpoint(db, "c") == {1: 0, 2: 0, 3: 2, 4: 2, 5: 4}[event.offset]
        if event.offset == 5:
            sub.stop()  # ends once the buffer is drained and it has caught up
    assert seen == [1, 2, 3, 4, 5]
    assert checkpoint(db, "c") == 5  # saved when it caught up


async def test_auto_save_on_clean_exit_only(alk, db):
    stream = alk.stream("s")
    await stream.publish_batch(list(range(3)))
    async with stream.subscribe("clean", auto_save_interval=3600) as sub:
        await sub.__anext__()
        await sub.__anext__()
    assert checkpoint(db, "clean") == 2
    with pytest.raises(Boom):
        async with stream.subscribe("crash", auto_save_interval=3600) as sub:
            await sub.__anext__()
            raise Boom  # the handler of event 1 failed: it is not processed
    assert checkpoint(db, "crash") == 0
    async with stream.subscribe("manual") as sub:
        await sub.__anext__()
    assert checkpoint(db, "manual") == 0  # no auto-save: nothing is saved for you


async def test_subscribe_argument_checks(alk):
    stream = alk.stream("s")
    for bad in [
        {"batch": 0},
        {"poll_interval": 0},
        {"auto_save_every": 0},
        {"auto_save_interval": -1.0},
    ]:
        with pytest.raises(InvalidArgument):
            stream.subscribe("c", **bad)
    with pytest.raises(InvalidName):
        async with stream.subscribe(""):
            pass


async def test_subscribe_survives_the_listener_being_terminated(alk, db, dsn):
    """Terminate the listening backend while it waits, then repeatedly while
    events pour in: the subscription reconnects and yields every offset once,
    in order."""
    stream = alk.stream("s")
    total = 120
    async with stream.subscribe("c", poll_interval=3600, batch=7) as sub:
        first_pid = sub.listener_pid
        assert first_pid is not None
        since = server_now(db)

        def kill_while_waiting_then_publish() -> None:
            until(lambda: listener_read_after(db, first_pid, since), "the subscription to wait")
            db.execute("SELECT pg_terminate_backend(%s)", [first_pid])
            publish_from(dsn, "s", ["after the kill"])

        thread, errors = in_thread(kill_while_waiting_then_publish)
        event = await sub.__anext__()
        thread.join(DEADLINE)
        assert errors == []
        assert (event.offset, event.payload) == (1, "after the kill")
        assert sub.reconnects >= 1
        assert sub.listener_pid not in (None, first_pid)

        # Three more kills, each while events are being committed.
        killed: list[int] = [first_pid]
        chunks = [list(range(2, 41)), list(range(41, 81)), list(range(81, total + 1))]

        def publish_and_kill() -> None:
            for chunk in chunks:
                until(lambda: sub.listener_pid not in (None, *killed), "a new listener")
                pid = sub.listener_pid
                assert pid is not None
                publish_from(dsn, "s", chunk[: len(chunk) // 2])
                db.execute("SELECT pg_terminate_backend(%s)", [pid])
                killed.append(pid)
                publish_from(dsn, "s", chunk[len(chunk) // 2 :])

        thread, errors = in_thread(publish_and_kill)
        offsets = [event.offset]
        while offsets[-1] < total:
            offsets.append((await sub.__anext__()).offset)
        thread.join(DEADLINE)
        assert errors == []
        assert offsets == list(range(1, total + 1))
        assert len(killed) == 4
        assert sub.reconnects >= 4


async def test_subscribe_on_a_borrowed_connection_or_pool(dsn, db):
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    try:
        client = AsyncAlk(conn)
        await client.stream("s").publish("via conn")
        async with client.stream("s").subscribe("c") as sub:
            assert (await sub.__anext__()).payload == "via conn"
            assert sub.listener_pid != conn.info.backend_pid  # a dedicated connection
    finally:
        await conn.close()
    async with AsyncConnectionPool(dsn, kwargs={"autocommit": True, "prepare_threshold": None}, open=False) as pool:
        client = AsyncAlk(pool)
        async with client.stream("s").subscribe("c") as sub:
            assert (await sub.__anext__()).payload == "via conn"
