"""Waiting for a job's outcome (pyalk/_async/outcome.py, docs/queue.md
"Waiting for a result"): ``queue.defer(...).wait()`` and
``queue.wait_for_result``, and a worker storing its handler's return value.

The settling side runs in a thread and starts only once the server shows the
waiter's own connection idle after its read of the job (it listens by then),
or, for the outcome settled before the wait, before the wait starts. No sleeps.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg
import pytest

from pyalk import (
    AsyncAlk,
    AsyncDeferredJob,
    AsyncJobHandle,
    AsyncWorker,
    InvalidArgument,
    JobCancelled,
    JobDied,
    JobNotFound,
    NoResultKept,
    WaitTimeout,
)
from tests.helpers import one, until

DEADLINE = 30.0
APP = "pyalk-outcome-test"


@pytest.fixture
async def alk(dsn: str) -> AsyncIterator[AsyncAlk]:
    # Named, so a test can see the waiter's connection in pg_stat_activity.
    async with AsyncAlk(f"{dsn} application_name={APP}") as client:
        await client.queue("q").set_retention(3600)
        yield client


def waiting(db: psycopg.Connection) -> bool:
    """A waiter's connection has read the job after its LISTEN and is idle: waiting for the announcement."""
    return bool(one(db, "SELECT count(*) = 1 FROM pg_stat_activity WHERE application_name = %s AND state = 'idle'"
                        " AND query LIKE '%%alk.get_job%%'", APP))


def beside(db: psycopg.Connection, settle: Callable[[psycopg.Connection], None], dsn: str) -> threading.Thread:
    """Run ``settle`` on a connection of its own in a thread, once a waiter waits."""

    def run() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            until(lambda: waiting(db), "the waiter to listen and read the job")
            settle(conn)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def claim_and(conn: psycopg.Connection, call: str, *args: Any) -> None:
    """Claim the next job of q as w1 and settle it with ``call`` (alk.ack, alk.fail, ...)."""
    job_id, attempt = conn.execute("SELECT id, attempts FROM alk.claim('q', 'w1', 1)").fetchone()  # type: ignore[misc]
    conn.execute(f"SELECT {call}(%s, 'w1', %s, {', '.join(['%s'] * len(args))})" if args
                 else f"SELECT {call}(%s, 'w1', %s)", [job_id, attempt, *args])


async def test_wait_returns_the_result_of_an_ack_after_the_listen(alk, db, dsn):
    job = await alk.queue("q").defer({"a": 1, "b": 2})
    assert isinstance(job, AsyncDeferredJob) and job.queue == "q"
    thread = beside(db, lambda conn: claim_and(conn, "alk.ack", "q", '{"sum": 3}'), dsn)
    assert await job.wait(timeout=DEADLINE) == {"sum": 3}
    thread.join()
    completed = await job.get()
    assert completed is not None and (completed.state, completed.result) == ("completed", {"sum": 3})


async def test_an_outcome_settled_before_the_wait_is_read_at_once(alk, db):
    queue = alk.queue("q")
    job_id = await queue.enqueue(1)
    claim_and(db, "alk.ack", "q", '"done"')
    assert await queue.wait_for_result(job_id, timeout=DEADLINE) == "done"
    other = await queue.enqueue(2)
    claim_and(db, "alk.ack")  # no result: None, as the handler returned
    assert await queue.wait_for_result(other) is None


async def test_a_dead_job_raises_job_died_with_its_error(alk, db, dsn):
    job = await alk.queue("q").defer(1)
    thread = beside(db, lambda conn: claim_and(conn, "alk.fail", "smtp refused"), dsn)
    with pytest.raises(JobDied, match="smtp refused") as raised:
        await job.wait(timeout=DEADLINE)
    thread.join()
    assert raised.value.job.state == "dead" and raised.value.job.last_error == "smtp refused"


