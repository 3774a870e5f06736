"""The worker wrapper: the observability bindings, and a worker's outcomes
(ack, retry on the row's curve, fail on ``fail_on``), wake-ups (NOTIFY,
next_claim_at), stop with a grace period and abandonment after it.

Synchronisation is on what the server reports (pg_stat_activity, job rows)
or on the handler itself, with deadlines; never sleeps.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from queue import SimpleQueue
from typing import Any

import psycopg
import pytest

from pyalk import (
    AsyncAlk,
    AsyncJobHandle,
    AsyncWorker,
    InvalidArgument,
    InvalidName,
    PermanentError,
    QueueOpts,
    Snooze,
)
from pyalk.runtime import AsyncEvent, AsyncRuntime
from pyalk.worker.state import WorkerState
from tests.helpers import one, until
from tests.wrapper._async.running import in_thread, run_beside

DEADLINE = 30.0
APP = "pyalk-worker-test"


@pytest.fixture
async def alk(dsn: str) -> AsyncIterator[AsyncAlk]:
    # Named, so the test can watch the worker's sessions in pg_stat_activity.
    async with AsyncAlk(f"{dsn} application_name={APP}") as client:
        yield client


def advertised(db: psycopg.Connection, worker_id: str) -> bool:
    """The worker has an idle advert in place (alk.wait_for_jobs)."""
    return bool(one(db, "SELECT count(*) = 1 FROM alk.idle_workers WHERE worker_id = %s", worker_id))


def worker_is_waiting(db: psycopg.Connection, since: Any) -> bool:
    """The worker's LISTEN session is up and its last claim-loop query (a
    next_claim_at computed after ``since``) is done: it is waiting."""
    row = db.execute(
        "SELECT bool_or(query LIKE 'LISTEN%%' AND state = 'idle'),"
        "       bool_or(query LIKE '%%alk.next_claim_at%%' AND state = 'idle' AND query_start > %s)"
        "  FROM pg_stat_activity WHERE application_name = %s",
        [since, APP],
    ).fetchone()
    return bool(row and row[0] and row[1])


def server_now(db: psycopg.Connection) -> Any:
    return db.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]


def job_rows(db: psycopg.Connection, queue: str = "q") -> list[tuple[Any, ...]]:
    return db.execute(
        "SELECT id, state, attempts, last_error FROM alk.list_jobs(%s) ORDER BY id", [queue]).fetchall()


# bindings ------------------------------------------------------------------------


async def test_stats_and_inspection_bindings(alk, db):
    queue = alk.queue("q")
    ids = await queue.enqueue_batch([1, 2, 3])
    await queue.enqueue(4, delay=3600)
    handle = await queue.claim_one("w")
    assert handle is not None and await handle.fail("bad") is True

    [stats] = await alk.stats("q")
    assert (stats.queue, stats.pending, stats.ready, stats.scheduled, stats.processing, stats.dead) == (
        "q", 3, 2, 1, 0, 1)
    assert [s.queue for s in await alk.stats()] == ["q"]
    assert await alk.stats("empty") != []
    assert (stats.paused, stats.estimated) == (False, False)
    capped = await queue.stats(exact_limit=1)
    assert capped.estimated and capped.ready >= 2 and (capped.scheduled, capped.dead) == (1, 1)
    with pytest.raises(InvalidArgument, match="exact_limit"):
        await alk.stats(exact_limit=True)

    dead = await alk.queue("q").list_jobs("dead")
    assert [job.id for job in dead] == [ids[0]] and dead[0].last_error == "bad"
    assert [job.id for job in await alk.queue("q").list_jobs(limit=2, after_id=ids[0])] == ids[1:3]
    assert await alk.queue("q").requeue_dead([ids[0]]) == 1
    assert await alk.queue("q").requeue_dead() == 0
    assert await alk.queue("q").next_claim_at() is not None
    assert await alk.queue("nothing").next_claim_at() is None
    assert (await alk.queue("q").channel()).startswith("alk_q_")

    with pytest.raises(InvalidArgument):
        await alk.queue("q").list_jobs("running")
    with pytest.raises(InvalidName):
        await alk.queue("alk:outbox:x").requeue_dead()
    with pytest.raises(InvalidArgument):
        await alk.queue("q").requeue_dead([2**63])


async def test_worker_arguments_are_checked(alk):
    async def handler(job: AsyncJobHandle) -> None:
        pass

    for bad in ({"concurrency": 0}, {"concurrency": True}, {"batch_size": 0}, {"poll_interval": 0},
                {"grace_period": -1}, {"prefetch": -1}, {"prefetch": True}, {"buffer_lifetime": -1},
                {"settle_interval": -0.1}, {"busy_poll": -0.001}):
        with pytest.raises(ValueError):
            alk.worker("q", handler, **bad)
    worker = alk.worker("q", handler, concurrency=3)
    assert isinstance(worker, AsyncWorker)
    # The fast settings are the defaults: 1000 claimed ahead, claims of up to 1000.
    assert (worker.concurrency, worker.prefetch, worker.batch_size, worker.running, worker.in_flight) == (
        3, 1000, 1000, False, 0)
    assert "q" in repr(worker)


async def test_a_worker_stopped_before_it_runs_returns_at_once_and_runs_once(alk, db):
    async def handler(job: AsyncJobHandle) -> None:
        raise AssertionError("no job should run")

    await alk.queue("q").enqueue(1)
    worker = alk.worker("q", handler, handle_signals=False)
    worker.stop()
    counts = await worker.run()
    assert counts.claimed == 0
    assert job_rows(db)[0][1:3] == ("pending", 0)
    with pytest.raises(RuntimeError, match="a worker runs once"):
        await worker.run()


def states_seen(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The states a worker entered, in order, from its transition log records."""
    return [record.state for record in caplog.records if hasattr(record, "state")]


