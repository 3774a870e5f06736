"""PgQueuer (PyPI ``pgqueuer``): the asyncpg driver (its docs measure it at
about twice psycopg's throughput), a dedicated connection for the
QueueManager, ``batch_size=C`` (jobs fetched per dequeue round trip and run
together; 10 is the docs' default and benchmark setting) and ``mode=drain`` so
the manager returns once the queue is empty. The per-entrypoint
``concurrency_limit`` is not used: enforced in SQL across the fleet, it made
concurrency 1 crawl (under 10 jobs/s) in a trial run.
Jobs go in with the list form of ``Queries.enqueue``."""

from __future__ import annotations

import time
from importlib.metadata import version

from bench.peers.common import CHUNK, Args, Countdown, PeerResult, PeerUnavailable, analyze_if_asked, main


async def run(args: Args) -> PeerResult:
    try:
        import asyncpg
        from pgqueuer import AsyncpgDriver, Queries, QueueManager
        from pgqueuer.types import QueueExecutionMode
    except ImportError as error:
        raise PeerUnavailable(f"pgqueuer (with asyncpg) is not installed: {error}") from error

    admin = await asyncpg.connect(args.url)
    worker_conn = await asyncpg.connect(args.url)
    try:
        queries = Queries(AsyncpgDriver(admin))
        await queries.install()
        t0 = time.perf_counter()
        for start in range(0, args.jobs, CHUNK):
            k = min(CHUNK, args.jobs - start)
            await queries.enqueue(["noop"] * k, [b"{}"] * k, [0] * k)
        enqueue_s = time.perf_counter() - t0
        await analyze_if_asked(args.dsn)

        countdown = Countdown(args.jobs)
        qm = QueueManager(Queries(AsyncpgDriver(worker_conn)))

        @qm.entrypoint("noop")
        async def noop(job: object) -> None:
            countdown.tick()

        countdown.start()
        await qm.run(batch_size=args.concurrency, mode=QueueExecutionMode.drain)
    finally:
        await worker_conn.close()
        await admin.close()
    return PeerResult(
        peer="pgqueuer",
        version=version("pgqueuer"),
        jobs=args.jobs,
        concurrency=args.concurrency,
        enqueue_s=enqueue_s,
        process_s=countdown.elapsed,
        processed=countdown.count,
        settings={"driver": "asyncpg", "batch_size": args.concurrency, "mode": "drain"},
    )


if __name__ == "__main__":
    main(run)
