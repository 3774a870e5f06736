"""pyalk's own worker in the end-to-end row (issue 7 §2), and the worker /
subscriber side of the wake-latency and stream-tail rows (§3).

End to end: ``args.jobs`` no-op jobs go in with ``Queue.enqueue_batch`` (one
round trip per 1,000), then one burst worker processes them, configured for
with its defaults (no tuning: it claims ahead into a local buffer of up to 1000
jobs, settles outcomes in batches, carried by a claim into an empty buffer, and listens
for wake-ups as in production), the default pool of 4 connections. ``--variant async`` runs
:class:`pyalk.AsyncWorker` (handlers as asyncio tasks), ``--variant
threaded`` the threaded :class:`pyalk.Worker` (``Alk(...).worker(...)``,
handlers on ``concurrency`` threads); the row runs both and reports the
better.

Latency (``--listen wake`` / ``--listen stream``): a long-lived process that
idles on LISTEN (a worker with a 60 s fallback poll, or a stream
subscription) and writes one line per handler start / yielded event to
stdout: ``<seq> <CLOCK_MONOTONIC ns>``. The row (bench/rows_latency.py)
enqueues or publishes one item at a time, records the same clock when its
commit returns, and waits for the line before the next (spaced) item, so
every sample is a fresh wake-up. ``--listen bare-queue`` / ``bare-stream``
is the floor: a plain psycopg LISTEN on the same channel, timestamped when
the notification arrives (no claim, no read); ``--listen listen-claim`` adds
one prepared alk.claim on plain psycopg after the notification (the SQL a
wake-up cannot avoid, without the worker).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

from bench.peers.common import CHUNK, Args, Countdown, PeerResult, PeerUnavailable, analyze_if_asked, main

QUEUE = "bench"
VARIANTS = ("async", "threaded")


def missing() -> str | None:
    """Why pyalk's worker cannot run here (None: it can)."""
    try:
        import pyalk

        pyalk.AsyncWorker  # noqa: B018 - the API the runner uses
        pyalk.Worker  # noqa: B018
        pyalk.AsyncAlk.worker  # noqa: B018
    except (ImportError, AttributeError) as error:
        return f"pyalk's worker (pyalk.AsyncWorker / pyalk.Worker) is not importable: {error}"
    return None


def missing_subscribe() -> str | None:
    """Why stream subscribe cannot run here (None: it can)."""
    try:
        import pyalk

        pyalk.AsyncStream.subscribe  # noqa: B018
    except (ImportError, AttributeError) as error:
        return f"pyalk's stream subscribe() is not importable: {error}"
    return None


def worker_options(concurrency: int) -> dict[str, Any]:
    """pyalk's defaults (no tuning: prefetch, batch sizes and settle timer as
    shipped); only what a drained run needs: burst, no signal handlers."""
    return {
        "concurrency": concurrency,
        "burst": True,
        "handle_signals": False,
    }


class _RssCountdown(Countdown):
    """A Countdown that records the RSS when the count reaches a checkpoint."""

    def __init__(self, total: int, checkpoints: frozenset[int]) -> None:
        super().__init__(total)
        self.checkpoints = checkpoints
        self.rss_kib: dict[int, int] = {}

    def tick(self) -> None:
        super().tick()
        if self.count in self.checkpoints:
            self.rss_kib[self.count] = _rss_kib()


class _ThreadCountdown(_RssCountdown):
    """A Countdown ticked from handler threads."""

    def __init__(self, total: int, checkpoints: frozenset[int]) -> None:
        super().__init__(total, checkpoints)
        self._lock = threading.Lock()

    def tick(self) -> None:
        with self._lock:
            self.count += 1
            if self.count >= self.total and self.finished is None:
                self.finished = time.perf_counter()
            if self.count in self.checkpoints:
                self.rss_kib[self.count] = _rss_kib()


#: ALK_BENCH_PYALK_MAX_RUNNING="10": the queue's max_running limit
#: (alk.set_queue_limits) before the jobs go in (limits.max_running row).
MAX_RUNNING_ENV = "ALK_BENCH_PYALK_MAX_RUNNING"


async def _enqueue(args: Args) -> float:
    from pyalk import AsyncAlk

    async with AsyncAlk(args.dsn) as alk:
        queue = alk.queue(QUEUE)
        max_running = os.environ.get(MAX_RUNNING_ENV, "").strip()
        if max_running:
            await queue.set_limits(max_running=int(max_running))
        t0 = time.perf_counter()
        for start in range(0, args.jobs, CHUNK):
            await queue.enqueue_batch({"n": i} for i in range(start, min(args.jobs, start + CHUNK)))
        return time.perf_counter() - t0


