"""The worker rotates the job storage as it settles (pyalk/_async/worker/rotation.py):
a burst over more jobs than a rotation waits for ends with the slot rotated."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from pyalk import AsyncAlk, AsyncJobHandle
from tests.helpers import one

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
