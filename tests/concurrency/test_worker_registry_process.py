"""Worker processes (``python -m pyalk worker``, both forms) in the registry
of workers: a running worker is listed with its queue, pid, concurrency and
the jobs it holds; ``alk.request_stop`` from another connection makes it
drain and exit 0, and its row is gone after; and how long that takes, from
the request's commit to the process's exit, over many stops.

Synchronisation is on the worker's log lines (its stderr, at DEBUG: it logs
``listening on alk_w_...`` once its control channel is subscribed), on
alk.workers() and on the process's exit; never on sleeps.

Two times are measured per stop: until the worker learns (the wall-clock
time of its "asked this worker to stop" JSON log record, against the wall
clock when the request committed: one machine, one clock), and until its
process has exited. The second includes the interpreter's own exit, which
the worker does not control (a few hundred ms for ``pyalk``, whose command
line imports Alembic and SQLAlchemy).
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from pyalk import Alk, WorkerInfo
from tests.helpers import one, until

ROOT = Path(__file__).resolve().parents[2]
GATE = 0x616C6B_72656773  # "alk" "regs": the advisory lock the gated handlers wait on
DEADLINE = 60.0
#: Stops measured per worker form.
STOPS = 20
#: The issue's target: a worker learns of request_stop within 1 s (p99).
LEARNS_WITHIN = 1.0
#: The bound asserted on the slowest exit, on a loaded 2-core machine:
#: room for a stalled scheduler and the interpreter's exit, not for a
#: missed notification (the stop would then wait for a beat, 5 s).
SLOWEST_EXIT = 3.0

HANDLERS = {"threads": "gated", "asyncio": "gated_async"}


# the handlers, run by the worker process ------------------------------------------------


def gated(job: object) -> None:
    """Wait until the test opens the gate (a shared advisory lock it holds)."""
    with psycopg.connect(os.environ["PYALK_DSN"], autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock_shared(%s)", [GATE])


async def gated_async(job: object) -> None:
    async with await psycopg.AsyncConnection.connect(os.environ["PYALK_DSN"], autocommit=True) as conn:
        await conn.execute("SELECT pg_advisory_lock_shared(%s)", [GATE])


# the harness -------------------------------------------------------------------------------


class WorkerProcess:
    """``python -m pyalk worker`` at DEBUG, its stderr read line by line."""

    def __init__(self, dsn: str, form: str, worker_id: str, *options: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYALK_DSN": dsn}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pyalk", "worker", f"{__name__}:{HANDLERS[form]}", "--queue", "q",
             "--worker-id", worker_id, "--log-level", "DEBUG", *options],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.log: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for_line(self, fragment: str) -> str:
        end = time.monotonic() + DEADLINE
        while (left := end - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                break
            self.log.append(line)
            if fragment in line:
                return line
        raise AssertionError(f"the worker never logged {fragment!r}; it logged:\n{''.join(self.log)}")

    def finish(self) -> tuple[int, str]:
        """Wait for the exit; the exit code and stdout. Whatever stderr said
        after the last awaited line joins ``log`` (an exit code 1 is a
        one-line error there), from the reader or from communicate()."""
        out, err = self.proc.communicate(timeout=DEADLINE)
        while True:
            try:
                line = self.lines.get(timeout=DEADLINE)
            except queue.Empty:
                break
            if line is None:
                break
            self.log.append(line)
        if err:
            self.log.append(err)
        return self.proc.returncode, out

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def spawn(dsn: str) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start(form: str, worker_id: str, *options: str) -> WorkerProcess:
        process = WorkerProcess(dsn, form, worker_id, *options)
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()


@pytest.fixture
def gate(connect: Callable[..., psycopg.Connection]) -> Iterator[Callable[[], None]]:
    """Hold the gate shut; call the fixture's value to open it."""
    holder = connect()
    holder.execute("SELECT pg_advisory_lock(%s)", [GATE])
    yield lambda: holder.execute("SELECT pg_advisory_unlock_all()")
    holder.execute("SELECT pg_advisory_unlock_all()")


