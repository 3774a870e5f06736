"""The outbox wrapper: enqueue binds alk.outbox_enqueue, run_once claims one
message, acks a delivery that returns, retries one that raises, and never
settles a message whose claim it lost; run loops over run_once until its stop
token is cancelled, through a lost connection.

A relay loop under test runs in the foreground; a driver thread watches the
database (with deadlines) and acts, then cancels the loop's token. Nothing
synchronises by sleeping."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import AsyncIterator, Callable

import psycopg
import pytest

from pyalk import (
    AsyncAlk,
    AsyncJobHandle,
    AsyncOutbox,
    AsyncStopToken,
    CodecError,
    InvalidArgument,
    InvalidName,
    QueueOpts,
)
from tests.helpers import until

NOW = 1_700_000_000
APP = "pyalk-outbox-test"
DEADLINE = 30.0
# A cancelled loop returns at once, not at the end of its poll (the tests
# make it a minute): this bound is generous for a loaded machine.
PROMPT = 2.0


class Stop(BaseException):
    """Not an Exception: a delivery interrupted this way is not settled."""


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


@pytest.fixture
async def relay(dsn: str) -> AsyncIterator[AsyncAlk]:
    """A client on its own pool, on the wall clock, as a relay process has."""
    async with AsyncAlk(f"{dsn} application_name={APP}") as client:
        yield client


class Driver:
    """A thread that drives the test while the loop runs in the foreground;
    it always ends by cancelling the loop's token, so a failed wait cannot
    hang the test. ``join`` re-raises what the body raised."""

    def __init__(self, body: Callable[[], None], stop: AsyncStopToken) -> None:
        self.errors: list[BaseException] = []
        self.cancelled_at = 0.0

        def run() -> None:
            try:
                body()
            except BaseException as error:
                self.errors.append(error)
            finally:
                self.cancelled_at = time.monotonic()
                stop.cancel()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self) -> None:
        self.thread.join(DEADLINE)
        assert not self.thread.is_alive(), "the driver thread did not finish"
        if self.errors:
            raise self.errors[0]


def gone(db: psycopg.Connection, job_id: int) -> Callable[[], bool]:
    """Whether the message was delivered (acked rows are deleted)."""
    return lambda: db.execute("SELECT 1 FROM alk.jobs WHERE id = %s", [job_id]).fetchone() is None


async def pin(connection: psycopg.AsyncConnection, at: int) -> None:
    await connection.execute("SELECT set_config('alk.now', %s, false)", [str(at)])


def row(db: psycopg.Connection, job_id: int) -> dict[str, object] | None:
    cursor = db.execute(
        "SELECT queue, state, payload, run_at, attempts, max_attempts, worker_id, last_error,"
        " visibility_timeout_s, backoff_base_s, dead_letter_retention_s FROM alk.jobs WHERE id = %s",
        [job_id],
    )
    found = cursor.fetchone()
    assert cursor.description is not None
    return None if found is None else dict(zip([c.name for c in cursor.description], found, strict=True))


async def test_outbox_handle_is_named_and_cheap(alk):
    outbox = alk.outbox("billing")
    assert isinstance(outbox, AsyncOutbox)
    assert outbox.name == "billing"
    assert repr(outbox) == f"{type(outbox).__name__}('billing')"


async def test_enqueue_writes_the_backing_queue_with_outbox_stamps(alk, db):
    job_id = await alk.outbox("billing").enqueue({"invoice": 7}, priority=2, delay=10)
    found = row(db, job_id)
    assert found is not None
    assert (found["queue"], found["state"], found["payload"], found["run_at"]) == (
        "alk:outbox:billing", "pending", {"invoice": 7}, NOW + 10)
    assert (found["visibility_timeout_s"], found["max_attempts"], found["backoff_base_s"]) == (60, 5, 5)
    assert found["dead_letter_retention_s"] is None


async def test_opts_override_the_outbox_stamps(alk, db):
    outbox = alk.outbox("billing", QueueOpts(visibility_timeout_s=9, max_attempts=2, dead_letter_retention_s=60))
    found = row(db, await outbox.enqueue(1))
    assert found is not None
    assert (found["visibility_timeout_s"], found["max_attempts"], found["backoff_base_s"]) == (9, 2, 5)
    assert found["dead_letter_retention_s"] == 60
    found = row(db, await outbox.enqueue(1, max_attempts=7))
    assert found is not None and found["max_attempts"] == 7


async def test_enqueue_batch_returns_ids_in_input_order(alk):
    outbox = alk.outbox("billing")
    ids = await outbox.enqueue_batch([{"i": i} for i in range(20)])
    assert len(ids) == 20
    handles = await outbox.claim_batch("relay", 100)
    assert [h.id for h in handles] == ids
    assert await outbox.enqueue_batch([]) == []


async def test_run_once_acks_a_delivery_that_returns(alk, db):
    outbox = alk.outbox("billing")
    job_id = await outbox.enqueue({"invoice": 1})
    seen: list[AsyncJobHandle] = []

    async def deliver(message: AsyncJobHandle) -> None:
        seen.append(message)

    assert await outbox.run_once("relay-1", deliver) is True
    assert [(m.id, m.payload, m.job.worker_id, m.job.attempts) for m in seen] == [
        (job_id, {"invoice": 1}, "relay-1", 1)]
    assert row(db, job_id) is None
    assert await outbox.run_once("relay-1", deliver) is False
    assert len(seen) == 1


async def test_run_once_retries_a_delivery_that_raises_on_the_backoff_curve(alk, conn, db):
    outbox = alk.outbox("billing")
    job_id = await outbox.enqueue("x")

    async def refuse(message: AsyncJobHandle) -> None:
        raise ConnectionError("503 from upstream")

    assert await outbox.run_once("relay", refuse) is True
    found = row(db, job_id)
    assert found is not None
    assert (found["state"], found["run_at"], found["attempts"], found["worker_id"]) == ("pending", NOW + 5, 1, None)
    await pin(conn, NOW + 5)
    assert await outbox.run_once("relay", refuse) is True
    found = row(db, job_id)
    assert found is not None and found["run_at"] == NOW + 15


async def test_the_last_failure_is_recorded_when_the_message_dies(alk, db):
    outbox = alk.outbox("billing")
    first = await outbox.enqueue("a", max_attempts=1)
    second = await outbox.enqueue("b", max_attempts=1)

    async def refuse(message: AsyncJobHandle) -> None:
        if message.payload == "a":
            raise ValueError("bad address\x00!")
        raise ValueError

    assert await outbox.run_once("relay", refuse) is True
    assert await outbox.run_once("relay", refuse) is True
    found = row(db, first)
    assert found is not None and (found["state"], found["last_error"]) == ("dead", "bad address\\0!")
    found = row(db, second)
    assert found is not None and (found["state"], found["last_error"]) == ("dead", "ValueError")


async def test_an_interrupted_delivery_is_not_settled(alk, conn, db):
    outbox = alk.outbox("billing")
    job_id = await outbox.enqueue("x")

    async def interrupted(message: AsyncJobHandle) -> None:
        raise Stop

    with pytest.raises(Stop):
        await outbox.run_once("relay", interrupted)
    found = row(db, job_id)
    assert found is not None and (found["state"], found["worker_id"]) == ("processing", "relay")
    await pin(conn, NOW + 61)  # the lease lapses and the message is delivered again

    async def deliver(message: AsyncJobHandle) -> None:
        assert message.job.attempts == 2

    assert await outbox.run_once("relay", deliver) is True
    assert row(db, job_id) is None


async def test_a_delivery_that_outlives_its_lease_cannot_ack(alk, conn, db, caplog):
    outbox = alk.outbox("billing")
    job_id = await outbox.enqueue("slow")
    fresh: list[AsyncJobHandle] = []

    async def hang(message: AsyncJobHandle) -> None:
        # The delivery takes longer than the 60 s visibility timeout: the
        # message is claimed again, by the same worker id even.
        await pin(conn, NOW + 61)
        again = await outbox.claim_one("relay")
        assert again is not None and (again.id, again.job.attempts) == (message.id, 2)
        fresh.append(again)

    with caplog.at_level(logging.WARNING, logger="pyalk.outbox"):
        assert await outbox.run_once("relay", hang) is True
    assert "the ack of message" in caplog.text and "(attempt 1) was refused" in caplog.text
    found = row(db, job_id)
    assert found is not None and (found["state"], found["attempts"], found["worker_id"]) == ("processing", 2, "relay")
    assert await fresh[0].ack() is True
    assert row(db, job_id) is None


async def test_a_stale_handle_from_claim_one_is_fenced_off(alk, conn):
    outbox = alk.outbox("billing")
    await outbox.enqueue("x")
    stale = await outbox.claim_one("relay")
    assert stale is not None
    await pin(conn, NOW + 61)
    fresh = await outbox.claim_one("relay")
    assert fresh is not None and fresh.job.attempts == 2
    assert await stale.ack() is False
    assert await stale.retry("late") is False
    assert await fresh.ack() is True


async def test_get_job_and_sweep_expired(alk, conn):
    outbox = alk.outbox("billing", QueueOpts(max_attempts=1, dead_letter_retention_s=100))
    job_id = await outbox.enqueue("x")
    job = await outbox.get_job(job_id)
    assert job is not None and (job.queue, job.state, job.max_attempts) == ("alk:outbox:billing", "pending", 1)

    async def refuse(message: AsyncJobHandle) -> None:
        raise RuntimeError("no route")

    assert await outbox.run_once("relay", refuse) is True
    job = await outbox.get_job(job_id)
    assert job is not None and (job.state, job.last_error, job.died_at) == ("dead", "no route", NOW)
    assert await outbox.sweep_expired() == 0
    await pin(conn, NOW + 100)
    assert await outbox.sweep_expired() == 1
    assert await outbox.get_job(job_id) is None


async def test_claim_batch_extent(alk):
    outbox = alk.outbox("billing")
    await outbox.enqueue_batch([1, 2, 3])
    assert await outbox.claim_batch("relay", 0) == []
    assert await outbox.claim_batch("relay", -5) == []
    assert len(await outbox.claim_batch("relay", 2)) == 2


async def test_bad_names_and_values_are_refused(alk, db):
    async def deliver(message: AsyncJobHandle) -> None:
        raise AssertionError("unreachable")

    with pytest.raises(InvalidName, match="reserved prefix"):
        await alk.outbox("alk:mine").enqueue(1)
    with pytest.raises(InvalidName, match="outbox must be a non-empty name"):
        await alk.outbox("").run_once("relay", deliver)
    with pytest.raises(InvalidName, match="at most 1024 bytes"):
        await alk.outbox("x" * 1025).enqueue(1)
    with pytest.raises(InvalidName, match="worker_id"):
        await alk.outbox("billing").run_once("", deliver)
    with pytest.raises(CodecError, match="payload"):
        await alk.outbox("billing").enqueue(float("nan"))
    with pytest.raises(InvalidArgument, match="delay"):
        await alk.outbox("billing").enqueue(1, delay=2**63)
    assert db.execute("SELECT count(*) FROM alk.jobs").fetchone() == (0,)


# run: the relay loop ----------------------------------------------------------------------


async def test_run_delivers_every_due_message_and_returns_in_burst_mode(alk, db):
    outbox = alk.outbox("billing")
    ids = await outbox.enqueue_batch([{"invoice": i} for i in range(3)])
    seen: list[tuple[object, str | None]] = []

    async def deliver(message: AsyncJobHandle) -> None:
        seen.append((message.payload, message.job.worker_id))

    counts = await outbox.run(AsyncStopToken(), deliver, burst=True)
    assert (counts.delivered, counts.failed) == (3, 0)
    assert seen == [({"invoice": i}, "relay:billing") for i in range(3)]
    assert all(row(db, job_id) is None for job_id in ids)


async def test_run_retries_a_delivery_that_raises_and_logs_why(alk, db, caplog):
    outbox = alk.outbox("billing")
    down = await outbox.enqueue("down")
    last = await outbox.enqueue("down", max_attempts=1)
    delivered = await outbox.enqueue({"invoice": 3})

    async def deliver(message: AsyncJobHandle) -> None:
        if message.payload == "down":
            raise ConnectionError("ledger unreachable")

    with caplog.at_level(logging.WARNING, logger="pyalk.outbox"):
        counts = await outbox.run(AsyncStopToken(), deliver, worker_id="relay-7", burst=True)
    assert (counts.delivered, counts.failed) == (1, 2)
    found = row(db, down)
    assert found is not None and (found["state"], found["attempts"], found["run_at"]) == ("pending", 1, NOW + 5)
    found = row(db, last)
    assert found is not None and (found["state"], found["last_error"]) == ("dead", "ledger unreachable")
    assert row(db, delivered) is None
    assert (f"outbox 'billing': message {down} (attempt 1 of 5) not delivered, retried later: "
            "ConnectionError: ledger unreachable") in caplog.text
    assert f"message {last} (attempt 1 of 1) not delivered, dead: ConnectionError" in caplog.text


async def test_run_returns_at_once_when_its_token_is_cancelled(relay, db):
    outbox = relay.outbox("billing")
    first = await outbox.enqueue({"invoice": 1})
    stop = AsyncStopToken()
    seen: list[object] = []

    async def deliver(message: AsyncJobHandle) -> None:
        seen.append(message.payload)

    # The poll is a minute: only the cancel can end the idle loop in time.
    driver = Driver(lambda: until(gone(db, first), "the first message delivered"), stop)
    counts = await outbox.run(stop, deliver, poll_interval=60)
    returned_at = time.monotonic()
    driver.join()
    assert returned_at - driver.cancelled_at < PROMPT
    assert (counts.delivered, counts.failed) == (1, 0) and seen == [{"invoice": 1}]
    # A token cancelled before the start: nothing is claimed.
    second = await outbox.enqueue({"invoice": 2})
    counts = await outbox.run(stop, deliver)
    assert (counts.delivered, counts.failed) == (0, 0)
    found = row(db, second)
    assert found is not None and found["state"] == "pending"


async def test_run_survives_its_connection_being_terminated(relay, db, dsn, caplog):
    outbox = relay.outbox("billing")
    stop = AsyncStopToken()
    seen: list[object] = []

    async def deliver(message: AsyncJobHandle) -> None:
        seen.append(message.payload)

    def drive() -> None:
        # Hold the jobs table so the relay's next claim waits on the lock,
        # then kill the relay's backend in that wait: the claim fails with a
        # lost connection, as in a server restart.
        with psycopg.connect(dsn) as locker:
            locker.execute("LOCK TABLE alk.jobs IN ACCESS EXCLUSIVE MODE")
            waiting = "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'"
            until(lambda: db.execute(waiting, [APP]).fetchone() is not None, "the relay's claim to wait on the lock")
            killed = db.execute(f"SELECT count(pg_terminate_backend(pid)) FROM ({waiting}) w", [APP]).fetchone()
            assert killed == (1,)
            locker.rollback()
        job_id = db.execute("SELECT alk.outbox_enqueue('billing', '{\"invoice\": 1}'::jsonb)").fetchone()[0]  # type: ignore[index]
        until(gone(db, job_id), "a message delivered after the kill")

    with caplog.at_level(logging.WARNING, logger="pyalk.outbox"):
        driver = Driver(drive, stop)
        counts = await outbox.run(stop, deliver, poll_interval=0.05)
        driver.join()
    assert (counts.delivered, counts.failed) == (1, 0) and seen == [{"invoice": 1}]
    assert "outbox 'billing': database unavailable (AdminShutdown: terminating connection" in caplog.text


async def test_run_arguments(alk):
    async def deliver(message: AsyncJobHandle) -> None:
        raise AssertionError("unreachable")

    stop = AsyncStopToken()
    for bad in (0, -1.0, True, "1"):
        with pytest.raises(InvalidArgument, match="poll_interval"):
            await alk.outbox("billing").run(stop, deliver, poll_interval=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidName, match="worker_id"):
        await alk.outbox("billing").run(stop, deliver, worker_id="")
    with pytest.raises(InvalidName, match="reserved prefix"):
        await alk.outbox("alk:x").run(stop, deliver, burst=True)
