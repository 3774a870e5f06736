"""Exactly one winner: concurrent claimers on real connections never share a job."""

from __future__ import annotations

import threading
from collections import Counter

import psycopg

WORKERS = 16
JOBS = 2000


def test_every_job_is_claimed_exactly_once_by_16_concurrent_workers(db, dsn):
    db.execute("SELECT count(*) FROM alk.enqueue_batch('race', array_fill('{}'::jsonb, ARRAY[%s]))", [JOBS])
    expected = {row[0] for row in db.execute("SELECT id FROM alk.jobs WHERE queue = 'race'")}
    assert len(expected) == JOBS

    start = threading.Barrier(WORKERS)
    claimed: list[list[int]] = [[] for _ in range(WORKERS)]
    acked = [0] * WORKERS
    errors: list[BaseException] = []

    def work(index: int) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                start.wait(timeout=30)
                batch = 1 + index % 7  # mixed batch sizes, so claims overlap differently
                while True:
                    rows = conn.execute(
                        "SELECT id, attempts FROM alk.claim('race', %s, %s)", [f"w{index}", batch]
                    ).fetchall()
                    if not rows:
                        return
                    claimed[index].extend(row[0] for row in rows)
                    acked[index] += conn.execute(
                        "SELECT alk.ack_batch(%s, %s, %s)",
                        [[r[0] for r in rows], f"w{index}", [r[1] for r in rows]],
                    ).fetchone()[0]
        except BaseException as error:  # surfaced below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(WORKERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors
    counts = Counter(job_id for ids in claimed for job_id in ids)
    assert set(counts) == expected
    assert max(counts.values()) == 1  # nobody claimed a job twice
    assert sum(acked) == JOBS
    assert sum(1 for ids in claimed if ids) > 1  # the work really was shared
    assert db.execute("SELECT count(*) FROM alk.jobs").fetchone()[0] == 0


def test_concurrent_reclaim_of_lapsed_leases_has_one_winner_each(db, dsn):
    # Claim everything with a zero-second lease, then let 16 workers race for
    # the lapsed rows one second later: each row goes to exactly one of them.
    db.execute("SELECT set_config('alk.now', '1000', false)")
    db.execute("SELECT count(*) FROM alk.enqueue_batch('race', array_fill('{}'::jsonb, ARRAY[1000]),"
               " visibility_timeout_s => 0)")
    assert len(db.execute("SELECT id FROM alk.claim('race', 'first', 1000)").fetchall()) == 1000

    start = threading.Barrier(WORKERS)
    won: list[list[int]] = [[] for _ in range(WORKERS)]
    errors: list[BaseException] = []

    def work(index: int) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("SELECT set_config('alk.now', '1001', false)")
                start.wait(timeout=30)
                while rows := conn.execute("SELECT id, attempts FROM alk.claim('race', %s, 5)",
                                           [f"w{index}"]).fetchall():
                    assert all(attempts == 2 for _, attempts in rows)
                    won[index].extend(job_id for job_id, _ in rows)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(WORKERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors
    all_won = [job_id for ids in won for job_id in ids]
    assert len(all_won) == len(set(all_won)) == 1000