def listed(db: psycopg.Connection) -> list[WorkerInfo]:
    with Alk(db) as alk:
        return alk.workers()


def processing(db: psycopg.Connection) -> int:
    return int(one(db, "SELECT count(*) FROM alk.list_jobs('q', 'processing')"))


# the tests -----------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["threads", "asyncio"])
def test_a_worker_process_is_listed_and_drains_and_exits_0_on_request_stop(dsn, db, gate, spawn, form):
    with Alk(dsn) as alk:
        alk.queue("q").enqueue_batch([1, 2, 3])
    process = spawn(form, f"reg-{form}", "--concurrency", "2", "--grace", "60")
    until(lambda: processing(db) == 3, "the worker to claim the three jobs")
    # The beat (every 5 s) counts what it holds: two running, one buffered.
    until(lambda: [w.running for w in listed(db)] == [3], "a beat counting the three jobs it holds")
    [info] = listed(db)
    assert (info.worker_id, info.queue, info.pid, info.concurrency, info.stopping, info.gone) == (
        f"reg-{form}", "q", process.proc.pid, 2, False, False)
    process.wait_for_line("listening on alk_w_")
    assert one(db, "SELECT alk.request_stop(%s)", f"reg-{form}") is True
    # As on SIGTERM: claiming is over, the unstarted job goes back, the running ones may finish.
    process.wait_for_line("stopping: waiting up to 60.0s for 2 running jobs")
    assert [w.stopping for w in listed(db)] == [True]
    gate()
    code, out = process.finish()
    assert code == 0, "".join(process.log)
    assert "worker stopped: 2 acked, 0 retried, 0 failed, 0 lost, 0 left to lease expiry" in out
    assert listed(db) == []
    assert one(db, "SELECT array_agg(state || ':' || (attempts - attempts_refunded)) FROM alk.list_jobs('q')") == [
        "pending:0"]


def _percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered) + 0.5) - 1))]


@pytest.mark.parametrize("form", ["threads", "asyncio"])
def test_request_stop_latency_over_many_stops(dsn, db, spawn, form, capsys):
    learned: list[float] = []
    exited: list[float] = []
    for round_ in range(STOPS):
        worker_id = f"lat-{form}-{round_}"
        process = spawn(form, worker_id, "--log-format", "json")
        process.wait_for_line("listening on alk_w_")
        assert one(db, "SELECT alk.request_stop(%s)", worker_id) is True  # autocommit: committed on return
        committed, committed_wall = time.monotonic(), time.time()
        process.proc.wait(timeout=DEADLINE)
        exited.append(time.monotonic() - committed)
        record = json.loads(process.wait_for_line("asked this worker to stop"))
        assert "on its control channel" in record["message"]
        learned.append(max(0.0, record["time"] - committed_wall))
        code, _ = process.finish()
        assert code == 0, "".join(process.log)
        assert [w.worker_id for w in listed(db)] == []
    with capsys.disabled():
        for what, samples in (("learns", learned), ("exits", exited)):
            p50, p99, most = statistics.median(samples), _percentile(samples, 0.99), max(samples)
            print(f"\nrequest_stop -> {what}, {form} worker, {STOPS} stops: p50 {p50 * 1000:.0f} ms, "
                  f"p99 {p99 * 1000:.0f} ms, max {most * 1000:.0f} ms; "
                  f"all: {', '.join(f'{s * 1000:.0f}' for s in samples)}")
    assert _percentile(learned, 0.99) < LEARNS_WITHIN, learned
    assert max(exited) < SLOWEST_EXIT, exited


def test_percentile_picks_the_nearest_rank():
    samples = [float(i) for i in range(1, 21)]
    assert _percentile(samples, 0.5) == 10.0
    assert _percentile(samples, 0.99) == 20.0
    assert asyncio.iscoroutinefunction(gated_async)
