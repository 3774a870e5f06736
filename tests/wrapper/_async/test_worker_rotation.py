"""The worker rotates the job storage as it settles (pyalk/_async/worker/rotation.py):
a burst over more jobs than a rotation waits for ends with the slot rotated, a
worker that runs out of jobs leaves the slot rotated, before it stops and as
it stops, and a slot emptied in steps is finished without more settles."""

from __future__ import annotations

from collections.abc import AsyncIterator

import psycopg
import pytest

from pyalk import AsyncAlk, AsyncJobHandle
from pyalk._async.worker import rotation
from tests.helpers import one, until, until_a_second_old
from tests.wrapper._async.running import run_beside

JOBS = 10_001  # alk.rotate_jobs' default min_jobs, and one


@pytest.fixture
async def alk(dsn: str) -> AsyncIterator[AsyncAlk]:
    async with AsyncAlk(dsn) as alk:
        yield alk


async def test_a_worker_rotates_the_storage_as_it_settles(alk, db):
    async def handler(job: AsyncJobHandle) -> None:
        return None

    await alk.queue("q").enqueue_batch([{}] * JOBS)
    worker = alk.worker("q", handler, concurrency=10, burst=True, handle_signals=False)
    counts = await worker.run()
    assert counts.acked == JOBS
    assert one(db, "SELECT rotations FROM alk.job_slots") >= 1
    assert one(db, "SELECT count(*) FROM alk.jobs") == 0


async def test_a_rotation_answers_through_the_client(alk, db):
    await alk.queue("q").enqueue({})
    assert await alk.rotate_jobs(min_jobs=10) == "not due"
    assert await alk.rotate_jobs(min_jobs=0) == "rotated"
    assert one(db, "SELECT count(*) FROM alk.jobs WHERE slot = (SELECT current_slot FROM alk.job_slots)") == 1


async def noop(job: AsyncJobHandle) -> None:
    return None


async def moved_in_and_live(alk: AsyncAlk, db: psycopg.Connection, jobs: int) -> int:
    """Enqueue jobs and rotate them into the next slot: no new id since, so
    the slot is due only once they are settled (a tenth of min_jobs, all
    settled). The rotations so far."""
    await alk.queue("q").enqueue_batch([{}] * jobs)
    assert await alk.rotate_jobs(min_jobs=0) == "rotated"
    assert one(db, "SELECT moved_in FROM alk.job_slots") == jobs
    return int(one(db, "SELECT rotations FROM alk.job_slots"))


async def test_a_worker_that_runs_out_of_jobs_leaves_the_slot_rotated(alk, db, dsn):
    rotations = await moved_in_and_live(alk, db, 1500)
    worker = alk.worker("q", noop, concurrency=10, handle_signals=False)

    def watch() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            until(lambda: one(conn, "SELECT rotations FROM alk.job_slots") == rotations + 1,
                  "a rotation once the worker ran out of jobs, before it stops")

    await run_beside(worker, watch)
    assert worker.counts.acked == 1500
    assert one(db, "SELECT moved_in FROM alk.job_slots") == 0


async def test_a_stopping_worker_makes_a_last_call(alk, db, monkeypatch):
    monkeypatch.setattr(rotation, "ROTATE_EVERY", 3600.0)  # no call while it runs: the last one only
    rotations = await moved_in_and_live(alk, db, 1500)
    worker = alk.worker("q", noop, concurrency=10, burst=True, handle_signals=False)
    counts = await worker.run()
    assert counts.acked == 1500
    assert one(db, "SELECT rotations FROM alk.job_slots") == rotations + 1
    assert one(db, "SELECT moved_in FROM alk.job_slots") == 0


async def test_a_worker_goes_on_emptying_a_slot_without_settling_more(alk, db, dsn):
    # 40,001 jobs of another queue: the first call moves 20,000 of them, the
    # worker's one settle makes it call again (20,000 more), and only its
    # own ticks, with nothing more settled, finish the slot.
    await alk.queue("elsewhere").enqueue_batch([{}] * 40_001)
    assert await alk.rotate_jobs(min_jobs=0) == "moving"
    await alk.queue("q").enqueue({})
    worker = alk.worker("q", noop, concurrency=1, handle_signals=False)

    def watch() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            until(lambda: one(conn, "SELECT draining_slot IS NULL FROM alk.job_slots"),
                  "the slot emptied while the worker waits for jobs")

    await run_beside(worker, watch)
    assert worker.counts.acked == 1
    assert one(db, "SELECT count(*) FROM alk.jobs") == 40_001


async def test_a_failed_call_does_not_end_a_rotation_that_was_moving(alk, db, dsn, monkeypatch):
    # The first call after the settle fails as a lost connection would; the
    # worker asks again at its next tick, not only after its next settle.
    await alk.queue("elsewhere").enqueue_batch([{}] * 40_001)
    assert await alk.rotate_jobs(min_jobs=0) == "moving"
    await alk.queue("q").enqueue({})
    real = rotation.rotate_jobs
    failures = [psycopg.OperationalError("the connection was lost")]

    async def failing_once(executor):  # type: ignore[no-untyped-def]
        if failures:
            raise failures.pop()
        return await real(executor)

    monkeypatch.setattr(rotation, "rotate_jobs", failing_once)
    worker = alk.worker("q", noop, concurrency=1, handle_signals=False)

    def watch() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            until(lambda: not failures and one(conn, "SELECT draining_slot IS NULL FROM alk.job_slots"),
                  "the slot emptied after a failed call")

    await run_beside(worker, watch)
    assert worker.counts.acked == 1
    assert one(db, "SELECT count(*) FROM alk.jobs") == 40_001


def rotation_answers(worker: object) -> dict[str, int]:
    """How the worker's rotation calls answered (AsyncRotator.answers)."""
    return dict(worker._rotator.answers)  # type: ignore[attr-defined]


async def test_a_locked_answer_does_not_end_a_rotation_that_was_moving(alk, db, dsn, connect):
    # An old transaction holds the draining slot: the worker's calls answer
    # 'locked' until it ends, and the worker goes on asking, settles or not.
    await alk.queue("elsewhere").enqueue_batch([{}] * 40_001)
    assert await alk.rotate_jobs(min_jobs=0) == "moving"
    draining = one(db, "SELECT draining_slot FROM alk.job_slots")
    holder = connect()
    holder.execute("BEGIN")
    holder.execute(f"SELECT count(*) FROM alk.jobs_{draining}")
    until_a_second_old(db, holder, "the holder a second old")
    assert await alk.rotate_jobs(min_jobs=0) == "locked"
    await alk.queue("q").enqueue({})
    worker = alk.worker("q", noop, concurrency=1, handle_signals=False)

    def watch() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            until(lambda: worker.counts.acked == 1, "the job settled")
            until(lambda: (rotation_answers(worker).get("locked", 0) > 0), "a locked answer to the worker")
            holder.rollback()
            until(lambda: one(conn, "SELECT draining_slot IS NULL FROM alk.job_slots"),
                  "the slot emptied after the holder ended")

    await run_beside(worker, watch)
