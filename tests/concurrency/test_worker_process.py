"""Worker processes (``python -m pyalk worker``) killed and stopped from
outside: SIGKILL mid-job (the jobs come back after their lease and run once
more, at attempt 2), SIGTERM (stop claiming, finish what runs, exit 0), a
grace period that runs out, and a second signal; and an idle worker of a
queue at max_running woken by the ack that frees a slot.

The handlers below run in the worker process. Each records that it started
(a row in public.started) and then waits on a gate: a shared advisory lock
the test holds exclusively. Synchronisation is on those rows, the job rows,
the worker's log lines on its stderr pipe and the gate; never on sleeps.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pyalk import Alk, JobHandle, QueueOpts
from tests.helpers import until

ROOT = Path(__file__).resolve().parents[2]
GATE = 0x616C6B_67617465  # "alk" "gate": the advisory lock key the handlers wait on
DEADLINE = 60.0


# the handler, run by the worker process ----------------------------------------------


def gated(job: JobHandle) -> None:
    """Record the start, then wait until the test opens the gate."""
    with psycopg.connect(os.environ["PYALK_DSN"], autocommit=True) as conn:
        conn.execute("INSERT INTO public.started (job_id, attempt, pid) VALUES (%s, %s, %s)",
                     [job.id, job.job.attempts, os.getpid()])
        conn.execute("SELECT pg_advisory_lock_shared(%s)", [GATE])
        conn.execute("SELECT pg_advisory_unlock_shared(%s)", [GATE])


# the harness ------------------------------------------------------------------------------


class WorkerProcess:
    """``python -m pyalk worker`` on the gated handler, its stderr read line by line."""

    def __init__(self, dsn: str, *options: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYALK_DSN": dsn}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pyalk", "worker", f"{__name__}:gated", "--queue", "q", *options],
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
        out, _ = self.proc.communicate(timeout=DEADLINE)
        return self.proc.returncode, out

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def gate(db: psycopg.Connection, connect: Callable[..., psycopg.Connection]) -> Iterator[Callable[[], None]]:
    """Hold the gate shut; call the fixture's value to open it."""
    db.execute("CREATE TABLE public.started (job_id bigint, attempt int, pid int)")
    holder = connect()
    holder.execute("SELECT pg_advisory_lock(%s)", [GATE])
    opened = False

    def open_gate() -> None:
        nonlocal opened
        if not opened:
            holder.execute("SELECT pg_advisory_unlock(%s)", [GATE])
            opened = True

    yield open_gate
    open_gate()


@pytest.fixture
def spawn(dsn: str) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start(*options: str) -> WorkerProcess:
        process = WorkerProcess(dsn, *options)
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()


def started(db: psycopg.Connection) -> list[tuple[int, int]]:
    return db.execute("SELECT job_id, attempt FROM public.started ORDER BY job_id").fetchall()