async def test_a_worker_passes_through_its_lifecycle_once(alk, caplog):
    async def handler(job: AsyncJobHandle) -> None:
        pass

    await alk.queue("q").enqueue(1)
    worker = alk.worker("q", handler, burst=True, handle_signals=False)
    assert worker.state is WorkerState.NEW
    with caplog.at_level(logging.DEBUG, logger="pyalk.worker"):
        counts = await worker.run()
    assert counts.acked == 1
    assert states_seen(caplog) == ["starting", "running", "draining", "flushing", "stopped"]
    assert worker.state is WorkerState.STOPPED and worker.running is False
    with pytest.raises(RuntimeError, match="is finished: a worker runs once"):
        await worker.run()
    assert worker.state is WorkerState.STOPPED


async def test_a_stop_before_run_skips_running(alk, caplog):
    async def handler(job: AsyncJobHandle) -> None:
        raise AssertionError("no job should run")

    worker = alk.worker("q", handler, handle_signals=False)
    worker.stop()
    assert worker.state is WorkerState.NEW  # remembered, applied when run() starts
    with caplog.at_level(logging.DEBUG, logger="pyalk.worker"):
        await worker.run()
    assert states_seen(caplog) == ["starting", "draining", "flushing", "stopped"]


async def test_a_forced_stop_while_draining_skips_the_grace_period(alk, db, caplog):
    released = asyncio.Event()
    worker: AsyncWorker

    async def handler(job: AsyncJobHandle) -> None:
        worker.stop()
        worker.stop(force=True)  # a second signal
        await released.wait()  # would outlive any grace period

    await alk.queue("q").enqueue(1)
    worker = alk.worker("q", handler, grace_period=DEADLINE * 10, handle_signals=False)
    try:
        with caplog.at_level(logging.DEBUG, logger="pyalk.worker"):
            counts = await worker.run()
    finally:
        released.set()
    assert (counts.claimed, counts.acked, counts.abandoned) == (1, 0, 1)
    assert states_seen(caplog) == ["starting", "running", "draining", "forced", "flushing", "stopped"]


# outcomes --------------------------------------------------------------------------


async def test_a_burst_worker_acks_every_job_once(alk, db):
    seen: list[int] = []

    async def handler(job: AsyncJobHandle) -> None:
        seen.append(job.payload)

    await alk.queue("q").enqueue_batch(list(range(120)))
    worker = alk.worker("q", handler, concurrency=7, burst=True, handle_signals=False)
    counts = await worker.run()
    assert sorted(seen) == list(range(120))
    assert (counts.claimed, counts.acked, counts.retried, counts.failed, counts.lost) == (120, 120, 0, 0, 0)
    assert job_rows(db) == []
    assert worker.running is False


async def test_a_worker_runs_a_chain_of_jobs_in_order_and_buries_the_rest_of_a_broken_one(alk, db):
    seen: list[int] = []

    async def handler(job: AsyncJobHandle) -> None:
        seen.append(job.payload)
        if job.payload == 7:
            raise PermanentError("broken link")

    queue = alk.queue("q")
    ids = [await queue.enqueue(0)]
    for link in range(1, 12):
        ids.append(await queue.enqueue(link, after=[ids[-1]]))
    worker = alk.worker("q", handler, concurrency=4, burst=True, handle_signals=False)
    counts = await worker.run()
    assert seen == list(range(8))  # in chain order; 8 to 11 never ran
    assert (counts.acked, counts.failed) == (7, 1)
    assert job_rows(db) == [(ids[7], "dead", 1, "PermanentError: broken link")] + [
        (ids[link], "dead", 0, f"after job {ids[link - 1]} died") for link in range(8, 12)]


