"""Workers under concurrency, in this process: many workers (async and
threaded) share a queue and process every job exactly once; a handler that
outlives its visibility timeout keeps its lease by heartbeat; terminated
backends are reconnected without losing a job. Plus the surface parity of the
async and the threaded worker.

Waits are deadlines on conditions (rows, counters), never sleeps.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections import Counter
from typing import Any

import psycopg
import pytest

from pyalk import Alk, AsyncAlk, AsyncJobHandle, AsyncWorker, JobHandle, QueueOpts, Worker
from tests.helpers import one, until, until_async

DEADLINE = 60.0


def remaining(db: psycopg.Connection, queue: str = "q") -> int:
    return db.execute("SELECT count(*) FROM alk.jobs WHERE queue = %s", [queue]).fetchone()[0]  # type: ignore[index]


# the surface -------------------------------------------------------------------


def public_surface(cls: type) -> dict[str, list[tuple[str, Any, Any]]]:
    """Public methods and properties with their parameters (name, kind, default)."""
    surface = {}
    for name, member in inspect.getmembers(cls):
        if name.startswith("_") and name != "__init__":
            continue
        if isinstance(member, property):
            surface[name] = [("property", None, None)]
        elif callable(member):
            surface[name] = [(p.name, p.kind, p.default) for p in inspect.signature(member).parameters.values()]
    return surface


def test_the_async_and_threaded_workers_expose_the_same_surface():
    assert public_surface(AsyncWorker) == public_surface(Worker)
    assert inspect.iscoroutinefunction(AsyncWorker.run) and not inspect.iscoroutinefunction(Worker.run)


def test_each_worker_refuses_the_other_kind_of_handler(dsn):
    async def coroutine(job: AsyncJobHandle) -> None:
        pass

    def blocking(job: JobHandle) -> None:
        pass

    with pytest.raises(TypeError, match=r"use pyalk\.Worker"):
        AsyncAlk(dsn).worker("q", blocking)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"use pyalk\.AsyncWorker"):
        Alk(dsn).worker("q", coroutine)


# exactly once ------------------------------------------------------------------------


async def test_async_and_threaded_workers_process_every_job_exactly_once(dsn, db):
    """3 async workers (concurrency 5) and 2 threaded workers (concurrency 4),
    each on its own client, drain 1500 jobs: every job handled once, acked.
    The jobs arrive once all five wait idle, and a small prefetch keeps any
    one of them from claiming the queue before the others wake (on a loaded
    machine the first to start once drained it alone)."""
    jobs = 1500
    handled: Counter[int] = Counter()
    guard = threading.Lock()

    async def async_handler(job: AsyncJobHandle) -> None:
        with guard:
            handled[job.payload] += 1
        await asyncio.sleep(0)

    def thread_handler(job: JobHandle) -> None:
        with guard:
            handled[job.payload] += 1

    clients = [AsyncAlk(dsn) for _ in range(3)]
    async_workers = [client.worker("q", async_handler, concurrency=5, prefetch=10, worker_id=f"async-{i}",
                                 handle_signals=False) for i, client in enumerate(clients)]
    sync_clients = [Alk(dsn) for _ in range(2)]
    sync_workers = [client.worker("q", thread_handler, concurrency=4, prefetch=10, worker_id=f"thread-{i}",
                           handle_signals=False) for i, client in enumerate(sync_clients)]
    threads = [threading.Thread(target=worker.run) for worker in sync_workers]
    for thread in threads:
        thread.start()
    try:
        runs = [asyncio.ensure_future(worker.run()) for worker in async_workers]
        await until_async(lambda: one(db, "SELECT count(*) FROM alk.idle_workers WHERE queue = 'q'") == 5,
                          "all five workers to wait idle")
        with Alk(dsn) as loader:
            queue = loader.queue("q")
            for start in range(0, jobs, 500):
                queue.enqueue_batch(list(range(start, start + 500)))
        await until_async(lambda: sum(handled.values()) >= jobs and remaining(db) == 0, "the queue to drain")
    finally:
        for worker in [*async_workers, *sync_workers]:
            worker.stop()
        counts = await asyncio.gather(*runs)
        for thread in threads:
            thread.join(30)
        for client in clients:
            await client.close()
        for sync_client in sync_clients:
            sync_client.close()
    assert handled == Counter(range(jobs)), "a job was lost or handled twice"
    all_counts = [*counts, *(worker.counts for worker in sync_workers)]
    assert sum(c.acked for c in all_counts) == jobs
    assert sum(c.lost + c.retried + c.failed + c.abandoned for c in all_counts) == 0
    assert all(c.claimed > 0 for c in all_counts), "a worker never got a job"


# heartbeats ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["async", "threaded"])
def test_a_handler_that_outlives_the_visibility_timeout_keeps_its_lease(dsn, db, connect, kind):
    """visibility_timeout_s = 1: without heartbeats the lease lapses after at
    most two seconds and another worker could claim the job. The handler runs
    until the server's clock is past the original lease, then tries to claim
    the job from another worker: it must not get it."""
    rival = connect()
    observed: dict[str, Any] = {}

    def work(job: Any) -> None:
        first_deadline = job.job.claim_expires_at
        until(lambda: rival.execute("SELECT alk.now()").fetchone()[0] > first_deadline + 1,  # type: ignore[index]
              "the original lease to be over", deadline=10)
        observed["stolen"] = rival.execute("SELECT id FROM alk.claim('q', 'rival', 10)").fetchall()
        observed["lease"] = rival.execute("SELECT claim_expires_at FROM alk.get_job('q', %s)",
                                          [job.id]).fetchone()[0]  # type: ignore[index]
        observed["first_deadline"] = first_deadline

    with Alk(dsn) as loader:
        job_id = loader.queue("q", QueueOpts(visibility_timeout_s=1)).enqueue("long")
    if kind == "async":
        async def handler(job: AsyncJobHandle) -> None:
            await asyncio.to_thread(work, job)  # the handler's blocking work, off the loop

        async def main() -> Any:
            async with AsyncAlk(dsn) as alk:
                return await alk.worker("q", handler, burst=True, handle_signals=False).run()

        counts = asyncio.run(main())
    else:
        with Alk(dsn) as alk:
            counts = alk.worker("q", work, burst=True, handle_signals=False).run()
    assert observed["stolen"] == []
    assert observed["lease"] > observed["first_deadline"]
    assert (counts.acked, counts.lost) == (1, 0)
    assert db.execute("SELECT count(*) FROM alk.jobs").fetchone() == (0,)
    del job_id


# reconnecting --------------------------------------------------------------------------


def test_terminated_backends_are_reconnected_without_losing_a_job(dsn, db):
    """Half-way through, every backend of the worker (pool and LISTEN) is
    terminated. The worker reconnects and finishes: every job handled, the
    table empty; a job handled twice can only be one whose claim or ack was
    cut off (at least once), and it then ran under a later claim."""
    app = "pyalk-reconnect-test"
    jobs = 400
    handled: list[tuple[int, int]] = []
    guard = threading.Lock()
    killed = threading.Event()

    def handler(job: JobHandle) -> None:
        with guard:
            handled.append((job.payload, job.job.attempts))
            halfway = len(handled) == jobs // 2
        if halfway:
            terminated = db.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                                    " WHERE application_name = %s", [app]).fetchone()[0]  # type: ignore[index]
            assert terminated >= 2  # a pool connection and the LISTEN connection at least
            killed.set()

    with Alk(dsn) as loader:
        loader.queue("q", QueueOpts(visibility_timeout_s=2)).enqueue_batch(list(range(jobs)))
    with Alk(f"{dsn} application_name={app}") as alk:
        worker = alk.worker("q", handler, concurrency=4, poll_interval=0.5, handle_signals=False)
        thread = threading.Thread(target=worker.run)
        thread.start()
        try:
            until(lambda: killed.is_set() and remaining(db) == 0, "the queue to drain after the kill")
            until(lambda: worker.listening, "the LISTEN connection to come back")
        finally:
            worker.stop()
            thread.join(30)
    assert killed.is_set()
    payloads = Counter(payload for payload, _ in handled)
    assert set(payloads) == set(range(jobs)), "a job was lost"
    twice = [payload for payload, count in payloads.items() if count > 1]
    assert len(twice) <= 8, f"more duplicates than in-flight claims could explain: {twice}"
    for payload in twice:
        attempts = sorted(attempt for p, attempt in handled if p == payload)
        assert attempts == sorted(set(attempts)), "a job ran twice under the same claim"
