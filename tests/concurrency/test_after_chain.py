"""A chain of 1,000 jobs (each enqueued after the one before, alk.enqueue's
after) run by two worker processes (``python -m pyalk worker``, concurrency 4
each): every job runs once, strictly in chain order, never two at once.

The handler runs in the worker processes and records its start and end in
public.ran; the test waits on those rows, never on sleeps.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
from pathlib import Path

import psycopg

from pyalk import JobHandle
from tests.helpers import until

ROOT = Path(__file__).resolve().parents[2]
LINKS = 1000
DEADLINE = 240.0


def record(job: JobHandle) -> None:
    """Record the run: its start, then its end (server clock)."""
    with psycopg.connect(os.environ["PYALK_DSN"], autocommit=True) as conn:
        conn.execute("INSERT INTO public.ran (job_id, link, started) VALUES (%s, %s, clock_timestamp())",
                     [job.id, job.payload])
        conn.execute("UPDATE public.ran SET ended = clock_timestamp() WHERE job_id = %s", [job.id])


def test_two_worker_processes_run_a_chain_of_1000_jobs_in_order(dsn, db):
    db.execute("CREATE TABLE public.ran (job_id bigint PRIMARY KEY, link bigint, started timestamptz,"
               " ended timestamptz)")
    ids = [db.execute("SELECT alk.enqueue('q', '0')").fetchone()[0]]  # type: ignore[index]
    for link in range(1, LINKS):
        ids.append(db.execute("SELECT alk.enqueue('q', %s::jsonb, after => %s)",
                              [str(link), [ids[-1]]]).fetchone()[0])  # type: ignore[index]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYALK_DSN": dsn}
    workers = [subprocess.Popen([sys.executable, "-m", "pyalk", "worker", f"{__name__}:record", "--queue", "q",
                                 "--concurrency", "4"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL) for _ in range(2)]
    try:
        until(lambda: db.execute("SELECT count(*) FROM alk.jobs").fetchone()[0] == 0,  # type: ignore[index]
              "the chain drained", DEADLINE)
    finally:
        for proc in workers:
            proc.send_signal(signal.SIGTERM)
        for proc in workers:
            proc.wait(timeout=60)
    rows = db.execute("SELECT job_id, link, started, ended FROM public.ran ORDER BY started").fetchall()
    assert [r[0] for r in rows] == ids  # each once, in chain order
    assert [r[1] for r in rows] == list(range(LINKS))
    # Never two at once: each link started after the one before had ended.
    assert all(later[2] >= earlier[3] for earlier, later in itertools.pairwise(rows))