async def _process_async(args: Args, checkpoints: frozenset[int]) -> _RssCountdown:
    from pyalk import AsyncAlk, AsyncJobHandle

    countdown = _RssCountdown(args.jobs, checkpoints)

    async def noop(job: AsyncJobHandle) -> None:
        countdown.tick()

    async with AsyncAlk(args.dsn) as alk:
        worker = alk.worker(QUEUE, noop, **worker_options(args.concurrency))
        countdown.start()
        await worker.run()
    return countdown


def _process_threaded(args: Args, checkpoints: frozenset[int]) -> _RssCountdown:
    from pyalk import Alk, JobHandle

    countdown = _ThreadCountdown(args.jobs, checkpoints)

    def noop(job: JobHandle) -> None:
        countdown.tick()

    with Alk(args.dsn) as alk:
        worker = alk.worker(QUEUE, noop, **worker_options(args.concurrency))
        countdown.start()
        worker.run()
    return countdown


async def run(args: Args) -> PeerResult:
    reason = missing()
    if reason:
        raise PeerUnavailable(reason)
    variant = os.environ.get("ALK_BENCH_PYALK_VARIANT", "async")
    if variant not in VARIANTS:
        raise ValueError(f"ALK_BENCH_PYALK_VARIANT must be one of {VARIANTS}, got {variant!r}")
    from pyalk._async.worker import PREFETCH

    enqueue_s = await _enqueue(args)
    await analyze_if_asked(args.dsn)
    checkpoints = _memory_checkpoints()
    if variant == "async":
        countdown = await _process_async(args, checkpoints)
    else:
        countdown = _process_threaded(args, checkpoints)
    if countdown.count < args.jobs:
        raise RuntimeError(f"the burst worker returned after {countdown.count} of {args.jobs} jobs")
    return PeerResult(
        peer="pyalk",
        version=_pyalk_version(),
        jobs=args.jobs,
        concurrency=args.concurrency,
        enqueue_s=enqueue_s,
        process_s=countdown.elapsed,
        processed=countdown.count,
        settings={
            "worker": "AsyncWorker" if variant == "async" else "Worker (threads)",
            "pool max_connections": 4,
            "tuning": f"none: pyalk defaults (prefetch {PREFETCH}, batched settlement)",
            **{k: v for k, v in worker_options(args.concurrency).items() if k != "handle_signals"},
            **({"queue max_running": int(os.environ[MAX_RUNNING_ENV])} if os.environ.get(MAX_RUNNING_ENV) else {}),
        },
        measures={"rss_kib_after": countdown.rss_kib} if checkpoints else {},
    )


def _pyalk_version() -> str:
    """The version of the pyalk measured: the source tree's (the peers' Python
    imports it from the checkout and has no installed pyalk to ask)."""
    import pyalk

    return str(tomllib.loads((Path(pyalk.__file__).parents[1] / "pyproject.toml").read_text())["project"]["version"])


def _memory_checkpoints() -> frozenset[int]:
    """ALK_BENCH_PYALK_RSS_AT ("10000,1000000"): handler counts at which the
    memory row records the worker's RSS."""
    return frozenset(int(n) for n in os.environ.get("ALK_BENCH_PYALK_RSS_AT", "").split(",") if n.strip())


def _rss_kib() -> int:
    """The process's resident set now (not its peak), in KiB."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


# -- the listening side of the latency rows --------------------------------------


def _now_ns() -> int:
    """CLOCK_MONOTONIC: one system-wide clock for every process on the machine."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def _exit_when_stdin_closes() -> None:
    """The row ends a listener by closing its stdin."""

    def watch() -> None:
        sys.stdin.read()
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


def _emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def _listen_wake(dsn: str) -> None:
    """An idle async worker on LISTEN/NOTIFY; one line per handler start."""
    from pyalk import AsyncAlk, AsyncJobHandle

    async def handler(job: AsyncJobHandle) -> None:
        t = _now_ns()
        _emit(f"{job.payload['seq']} {t}")

    async with AsyncAlk(dsn) as alk:
        # The fallback poll is long so every wake-up in the row is a NOTIFY.
        worker = alk.worker("wake", handler, concurrency=10, poll_interval=60.0, handle_signals=False)
        task = asyncio.create_task(worker.run())
        while not worker.listening:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # its first look for work (after LISTEN) is done
        _emit("ready")
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the row closes stdin
        worker.stop()
        await task