def backends(db: psycopg.Connection) -> set[int]:
    """The client backends connected to the test database."""
    return {row[0] for row in db.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND backend_type = 'client backend'")}


def job_states(db: psycopg.Connection) -> dict[int, tuple[str, int]]:
    # Attempts spent: a released claim (never started) is refunded.
    return {row[0]: (row[1], row[2]) for row in db.execute(
        "SELECT id, state, attempts - attempts_refunded FROM alk.list_jobs('q')")}


def enqueue(dsn: str, n: int, **opts: Any) -> list[int]:
    with Alk(dsn) as alk:
        return alk.queue("q", QueueOpts(**opts)).enqueue_batch(list(range(n)))


# the tests ------------------------------------------------------------------------------------


def test_a_killed_workers_jobs_run_again_after_their_lease(dsn, db, gate, spawn):
    ids = enqueue(dsn, 5, visibility_timeout_s=2)
    ours = backends(db)
    process = spawn("--concurrency", "3")
    until(lambda: len(started(db)) == 3, "three handlers to start")
    process.proc.send_signal(signal.SIGKILL)
    process.proc.wait()
    gate()  # lets the orphaned backends' lock waits end; the jobs stay leased
    # A claim the dead worker sent just before the kill still commits in its orphaned backend:
    # read who holds what only once every backend it opened is gone.
    until(lambda: backends(db) <= ours, "the dead worker's backends to exit")
    # Held by the dead worker: the jobs it started, and those it claimed ahead (prefetch).
    killed = {job_id for job_id, state in job_states(db).items() if state == ("processing", 1)}
    assert {job_id for job_id, _ in started(db)} <= killed

    handled: list[tuple[int, int]] = []
    guard = threading.Lock()

    def record(job: JobHandle) -> None:
        with guard:
            handled.append((job.id, job.job.attempts))

    with Alk(dsn) as alk:
        worker = alk.worker("q", record, concurrency=4, handle_signals=False)
        thread = threading.Thread(target=worker.run)
        thread.start()
        try:
            until(lambda: job_states(db) == {}, "every job to be done")
        finally:
            worker.stop()
            thread.join(30)
    assert sorted(handled) == sorted((job_id, 2 if job_id in killed else 1) for job_id in ids)
    assert worker.counts.acked == 5 and worker.counts.lost == 0


def test_sigterm_stops_claiming_and_lets_running_jobs_finish(dsn, db, gate, spawn):
    ids = enqueue(dsn, 5)
    process = spawn("--concurrency", "2", "--grace", "60")
    until(lambda: len(started(db)) == 2, "two handlers to start")
    process.proc.send_signal(signal.SIGTERM)
    # The claim loop has ended once the worker waits for its running jobs.
    process.wait_for_line("stopping: waiting up to 60.0s for 2 running jobs")
    gate()
    code, out = process.finish()
    assert code == 0
    assert "worker stopped: 2 acked, 0 retried, 0 failed, 0 lost, 0 left to lease expiry" in out
    done = {job_id for job_id, _ in started(db)}
    assert job_states(db) == {job_id: ("pending", 0) for job_id in ids if job_id not in done}


def test_after_the_grace_period_the_worker_exits_and_leaves_running_jobs_to_their_lease(dsn, db, gate, spawn):
    enqueue(dsn, 3)
    process = spawn("--concurrency", "2", "--grace", "0.3")
    until(lambda: len(started(db)) == 2, "two handlers to start")
    process.proc.send_signal(signal.SIGTERM)
    code, out = process.finish()  # while the handlers are still behind the gate
    assert code == 0
    assert "2 left to lease expiry" in out
    running = {job_id for job_id, _ in started(db)}
    states = job_states(db)
    assert {states[job_id] for job_id in running} == {("processing", 1)}
    assert sorted(state for job_id, state in states.items() if job_id not in running) == [("pending", 0)]


def test_a_second_signal_stops_at_once(dsn, db, gate, spawn):
    enqueue(dsn, 2)
    process = spawn("--concurrency", "2", "--grace", "600")
    until(lambda: len(started(db)) == 2, "two handlers to start")
    process.proc.send_signal(signal.SIGINT)
    process.wait_for_line("stopping: waiting up to 600.0s for 2 running jobs")
    process.proc.send_signal(signal.SIGINT)
    code, out = process.finish()
    assert code == 0
    assert "2 left to lease expiry" in out
    assert {state for state in job_states(db).values()} == {("processing", 1)}


def asleep(db: psycopg.Connection) -> bool:
    """The worker advertised itself idle and its last statement was next_claim_at: it waits."""
    return bool(db.execute(
        "SELECT EXISTS (SELECT FROM alk.idle_workers WHERE queue = 'q')"
        " AND EXISTS (SELECT FROM pg_stat_activity WHERE datname = current_database() AND state = 'idle'"
        " AND query LIKE '%alk.next_claim_at(%')").fetchone()[0])  # type: ignore[index]


def test_an_ack_that_frees_a_max_running_slot_wakes_the_idle_worker(dsn, db, gate, spawn):
    """max_running 1, its slot held by this test: the worker claims nothing
    and sleeps until next_claim_at, an hour away (the lease, and a fallback
    poll as long). The test's ack frees the slot and wakes it (0032): it
    claims the job that waited, long before that hour."""
    db.execute("SELECT alk.set_queue_limits('q', max_running => 1)")
    first, second = enqueue(dsn, 2, visibility_timeout_s=3600)
    [(held, attempt)] = db.execute("SELECT id, attempts FROM alk.claim('q', 'test', 1)").fetchall()
    assert held == first
    spawn("--concurrency", "1", "--poll-interval", "3600")
    until(lambda: asleep(db), "the worker to wait idle until next_claim_at")
    assert started(db) == []
    assert db.execute("SELECT alk.ack(%s, 'test', %s)", [held, attempt]).fetchone() == (True,)
    until(lambda: started(db) == [(second, 1)], "the woken worker to claim the job behind the freed slot")
