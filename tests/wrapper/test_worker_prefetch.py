"""The async worker's prefetch buffer and idle adverts over time (kept
out of the generated pair: these drive a running worker from the same loop).
A buffered job past its lifetime is released, not started; a worker on a
paused queue advertises itself idle and resumes on the resume's NOTIFY."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from pyalk import AsyncAlk, AsyncJobHandle, AsyncWorker

DEADLINE = 30.0


@pytest.fixture
async def alk(dsn: str) -> AsyncIterator[AsyncAlk]:
    async with AsyncAlk(dsn) as client:
        yield client

async def test_a_buffered_job_past_its_lifetime_is_released_not_started(alk, db):
    release = asyncio.Event()
    started: list[int] = []

    async def handler(job: AsyncJobHandle) -> None:
        started.append(job.id)
        await release.wait()

    queue = alk.queue("q")
    ids = await queue.enqueue_batch([1, 2, 3])
    worker = AsyncWorker(queue, handler, concurrency=1, buffer_lifetime=0.2, handle_signals=False,
                         worker_id="w-life")
    task = asyncio.create_task(worker.run())
    try:
        await until_async(lambda: worker.counts.released >= 2, "the buffered jobs to outlive their lifetime")
    finally:
        release.set()
        worker.stop()
        await task
    assert started[0] == ids[0]


async def test_a_worker_on_a_paused_queue_idles_and_resumes_on_its_own(alk, db):
    worker: AsyncWorker
    handled: list[Any] = []

    async def handler(job: AsyncJobHandle) -> None:
        handled.append(job.payload)
        worker.stop()

    db.execute("SELECT alk.pause_queue('q')")
    await alk.queue("q").enqueue("after resume")
    worker = alk.worker("q", handler, poll_interval=60, handle_signals=False, worker_id="w-paused")
    task = asyncio.create_task(worker.run())
    try:
        await until_async(lambda: bool(db.execute(
            "SELECT count(*) FROM alk.idle_workers WHERE worker_id = 'w-paused'").fetchone()[0]),  # type: ignore[index]
            "the worker to advertise itself idle")
        assert handled == []
        resumed = time.monotonic()
        db.execute("SELECT alk.resume_queue('q')")  # notifies the idle worker
        await asyncio.wait_for(task, DEADLINE)
    finally:
        worker.stop()
    assert handled == ["after resume"]
    assert time.monotonic() - resumed < 30  # woken by the resume's NOTIFY, not the 60 s poll


async def until_async(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)