async def _listen_bare(dsn: str, channel_sql: str) -> None:
    """The floor: a bare LISTEN on the channel, no claim or read."""
    import psycopg
    from psycopg import sql

    _exit_when_stdin_closes()
    async with (
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn,
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as advert,
    ):
        row = await (await conn.execute(channel_sql)).fetchone()  # type: ignore[arg-type]
        assert row is not None
        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(row[0])))
        # Enqueues notify advertised idle workers only, and the enqueue that
        # notifies consumes the advert (docs/design.md): the floor advertises
        # again after each notification, after its stamp.
        queue = "queue_channel" in channel_sql
        if queue:
            await advert.execute("SELECT alk.wait_for_jobs('wake', 'floor')")
        _emit("ready")
        seq = 0
        async for _notify in conn.notifies():
            t = _now_ns()
            _emit(f"{seq} {t}")
            seq += 1
            if queue:
                await advert.execute("SELECT alk.wait_for_jobs('wake', 'floor')", prepare=True)


async def _listen_claim(dsn: str) -> None:
    """The SQL floor of a wake-up: a bare LISTEN, then alk.claim on a second
    plain psycopg connection (prepared), stamped when the claim returns; no
    worker machinery. The job is acked after the stamp."""
    import psycopg
    from psycopg import sql

    _exit_when_stdin_closes()
    async with (
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as listen,
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn,
    ):
        row = await (await listen.execute("SELECT alk.queue_channel('wake')")).fetchone()
        assert row is not None
        await listen.execute(sql.SQL("LISTEN {}").format(sql.Identifier(row[0])))
        advertise = "SELECT alk.wait_for_jobs('wake', 'probe')"  # consumed by the enqueue that notifies
        await conn.execute(advertise)
        claim = "SELECT id, attempts, payload FROM alk.claim('wake', 'probe', 1)"
        for _ in range(3):
            await conn.execute(claim, prepare=True)  # prepared before the first wake
        _emit("ready")

        async def claim_and_stamp() -> None:
            jobs = await (await conn.execute(claim, prepare=True)).fetchall()
            t = _now_ns()
            for job_id, attempt, payload in jobs:
                _emit(f"{payload['seq']} {t}")
                await conn.execute("SELECT alk.ack(%s, 'probe', %s)", [job_id, attempt], prepare=True)

        while True:
            # A 1 s fallback, so a wake-up the floor's protocol could miss
            # never hangs the row (such a sample shows as a slow one).
            async for _notify in listen.notifies(timeout=1.0, stop_after=1):
                await claim_and_stamp()
            await conn.execute(advertise, prepare=True)  # after the stamp: advertise again before waiting
            # The protocol: claim once more behind the advert (an enqueue
            # that committed before it saw no advert and did not notify).
            await claim_and_stamp()


async def _listen_stream(dsn: str) -> None:
    """A stream subscription tailing 'tail'; one line per yielded event."""
    from pyalk import AsyncAlk

    _exit_when_stdin_closes()
    async with AsyncAlk(dsn) as alk, alk.stream("tail").subscribe("bench", poll_interval=60.0) as events:
        _emit("ready")
        async for event in events:
            t = _now_ns()
            _emit(f"{event.payload['seq']} {t}")


def listen_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--listen", choices=["wake", "bare-queue", "listen-claim", "stream", "bare-stream"], required=True
    )
    parser.add_argument("--dsn", required=True)
    ns = parser.parse_args(argv)
    if ns.listen == "wake":
        asyncio.run(_listen_wake(ns.dsn))
    elif ns.listen == "listen-claim":
        asyncio.run(_listen_claim(ns.dsn))
    elif ns.listen == "stream":
        asyncio.run(_listen_stream(ns.dsn))
    elif ns.listen == "bare-queue":
        asyncio.run(_listen_bare(ns.dsn, "SELECT alk.queue_channel('wake')"))
    else:
        asyncio.run(_listen_bare(ns.dsn, "SELECT alk.stream_channel('tail')"))


if __name__ == "__main__":
    if "--listen" in sys.argv:
        listen_main(sys.argv[1:])
    else:
        main(run)