async def test_failures_retry_on_the_rows_curve_then_die_with_the_error_text(alk, db):
    attempts: list[int] = []

    async def handler(job: AsyncJobHandle) -> None:
        attempts.append(job.job.attempts)
        raise ValueError(f"attempt {job.job.attempts} broke")

    # backoff 0: the retry is due at once, so the burst picks it up again.
    queue = alk.queue("q", QueueOpts(backoff_base_s=0, max_attempts=3))
    job_id = await queue.enqueue({"x": 1})
    counts = await AsyncWorker(queue, handler, burst=True, handle_signals=False).run()
    assert attempts == [1, 2, 3]
    assert (counts.retried, counts.failed, counts.acked) == (2, 1, 0)
    assert job_rows(db) == [(job_id, "dead", 3, "ValueError: attempt 3 broke")]


async def _poll(predicate: Callable[[], bool], deadline: float = DEADLINE) -> bool:
    """Whether ``predicate()`` came true within ``deadline`` seconds (the loop keeps running)."""
    end = time.monotonic() + deadline
    while not predicate():
        if time.monotonic() > end:
            return False
        await asyncio.sleep(0.001)
    return True


async def test_a_burst_outlives_a_retry_settled_while_it_looked_for_claimable_jobs(alk, db):
    """The race behind a flake: the burst looked at next_claim_at while the
    flush loop's retry was in flight (the job still processing, so nothing
    claimable now), and that settle committed before the burst looked at its
    own settler, which was then empty. Forced here: the flush loop's settle
    waits until the claim loop has asked next_claim_at, and the claim loop's
    answer waits until that settle committed."""
    attempts: list[int] = []
    asked = AsyncEvent()

    class LaggingSettle(AsyncWorker):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            claims = self._claims
            exchange, until_claimable = claims._exchange, claims._seconds_until_claimable

            async def lagging_exchange(wanted: int) -> Any:
                # Claim once LISTEN is up (the short first claim advertises and
                # claims again) and once the flush loop took what finished: that
                # claim carries nothing and comes back empty, the retry in flight.
                assert await _poll(lambda: self.listening and not self._buffer and not self.in_flight
                                   and not self._settler._pending)
                return await exchange(wanted)

            async def lagging_until_claimable() -> float | None:
                seconds = await until_claimable()
                asked.set()
                await _poll(lambda: not self._buffer and not self.in_flight and not len(self._settler), 5.0)
                asked.clear()
                return seconds

            claims._exchange = lagging_exchange  # type: ignore[method-assign]
            claims._seconds_until_claimable = lagging_until_claimable  # type: ignore[method-assign]

        async def _settle_batch(self, batch: Any) -> Any:
            await asked.wait(DEADLINE)
            return await super()._settle_batch(batch)

    async def handler(job: AsyncJobHandle) -> None:
        attempts.append(job.job.attempts)
        raise ValueError(f"attempt {job.job.attempts} broke")

    queue = alk.queue("q", QueueOpts(backoff_base_s=0, max_attempts=3))
    job_id = await queue.enqueue({"x": 1})
    worker = LaggingSettle(queue, handler, burst=True, handle_signals=False, settle_interval=0)
    counts = await worker.run()
    assert attempts == [1, 2, 3]
    assert (counts.retried, counts.failed, counts.acked) == (2, 1, 0)
    assert job_rows(db) == [(job_id, "dead", 3, "ValueError: attempt 3 broke")]


async def test_an_error_text_with_array_syntax_is_recorded_as_raised(alk, db):
    """Outcomes travel as array literals: quotes, backslashes, braces, commas
    and a bare NULL in the error text reach last_error unchanged."""
    message = 'a "quoted" \\ back\\slash, {brace}, NULL'

    async def handler(job: AsyncJobHandle) -> None:
        raise PermanentError(message)

    queue = alk.queue("q")
    job_id = await queue.enqueue(1)
    counts = await AsyncWorker(queue, handler, burst=True, handle_signals=False).run()
    assert counts.failed == 1
    assert job_rows(db) == [(job_id, "dead", 1, f"PermanentError: {message}")]


async def test_a_retry_waits_for_the_backoff_curve(alk, db):
    async def handler(job: AsyncJobHandle) -> None:
        raise RuntimeError("later")

    queue = alk.queue("q", QueueOpts(backoff_base_s=600))
    job_id = await queue.enqueue(1)
    await AsyncWorker(queue, handler, burst=True, handle_signals=False).run()
    job = await queue.get_job(job_id)
    assert job is not None and (job.state, job.attempts, job.worker_id) == ("pending", 1, None)
    assert 600 <= job.run_at - job.created_at <= 605


