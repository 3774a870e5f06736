"""Procrastinate (PyPI ``procrastinate``): psycopg connector, one worker with
``concurrency=C`` (its documented knob for async tasks), LISTEN/NOTIFY on
(the default), ``wait=False`` so the worker returns once it has caught up.
Jobs go in with ``batch_defer_async``."""

from __future__ import annotations

import time
from importlib.metadata import version

from bench.peers.common import CHUNK, Args, Countdown, PeerResult, PeerUnavailable, analyze_if_asked, main


async def run(args: Args) -> PeerResult:
    try:
        import procrastinate
    except ImportError as error:
        raise PeerUnavailable(f"procrastinate is not installed: {error}") from error

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=args.dsn))
    countdown = Countdown(args.jobs)

    @app.task(name="noop", queue="bench")
    async def noop(n: int) -> None:
        countdown.tick()

    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        t0 = time.perf_counter()
        for start in range(0, args.jobs, CHUNK):
            await noop.batch_defer_async(*({"n": i} for i in range(start, min(args.jobs, start + CHUNK))))
        enqueue_s = time.perf_counter() - t0
        await analyze_if_asked(args.dsn)
        countdown.start()
        await app.run_worker_async(
            queues=["bench"],
            concurrency=args.concurrency,
            wait=False,
            install_signal_handlers=False,
            listen_notify=True,
        )
    return PeerResult(
        peer="procrastinate",
        version=version("procrastinate"),
        jobs=args.jobs,
        concurrency=args.concurrency,
        enqueue_s=enqueue_s,
        process_s=countdown.elapsed,
        processed=countdown.count,
        settings={"connector": "PsycopgConnector", "concurrency": args.concurrency, "listen_notify": True},
    )


if __name__ == "__main__":
    main(run)