async def test_a_cancelled_job_raises_job_cancelled(alk, db, dsn):
    job = await alk.queue("q").defer(1)
    thread = beside(db, lambda conn: conn.execute("SELECT alk.cancel('q', %s)", [job.id]), dsn)
    with pytest.raises(JobCancelled, match=f"job {job.id} "):
        await job.wait(timeout=DEADLINE)
    thread.join()


async def test_other_jobs_outcomes_do_not_end_the_wait(alk, db, dsn):
    queue = alk.queue("q")
    first = await queue.enqueue("first")
    second = await queue.defer("second")

    def settle(conn: psycopg.Connection) -> None:
        claim_and(conn, "alk.ack", "q", '"not mine"')  # the first job, claim order
        claim_and(conn, "alk.ack", "q", '"mine"')

    thread = beside(db, settle, dsn)
    assert await second.wait(timeout=DEADLINE) == "mine"
    thread.join()
    assert await queue.wait_for_result(first) == "not mine"


async def test_a_queue_without_retention_refuses_to_wait(alk):
    queue = alk.queue("plain")
    job = await queue.defer(1)
    with pytest.raises(NoResultKept, match="'plain' keeps no completed jobs"):
        await job.wait()


async def test_a_missing_job_raises_job_not_found(alk):
    with pytest.raises(JobNotFound, match="job 424242 is not in queue 'q'"):
        await alk.queue("q").wait_for_result(424242)


async def test_a_wait_times_out_and_says_the_state(alk):
    job = await alk.queue("q").defer(1)
    started = time.monotonic()
    with pytest.raises(WaitTimeout, match=r"within 0.2s \(it is pending"):
        await job.wait(timeout=0.2)
    assert time.monotonic() - started >= 0.2
    with pytest.raises(TimeoutError):  # WaitTimeout is one
        await job.wait(timeout=0)


@pytest.mark.parametrize("timeout", [-1, float("nan"), "1", True])
async def test_a_bad_timeout_is_refused_by_name(alk, timeout):
    job = await alk.queue("q").defer(1)
    with pytest.raises(InvalidArgument, match="timeout"):
        await job.wait(timeout=timeout)


# the worker stores what its handler returns --------------------------------------


async def test_a_worker_stores_the_handler_return_value_as_the_result(alk, db, dsn):
    async def handler(job: AsyncJobHandle) -> Any:
        return {"doubled": job.payload * 2}

    worker = alk.worker("q", handler, worker_id="results", poll_interval=0.5, handle_signals=False)
    results: list[Any] = []

    def produce() -> None:
        from pyalk import Alk

        with Alk(dsn) as producer:
            jobs = [producer.queue("q").defer(n) for n in range(5)]
            results.extend(job.wait(timeout=DEADLINE) for job in jobs)
        worker.stop()

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    await worker.run()
    thread.join()
    assert results == [{"doubled": n * 2} for n in range(5)]


async def test_a_return_value_json_cannot_hold_is_logged_and_the_job_acked_without_result(alk, db, caplog):
    async def handler(job: AsyncJobHandle) -> Any:
        return {1, 2} if job.payload == "set" else None

    queue = alk.queue("q")
    ids = [await queue.enqueue("set"), await queue.enqueue("none")]
    worker = alk.worker("q", handler, worker_id="unstorable", burst=True, handle_signals=False)
    with caplog.at_level(logging.WARNING, logger="pyalk.worker"):
        await worker.run()
    for job_id in ids:
        job = await queue.get_job(job_id)
        assert job is not None and (job.state, job.result) == ("completed", None)
    assert any(f"job {ids[0]}: the handler's return value is not stored" in r.getMessage() for r in caplog.records)
    assert sum("return value" in r.getMessage() for r in caplog.records) == 1


async def test_without_retention_a_worker_acks_and_deletes_whatever_it_returns(alk, db):
    async def handler(job: AsyncJobHandle) -> Any:
        return {"kept": False}

    queue = alk.queue("plain")
    job_id = await queue.enqueue(1)
    await AsyncWorker(queue, handler, worker_id="plain", burst=True, handle_signals=False).run()
    assert await queue.get_job(job_id) is None