async def test_fail_on_exceptions_kill_the_job_at_once(alk, db):
    class Unrecoverable(Exception):
        pass

    async def handler(job: AsyncJobHandle) -> None:
        if job.payload == "permanent":
            raise PermanentError("bad address")
        raise Unrecoverable()

    queue = alk.queue("q")
    first = await queue.enqueue("permanent")
    counts = await AsyncWorker(queue, handler, burst=True, handle_signals=False).run()
    assert counts.failed == 1
    second = await queue.enqueue("custom")
    counts = await AsyncWorker(queue, handler, fail_on=Unrecoverable, burst=True, handle_signals=False).run()
    assert counts.failed == 1
    assert job_rows(db) == [(first, "dead", 1, "PermanentError: bad address"), (second, "dead", 1, "Unrecoverable")]


async def test_a_handler_that_raises_snooze_runs_again_without_spending_an_attempt(alk, db):
    runs: list[tuple[int, int]] = []

    async def handler(job: AsyncJobHandle) -> None:
        runs.append((job.job.attempts, job.job.attempts_spent))
        if len(runs) == 1:
            raise Snooze(0)  # due again at once: the burst claims it again

    # One attempt: without the refund the second claim would bury it. fail_on
    # every exception: a Snooze is checked first and never fails the job.
    queue = alk.queue("q", QueueOpts(max_attempts=1))
    await queue.enqueue("x")
    recorder = Recorder()
    worker = AsyncWorker(queue, handler, fail_on=Exception, burst=True, handle_signals=False, observer=recorder)
    counts = await worker.run()
    assert runs == [(1, 1), (2, 1)]
    assert (counts.claimed, counts.snoozed, counts.acked, counts.retried, counts.failed, counts.lost) == (
        2, 1, 1, 0, 0, 0)
    assert {o: recorder.total(o) for o in ("snoozed", "acked")} == {"snoozed": 1, "acked": 1}
    assert recorder.held() == 0
    assert job_rows(db) == []


async def test_a_snoozed_job_waits_out_its_delay(alk, db):
    async def handler(job: AsyncJobHandle) -> None:
        raise Snooze(timedelta(hours=1))

    queue = alk.queue("q")
    job_id = await queue.enqueue("x")
    before = one(db, "SELECT alk.now()")
    counts = await AsyncWorker(queue, handler, burst=True, handle_signals=False).run()
    assert (counts.claimed, counts.snoozed, counts.retried) == (1, 1, 0)
    job = await queue.get_job(job_id)
    assert job is not None and (job.state, job.attempts, job.attempts_refunded, job.last_error) == (
        "pending", 1, 1, None)
    assert before + 3600 <= job.run_at <= one(db, "SELECT alk.now()") + 3600


async def test_handler_logs_carry_structured_fields(alk, caplog):
    async def handler(job: AsyncJobHandle) -> None:
        if job.payload == 1:
            raise KeyError("k")

    await alk.queue("q").enqueue_batch([0, 1])
    with caplog.at_level(logging.DEBUG, logger="pyalk.worker"):
        await alk.worker("q", handler, burst=True, handle_signals=False, worker_id="w-logs").run()
    done = [r for r in caplog.records if r.getMessage().startswith("job") and "done" in r.getMessage()]
    retried = [r for r in caplog.records if "will retry" in r.getMessage()]
    assert len(done) == 1 and len(retried) == 1
    for record in done + retried:
        assert record.queue == "q"  # type: ignore[attr-defined]
        assert record.worker_id == "w-logs"  # type: ignore[attr-defined]
        assert record.attempt == 1  # type: ignore[attr-defined]
        assert isinstance(record.job_id, int)  # type: ignore[attr-defined]
        assert record.duration_s >= 0  # type: ignore[attr-defined]
    assert retried[0].error == "KeyError: 'k'"  # type: ignore[attr-defined]
    assert retried[0].exc_info is not None


# stop --------------------------------------------------------------------------------


async def test_stop_lets_running_handlers_finish_and_claims_no_more(alk, db):
    worker: AsyncWorker

    async def handler(job: AsyncJobHandle) -> None:
        worker.stop()  # from inside: the handler still finishes and is acked

    queue = alk.queue("q")
    ids = await queue.enqueue_batch(list(range(10)))
    worker = AsyncWorker(queue, handler, concurrency=1, handle_signals=False)
    counts = await worker.run()
    assert (counts.claimed, counts.acked, counts.abandoned) == (1, 1, 0)
    assert [row[0] for row in job_rows(db)] == ids[1:]
    assert {row[1] for row in job_rows(db)} == {"pending"}


async def test_after_the_grace_period_running_jobs_are_left_to_lease_expiry(alk, db):
    released = asyncio.Event()
    worker: AsyncWorker

    async def handler(job: AsyncJobHandle) -> None:
        worker.stop()
        await released.wait()  # outlives the grace period

    queue = alk.queue("q")
    job_id = await queue.enqueue(1)
    worker = AsyncWorker(queue, handler, concurrency=2, grace_period=0.2, handle_signals=False)
    try:
        counts = await worker.run()
    finally:
        released.set()
    assert (counts.claimed, counts.acked, counts.abandoned) == (1, 0, 1)
    assert job_rows(db) == [(job_id, "processing", 1, None)]


