"""The job storage rotating under real worker processes that are SIGKILLed,
while producers enqueue, handlers fail and are retried, and a sweeper buries
expired jobs (docs/design.md, "Job storage"): the ledger checks hold across
every rotation (tests/chaos/harness.py: nothing lost, nothing started twice
under a valid lease), only the expired jobs die, and they never start."""

from __future__ import annotations

import threading

import psycopg

from pyalk import Alk, QueueOpts
from tests.chaos.harness import check, live_jobs, read_ledger, remaining_ids
from tests.chaos.servers import until
from tests.helpers import guarded

#: Jobs the producer enqueues while the workers run, in batches of BATCH.
BATCHES, BATCH = 30, 20
#: Workers SIGKILLed one after another, each replaced.
KILLS = 3


def test_sigkilled_workers_across_rotations_with_retries_sweeps_and_enqueues(chaos_dsn, ledger, spawn, report):
    stop = threading.Event()
    errors: list[BaseException] = []
    rotations: list[str] = []
    swept: list[int] = []
    ids: list[int] = []

    def rotate(conn: psycopg.Connection) -> None:
        # min_jobs 0: rotate whenever the lock is free, live jobs moving every time.
        while not stop.wait(0.05):
            row = conn.execute("SELECT alk.rotate_jobs(0)").fetchone()
            assert row is not None
            rotations.append(row[0])

    def sweep(conn: psycopg.Connection) -> None:
        while not stop.wait(0.1):
            row = conn.execute("SELECT alk.sweep_expired('q')").fetchone()
            assert row is not None
            swept.append(row[0])

    # Never due (an hour ahead) and expired after a second: only the sweeper ends them.
    with psycopg.connect(chaos_dsn, autocommit=True) as conn:
        expiring = [row[0] for row in conn.execute(
            "SELECT alk.enqueue('q', '{}', delay => 3600, expires => 1) FROM generate_series(1, 20)")]
    background = [guarded(chaos_dsn, errors, rotate), guarded(chaos_dsn, errors, sweep)]
    for thread in background:
        thread.start()
    workers = [spawn(chaos_dsn, f"w{i}", "--concurrency", "4", handler="work_or_retry") for i in range(3)]
    with Alk(chaos_dsn) as alk:
        # No backoff: a retried job is due again at once, max_attempts well above the kills.
        queue = alk.queue("q", QueueOpts(visibility_timeout_s=2, backoff_base_s=0, max_attempts=KILLS + 5))
        kills = 0
        for batch in range(BATCHES):
            start = batch * BATCH
            ids += queue.enqueue_batch([{"n": n, "s": 0.01, "retry": n % 5 == 0} for n in range(start, start + BATCH)])
            if batch % 8 == 7 and kills < KILLS:
                done_before = len(read_ledger(ledger))
                until(lambda done_before=done_before: len(read_ledger(ledger)) >= done_before + 10,
                      "progress before a kill")
                victim = kills % len(workers)
                workers[victim].kill()
                kills += 1
                workers[victim] = spawn(chaos_dsn, f"w{victim}-{kills}", "--concurrency", "4",
                                        handler="work_or_retry")
    try:
        until(lambda: live_jobs(chaos_dsn) == 0 or bool(errors), "the queue to drain and the sweep", deadline=120)
    finally:
        stop.set()
        for thread in background:
            thread.join(30)
    assert not errors, errors
    figures = check(ledger, ids, chaos_dsn, dead_ok=True)
    assert set(remaining_ids(chaos_dsn)) == set(expiring), "only the expired jobs may be left, and dead"
    starts = read_ledger(ledger, settled=True)
    assert not {s.id for s in starts} & set(expiring), "an expired job started"
    raised = [s for s in starts if s.raised]
    assert raised, "no handler raised: the retry path was not exercised"
    assert all(any(s.id == r.id and s.attempt > r.attempt for s in starts) for r in raised), \
        "a retried job did not run again"
    assert kills == KILLS
    assert rotations.count("rotated") >= 3, rotations[-20:]
    figures.update(kills=kills, rotated=rotations.count("rotated"), locked=rotations.count("locked"),
                   swept=sum(swept), retried=len(raised))
    report.update(figures)
