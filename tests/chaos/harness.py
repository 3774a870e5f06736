"""Worker processes, producers and the ledger checks every chaos phase makes.

The checks, over the handlers' ledger (tests/chaos/handlers.py) and the
server's rows once the queue has drained:

- no job lost: every enqueued id was started and is gone (acked), or is dead
  where the phase says so;
- no job started twice under a valid lease: a later start of the same job
  must come after the lease end the earlier claim returned (unless the
  earlier start raised: its retry ended the lease, and only then was the job
  pending to claim again), and no claim (id, attempt) starts twice.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from pyalk import Alk, QueueOpts
from tests.helpers import until

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Start:
    id: int
    attempt: int
    worker: str
    pid: int
    start: float
    expires: int
    raised: bool = False  # the handler raised: the worker retries the job, which ends this lease


class WorkerProcess:
    """``python -m pyalk worker tests.chaos.handlers:<handler>``; stderr to a file."""

    def __init__(self, dsn: str, ledger: Path, name: str, *options: str, handler: str = "work") -> None:
        self.name = name
        self.stderr_path = ledger.parent / f"{name}.stderr"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "CHAOS_LEDGER": str(ledger)}
        self.stderr = open(self.stderr_path, "a")  # noqa: SIM115 (closed by stop(); the child writes to it)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pyalk", "worker", f"tests.chaos.handlers:{handler}", "--queue", "q",
             "--dsn", dsn, "--worker-id", name, "--poll-interval", "1", "--grace", "5", *options],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=self.stderr, text=True)

    def log(self) -> str:
        return self.stderr_path.read_text()

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.proc.wait(30)

    def started(self) -> bool:
        """The worker has trapped its signals (it logs "worker started" right
        after), or has already exited."""
        return self.proc.poll() is not None or "worker started" in self.log()

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM once the worker traps it (a SIGTERM during start-up kills
        the interpreter: -15), then wait for the exit; the return code."""
        until(self.started, f"worker {self.name} to start", deadline=timeout)
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self.stderr.close()


def enqueue(dsn: str, n: int, seconds: float = 0.0, visibility: int = 2, start: int = 0,
            max_attempts: int | None = None) -> list[int]:
    with Alk(dsn) as alk:
        queue = alk.queue("q", QueueOpts(visibility_timeout_s=visibility, max_attempts=max_attempts))
        return queue.enqueue_batch([{"n": i, "s": seconds} for i in range(start, start + n)])


def live_jobs(dsn: str) -> int | None:
    """Jobs of queue q not yet done (pending or processing); None while the server is away."""
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=2) as conn:
            row = conn.execute("SELECT count(*) FROM alk.jobs WHERE queue = 'q' AND state <> 'dead'").fetchone()
            return int(row[0]) if row else 0
    except psycopg.OperationalError:
        return None


def remaining_ids(dsn: str) -> dict[int, str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return dict(conn.execute("SELECT id, state FROM alk.jobs WHERE queue = 'q'").fetchall())


def jsonl_records(path: Path, settled: bool = False) -> list[dict[str, Any]]:
    """The complete lines of a JSON-lines file other processes append to.

    Each line is one ``write``, so a SIGKILL cuts none, but a read beside a
    write can see part of it (the copy into the page cache is not atomic for
    readers): while writers run, a last line without its newline is a write in
    flight and is left for the next read. Once they have stopped (``settled``)
    such a line is an error, never skipped."""
    if not path.exists():
        return []
    *lines, tail = path.read_text().split("\n")
    assert not (settled and tail), f"{path}: an unterminated line after its writers stopped: {tail!r}"
    return [json.loads(line) for line in lines if line.strip()]


def read_ledger(ledger: Path, settled: bool = False) -> list[Start]:
    starts = [Start(**record) for path in ledger.glob("*.jsonl") for record in jsonl_records(path, settled)]
    return sorted(starts, key=lambda s: s.start)


def check(ledger: Path, enqueued: list[int], dsn: str, dead_ok: bool = False) -> dict[str, Any]:
    """The phase's invariants; returns its counts for the report."""
    starts = read_ledger(ledger, settled=True)
    left = remaining_ids(dsn)
    assert all(state == "dead" for state in left.values()) or not left, f"jobs not done: {left}"
    if not dead_ok:
        assert not left, f"jobs died: {sorted(left)}"
    by_id: dict[int, list[Start]] = defaultdict(list)
    for s in starts:
        by_id[s.id].append(s)
    lost = [job_id for job_id in enqueued if job_id not in by_id and job_id not in left]
    assert not lost, f"{len(lost)} jobs gone without ever starting: {lost[:20]}"
    never_started = [job_id for job_id in enqueued if job_id not in by_id]
    assert not never_started, f"{len(never_started)} jobs never started: {never_started[:20]}"
    twice = []
    for job_id, runs in by_id.items():
        claims = [(s.attempt, s.worker) for s in runs]
        assert len({s.attempt for s in runs}) == len(runs), f"job {job_id}: one claim started twice: {claims}"
        for earlier, later in itertools.pairwise(runs):
            if later.start < earlier.expires and not earlier.raised:
                twice.append((job_id, earlier, later))
    assert not twice, f"jobs started again while an earlier lease was valid: {twice[:5]}"
    return {"enqueued": len(enqueued), "starts": len(starts), "reruns": len(starts) - len(by_id),
            "dead": len(left), "lost": 0, "double_starts": 0}


def first_start_after(ledger: Path, instant_wall: float) -> float | None:
    """Seconds from ``instant_wall`` (time.time()) to the first job start after it."""
    later = [s.start for s in read_ledger(ledger) if s.start >= instant_wall]
    return round(min(later) - instant_wall, 3) if later else None


def worker_summary(process: WorkerProcess) -> str:
    lines = [line for line in process.log().splitlines() if "worker stopped:" in line]
    return lines[-1].split("worker stopped:", 1)[1].strip() if lines else ""