# wake-ups ------------------------------------------------------------------------------


async def test_an_idle_worker_wakes_on_notify_long_before_its_poll(alk, db, dsn):
    worker: AsyncWorker
    handled: list[float] = []

    async def handler(job: AsyncJobHandle) -> None:
        handled.append(time.monotonic())
        worker.stop()

    await alk.queue("q").enqueue("far", delay=3600)  # claimable only in an hour: the worker waits a full poll
    worker = alk.worker("q", handler, poll_interval=60, handle_signals=False)
    since = server_now(db)
    enqueued: list[float] = []

    def enqueue_once_waiting() -> None:
        until(lambda: worker_is_waiting(db, since), "the worker to wait")
        with psycopg.connect(dsn, autocommit=True) as conn:
            enqueued.append(time.monotonic())
            conn.execute("SELECT alk.enqueue('q', '\"now\"')")

    thread = in_thread(enqueue_once_waiting)
    await worker.run()
    thread.join()
    assert handled and handled[0] - enqueued[0] < 30  # woken by NOTIFY, not the 60 s poll


async def test_an_idle_worker_advertises_again_after_each_wake_up_and_misses_no_burst(alk, db, dsn):
    """Each enqueue that notifies consumes the advert: the worker must
    advertise again after every wake-up. Bursts from concurrent connections
    land on an idle worker whose fallback poll is an hour away, so one lost
    wake-up would show as a timeout."""
    worker: AsyncWorker
    handled: list[int] = []

    async def handler(job: AsyncJobHandle) -> None:
        handled.append(job.id)

    worker = alk.worker("q", handler, worker_id="bursty", poll_interval=3600, handle_signals=False)
    bursts, per_burst, enqueuers = 8, 12, 4

    def produce() -> None:
        conns = [psycopg.connect(dsn, autocommit=True) for _ in range(enqueuers)]
        for burst in range(bursts):
            done = burst * per_burst
            until(lambda done=done: len(handled) == done and advertised(db, "bursty"), f"idle before burst {burst}")
            threads = [threading.Thread(target=lambda c=c: [c.execute("SELECT alk.enqueue('q', '1')")
                                                            for _ in range(per_burst // enqueuers)])
                       for c in conns]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        until(lambda: len(handled) == bursts * per_burst, "every burst handled")
        for c in conns:
            c.close()

    await run_beside(worker, produce)
    assert len(handled) == len(set(handled)) == bursts * per_burst


async def test_a_steady_stream_is_claimed_on_the_busy_poll_not_notified_per_claim(alk, db, dsn):
    """An advert consumed within ``busy_poll`` means jobs arrive faster than
    one per interval: the worker claims on that timer without advertising, so
    the stream's enqueues do not notify; once a claim finds nothing it
    advertises again and the next enqueue wakes it (the poll is an hour away)."""
    worker: AsyncWorker
    handled: list[int] = []
    stream, notified = 60, [0, 0]

    async def handler(job: AsyncJobHandle) -> None:
        handled.append(job.payload)

    worker = alk.worker("q", handler, worker_id="streamed", poll_interval=3600, busy_poll=0.2,
                         handle_signals=False)

    def received(listen: psycopg.Connection) -> int:
        return sum(1 for _ in listen.notifies(timeout=0.3))  # what arrived so far

    def produce() -> None:
        with psycopg.connect(dsn, autocommit=True) as listen, psycopg.connect(dsn, autocommit=True) as conn:
            listen.execute(f'LISTEN "{one(listen, "SELECT alk.queue_channel(%s)", "q")}"')
            until(lambda: advertised(db, "streamed"), "the worker to advertise itself idle")
            for i in range(stream):
                conn.execute("SELECT alk.enqueue('q', %s)", [str(i)])
                time.sleep(0.002)  # the stream's pace (a job every 2 ms), not a synchronisation
            until(lambda: len(handled) == stream, "the stream handled")
            until(lambda: advertised(db, "streamed"), "the worker to advertise again after the stream")
            notified[0] = received(listen)
            conn.execute("SELECT alk.enqueue('q', %s)", [str(stream)])
            until(lambda: len(handled) == stream + 1, "the job after the stream handled")
            notified[1] = received(listen)

    await run_beside(worker, produce)
    assert sorted(handled) == list(range(stream + 1))
    # The stream's first enqueue notified; with a pause of more than 0.2 s
    # (a slow machine) one more may. Advertising after every claim, about
    # every second enqueue would.
    assert 1 <= notified[0] <= 3, notified
    assert notified[1] == 1, notified  # the idle worker woke on the NOTIFY


async def test_a_busy_worker_whose_buffer_is_full_still_refills_when_its_runners_ask(alk, db, dsn):
    """In busy-poll mode a poll that claims all it wanted leaves nothing to
    claim until the runners ask for more: the claim loop then waits for them,
    not for ``poll_interval`` (an hour here), so the job behind them runs as
    soon as a runner is free. prefetch 0 and two runners: ``wanted`` is the
    free runners, and the poll that finds B while A runs claims all it wanted."""
    worker: AsyncWorker
    handled: list[str] = []
    running = AsyncEvent()
    release = AsyncEvent()

    async def handler(job: AsyncJobHandle) -> None:
        running.set()
        await release.wait(DEADLINE)
        handled.append(job.payload)

    worker = alk.worker("q", handler, worker_id="full-poll", concurrency=2, prefetch=0, poll_interval=3600,
                         busy_poll=2.0, handle_signals=False)

    def produce() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            until(lambda: advertised(db, "full-poll"), "the worker to advertise itself idle")
            conn.execute("SELECT alk.enqueue('q', '\"A\"')")  # consumes the advert at once: busy mode
            until(running.is_set, "A to start")
            conn.execute("SELECT alk.enqueue('q', '\"B\"')")  # the next poll claims B: all it wanted (1)
            conn.execute("SELECT alk.enqueue('q', '\"C\"')")
            until(lambda: one(db, "SELECT count(*) FROM alk.jobs WHERE state = 'processing'") == 2,
                  "the busy poll to claim B beside A")
            release.set()
            until(lambda: len(handled) == 3, "C handled once A and B are done")

    await run_beside(worker, produce)
    assert sorted(handled) == ["A", "B", "C"]


async def test_a_worker_sleeps_until_next_claim_at_not_a_full_poll(alk, db):
    worker: AsyncWorker
    handled: list[Any] = []

    async def handler(job: AsyncJobHandle) -> None:
        handled.append(job.payload)
        worker.stop()

    await alk.queue("q").enqueue("soon", delay=1)
    started = time.monotonic()
    worker = alk.worker("q", handler, poll_interval=60, listen=False, handle_signals=False)
    await worker.run()
    assert handled == ["soon"]
    assert time.monotonic() - started < 30


# prefetch, release, pause --------------------------------------------------------------


async def test_buffered_jobs_go_back_unspent_at_a_stop_and_another_worker_takes_them_at_once(alk, db):
    worker: AsyncWorker
    first_worker: list[int] = []

    async def handler(job: AsyncJobHandle) -> None:
        first_worker.append(job.id)
        worker.stop()

    queue = alk.queue("q")
    ids = await queue.enqueue_batch(list(range(50)))
    worker = AsyncWorker(queue, handler, concurrency=1, handle_signals=False, worker_id="w-first")
    counts = await worker.run()
    assert counts.claimed == 1 and counts.acked == 1
    rows = db.execute("SELECT id, state, attempts - attempts_refunded, worker_id FROM alk.list_jobs('q') "
                      "ORDER BY id").fetchall()
    # Every job left is pending again at once with no attempt spent, released or never claimed.
    assert rows == [(job_id, "pending", 0, None) for job_id in ids if job_id not in first_worker]
    assert counts.released == db.execute(
        "SELECT count(*) FROM alk.list_jobs('q') WHERE attempts_refunded > 0").fetchone()[0]  # type: ignore[index]
    seen: list[int] = []

    async def record(job: AsyncJobHandle) -> None:
        seen.append(job.id)

    again = await AsyncWorker(queue, record, burst=True, handle_signals=False, worker_id="w-second").run()
    assert sorted(seen) == [job_id for job_id in ids if job_id not in first_worker]
    assert again.acked == 49 and job_rows(db) == []


# the observer (pyalk.worker.observer.WorkerObserver) ---------------------------------------------


class Recorder:
    """A WorkerObserver that keeps every call (handlers call it from any thread)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.claims: list[tuple[int, float]] = []
        self.handlers: list[float] = []
        self.settled: list[tuple[str, int, float]] = []
        self.released: list[int] = []

    def on_claimed(self, n: int, seconds: float) -> None:
        with self.lock:
            self.claims.append((n, seconds))

    def on_handler(self, seconds: float) -> None:
        with self.lock:
            self.handlers.append(seconds)

    def on_settled(self, outcome: str, n: int, seconds: float) -> None:
        with self.lock:
            self.settled.append((outcome, n, seconds))

    def on_released(self, n: int) -> None:
        with self.lock:
            self.released.append(n)

    def total(self, outcome: str) -> int:
        return sum(n for o, n, _ in self.settled if o == outcome)

    def held(self) -> int:
        """In flight: claimed, neither settled nor released."""
        return sum(n for n, _ in self.claims) - sum(n for _, n, _ in self.settled) - sum(self.released)


async def test_the_observer_sees_claims_handlers_and_the_states_the_sql_reports(alk, db):
    async def handler(job: AsyncJobHandle) -> None:
        kind = job.payload["kind"]
        if (kind == "flaky" and job.job.attempts == 1) or kind == "broken":
            raise ValueError(kind)
        if kind == "permanent":
            raise PermanentError(kind)
        if kind == "self-ack":
            assert await job.ack()  # settled here: the worker's own settle is refused (lost)

    # Two attempts, retries due at once: "broken" is retried once, then the SQL buries it.
    queue = alk.queue("q", QueueOpts(backoff_base_s=0, max_attempts=2))
    kinds = ["ok"] * 20 + ["flaky"] * 5 + ["broken"] * 3 + ["permanent"] * 2 + ["self-ack"]
    await queue.enqueue_batch([{"kind": kind, "i": i} for i, kind in enumerate(kinds)])
    recorder = Recorder()
    worker = AsyncWorker(queue, handler, concurrency=4, burst=True, handle_signals=False, observer=recorder)
    counts = await worker.run()
    runs = 20 + 5 * 2 + 3 * 2 + 2 + 1
    assert len(recorder.handlers) == runs and all(s >= 0 for s in recorder.handlers)
    assert sum(n for n, _ in recorder.claims) == runs
    assert {o: recorder.total(o) for o in ("acked", "retried", "failed", "lost")} == {
        "acked": 25, "retried": 8, "failed": 5, "lost": 1}
    assert (counts.acked, counts.retried, counts.failed, counts.lost) == (25, 8, 5, 1)
    # One report per settle call and outcome it covered, never an empty one.
    assert all(n > 0 and seconds >= 0 for _, n, seconds in recorder.settled)
    assert len(recorder.settled) <= len(recorder.claims) + runs
    assert recorder.released == [] and recorder.held() == 0
    assert [row[1] for row in job_rows(db)] == ["dead"] * 5


async def test_the_observer_sees_buffered_jobs_released_at_a_stop(alk, db):
    worker: AsyncWorker

    async def handler(job: AsyncJobHandle) -> None:
        if job.payload == 40:  # by now the start rate is measured and the buffer filled ahead
            worker.stop()

    await alk.queue("q").enqueue_batch(list(range(500)))
    recorder = Recorder()
    worker = alk.worker("q", handler, concurrency=1, handle_signals=False, observer=recorder)
    counts = await worker.run()
    claimed = sum(n for n, _ in recorder.claims)
    assert recorder.total("acked") == counts.acked == len(recorder.handlers) >= 41
    assert counts.released > 0 and sum(recorder.released) == counts.released == claimed - counts.acked
    assert recorder.held() == 0


# cancel of a held job (alk.cancel, issue 26) -------------------------------------------

#: Whether this is the async form: its handlers' tasks are cancelled, a thread only sees job.cancelled.
ASYNC = AsyncWorker.__name__.startswith("Async")
#: How often the waiting handler below looks at job.cancelled (the threaded form's only news of it).
CANCEL_POLL = 0.005


def listening_on_control(caplog: pytest.LogCaptureFixture) -> Callable[[], bool]:
    """Whether the worker LISTENs on its control channel yet (a cancel before it is not heard)."""
    return lambda: any("listening on alk_w_" in record.getMessage() for record in list(caplog.records))


async def test_a_cancelled_running_job_tells_its_handler_and_is_never_settled(alk, db, caplog):
    """alk.cancel from another connection reaches the handler running the job
    (async: its task is cancelled; threads: job.cancelled turns true), the
    job is gone and nothing is retried or buried; 20 times, measured from just
    before the cancel was sent to the handler learning of it."""
    caplog.set_level(logging.DEBUG, logger="pyalk.worker")
    rounds = 20
    started: SimpleQueue[int] = SimpleQueue()
    learned: SimpleQueue[tuple[float, bool]] = SimpleQueue()  # when, and whether by CANCELLED
    gate = AsyncEvent()  # never set: the handler waits on it until told

    async def handler(job: AsyncJobHandle) -> None:
        started.put(job.id)
        try:
            while not job.cancelled:
                await gate.wait(CANCEL_POLL)
        except AsyncRuntime.CANCELLED:
            learned.put((time.monotonic(), True))
            raise
        learned.put((time.monotonic(), False))

    queue = alk.queue("q")
    ids = set(await queue.enqueue_batch(list(range(rounds))))
    worker = AsyncWorker(queue, handler, concurrency=1, handle_signals=False, poll_interval=3600)
    latencies: list[float] = []
    by_cancel: list[bool] = []

    def produce() -> None:
        until(listening_on_control(caplog), "the worker to LISTEN on its control channel")
        for _ in range(rounds):
            job_id = started.get(timeout=DEADLINE)
            sent = time.monotonic()
            assert one(db, "SELECT alk.cancel('q', %s)", job_id) is True
            at, cancelled_error = learned.get(timeout=DEADLINE)
            latencies.append(at - sent)
            by_cancel.append(cancelled_error)

    await run_beside(worker, produce)
    counts = worker.counts
    assert (counts.claimed, counts.cancelled, counts.acked, counts.retried, counts.failed, counts.lost) == (
        rounds, rounds, 0, 0, 0, 0)
    assert by_cancel == [ASYNC] * rounds  # async: the task was cancelled, not the flag polled
    assert job_rows(db) == [] and ids  # gone, none retried or buried
    ordered = sorted(latencies)
    p50, p99 = ordered[rounds // 2], ordered[math.ceil(0.99 * rounds) - 1]
    print(f"cancel to handler ({'async' if ASYNC else 'threads'}), {rounds} rounds: p50 {p50 * 1000:.1f} ms, "
          f"p99 {p99 * 1000:.1f} ms")
    assert p99 < 1.0


async def test_a_cancelled_buffered_job_is_dropped_before_it_starts(alk, db, caplog):
    caplog.set_level(logging.DEBUG, logger="pyalk.worker")
    gate = AsyncEvent()
    ran: list[int] = []

    async def handler(job: AsyncJobHandle) -> None:
        ran.append(job.id)
        await gate.wait(DEADLINE)

    queue = alk.queue("q")
    first, second = await queue.enqueue_batch(["a", "b"])
    worker = AsyncWorker(queue, handler, concurrency=1, handle_signals=False, poll_interval=3600)

    def produce() -> None:
        until(listening_on_control(caplog), "the worker to LISTEN on its control channel")
        until(lambda: ran == [first], "the first job to start")
        until(lambda: one(db, "SELECT state FROM alk.get_job('q', %s)", second) == "processing",
              "the second job to be claimed into the buffer")
        assert one(db, "SELECT alk.cancel('q', %s)", second) is True
        until(lambda: worker.counts.cancelled == 1, "the worker to drop it")
        gate.set()
        until(lambda: worker.counts.acked == 1, "the first job to be acked")

    await run_beside(worker, produce)
    counts = worker.counts
    assert ran == [first]
    assert (counts.claimed, counts.acked, counts.cancelled, counts.released, counts.lost) == (1, 1, 1, 0, 0)
    assert job_rows(db) == []


async def test_a_worker_on_a_queue_with_max_running_1_runs_one_at_a_time_without_spinning(alk, db):
    queue = alk.queue("q")
    await queue.set_limits(max_running=1)
    await queue.enqueue_batch(list(range(12)))
    running = 0
    most = 0

    async def handler(job: AsyncJobHandle) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await AsyncRuntime.yield_now()
        running -= 1

    recorder = Recorder()
    worker = AsyncWorker(queue, handler, concurrency=8, burst=True, handle_signals=False, observer=recorder)
    counts = await worker.run()
    assert (counts.claimed, counts.acked, most) == (12, 12, 1)
    # A claim that comes back short because of the limit waits for the
    # running job's outcome (carried by the next claim), not a timer: a few
    # claims per job, not a poll storm.
    assert len(recorder.claims) <= 3 * 12 + 3, recorder.claims


async def test_under_max_running_a_short_claim_waits_for_the_runners_not_next_claim_at(alk, db):
    queue = alk.queue("q")
    await queue.set_limits(max_running=2)
    await queue.enqueue_batch(list(range(20)))
    asked = 0
    next_claim_clock = queue.next_claim_clock

    async def counted() -> tuple[int | None, int, float]:
        nonlocal asked
        asked += 1
        return await next_claim_clock()

    queue.next_claim_clock = counted  # type: ignore[method-assign]  # counts, then asks the server

    async def handler(job: AsyncJobHandle) -> None:
        await AsyncRuntime.yield_now()

    recorder = Recorder()
    worker = AsyncWorker(queue, handler, concurrency=2, burst=True, handle_signals=False, observer=recorder)
    counts = await worker.run()
    assert (counts.claimed, counts.acked) == (20, 20)
    # Every claim but the last comes back short (2 of the buffer's want):
    # each time both runners hold a job or their outcomes wait, and their
    # wake-up brings the next claim, which carries the outcomes and so frees
    # the slots. Only the burst's end (nothing held) asks when a job is next.
    assert len(recorder.claims) >= 10, recorder.claims
    assert asked <= 2, (asked, recorder.claims)


async def test_a_wait_given_no_deadline_yet_waits_for_the_call():
    # Before a stop the worker's deadline is infinite. The threaded runtime's
    # Thread.join() cannot take infinity (OverflowError), which a stop from
    # another thread could hand it (its deadline not yet begun).
    async def answer() -> int:
        return 42

    assert await AsyncRuntime.within(math.inf, answer) == 42
