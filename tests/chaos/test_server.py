"""The server misbehaving under running worker processes: restarts (fast and
immediate), a long outage, pg_terminate_backend of the pool and LISTEN
connections, max_connections exhausted, and a transaction holding the xmin
horizon for a whole run. Each phase drains the queue and checks the ledger;
recovery is the time from the server accepting connections again (or the
last backend kill) to the first job start after it, reported."""

from __future__ import annotations

import contextlib
import subprocess
import time

import psycopg
import pytest

from tests.chaos.harness import check, enqueue, first_start_after, live_jobs, read_ledger, worker_summary
from tests.chaos.servers import PgServer, until


def started(ledger) -> int:
    return len(read_ledger(ledger))


def run_through(server: PgServer, chaos_dsn, ledger, spawn, disrupt) -> dict[str, object]:
    """200 short jobs through two workers, ``disrupt()`` a third of the way in
    (it returns the wall-clock instant the disruption ended)."""
    ids = enqueue(chaos_dsn, 240, seconds=0.05, visibility=2)
    spawn(chaos_dsn, "a", "--concurrency", "4")
    spawn(chaos_dsn, "b", "--concurrency", "4", handler="work_async")
    until(lambda: started(ledger) >= 60, "a third of the jobs to start")
    ended = disrupt()
    until(lambda: first_start_after(ledger, ended) is not None, "a job to start after the disruption", deadline=120)
    figures = {"recovery_s": first_start_after(ledger, ended)}
    until(lambda: live_jobs(chaos_dsn) == 0, "the queue to drain", deadline=120)
    figures.update(check(ledger, ids, chaos_dsn))
    return figures


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_server_restart(server, chaos_dsn, ledger, spawn, report, mode):
    def disrupt() -> float:
        server.restart(mode)
        return time.time()

    report.update(run_through(server, chaos_dsn, ledger, spawn, disrupt))
    assert report["recovery_s"] < 60  # type: ignore[operator]


@pytest.mark.slow
def test_long_outage(server, chaos_dsn, ledger, spawn, report):
    def disrupt() -> float:
        server.stop("immediate")
        time.sleep(8.0)  # the outage itself, not a synchronisation
        server.start()
        return time.time()

    report.update(run_through(server, chaos_dsn, ledger, spawn, disrupt))
    report["outage_s"] = 8.0


def test_pg_terminate_backend_of_pool_and_listen_connections(server, chaos_dsn, ledger, spawn, report):
    killed: list[int] = []
    per_round: list[float | None] = []

    def disrupt() -> float:
        with psycopg.connect(server.dsn(), autocommit=True) as conn:
            for _ in range(5):
                before = started(ledger)
                rows = conn.execute(
                    "SELECT pid, query LIKE 'LISTEN%%' FROM pg_stat_activity WHERE datname = 'chaos' "
                    "AND backend_type = 'client backend' AND pid <> pg_backend_pid()").fetchall()
                for pid, _ in rows:
                    conn.execute("SELECT pg_terminate_backend(%s)", [pid])
                killed.append(len(rows))
                at = time.time()
                until(lambda at=at: first_start_after(ledger, at) is not None, "a job start after a round of kills")
                per_round.append(first_start_after(ledger, at))
                report["listen_connections_killed"] = report.get("listen_connections_killed", 0) + sum(
                    1 for _, listening in rows if listening)
                until(lambda before=before: started(ledger) > before + 5, "progress after a round of kills")
        return time.time()

    report.update(run_through(server, chaos_dsn, ledger, spawn, disrupt))
    report["backends_killed"] = sum(killed)
    report["recovery_s"] = max(r for r in per_round if r is not None)  # kill round -> next job start, worst
    report["recovery_s_per_round"] = per_round
    assert report["listen_connections_killed"] >= 1, "no LISTEN connection was among the victims"


def _hog(server: PgServer) -> list[psycopg.Connection]:
    """Take every connection slot left (superuser: the reserved ones too)."""
    conns = []
    while True:
        try:
            conns.append(psycopg.connect(server.dsn(), autocommit=True))
        except psycopg.OperationalError as error:
            assert "too many clients" in str(error) or "remaining connection slots" in str(error), error
            return conns


@pytest.fixture
def few_slots(server):
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET max_connections = 16")
    server.restart("fast")
    yield server
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        conn.execute("ALTER SYSTEM RESET max_connections")
    server.restart("fast")


def test_max_connections_exhausted_under_running_workers(few_slots, chaos_dsn, ledger, spawn, report):
    ids = enqueue(chaos_dsn, 200, seconds=0.05, visibility=2)
    spawn(chaos_dsn, "a", "--concurrency", "2", "--max-connections", "2")
    spawn(chaos_dsn, "b", "--concurrency", "2", "--max-connections", "2")
    until(lambda: started(ledger) >= 30, "the workers to get going")
    hog = _hog(few_slots)
    report["slots_taken"] = len(hog)
    try:
        before = started(ledger)
        # With their connections open the workers go on; none of theirs is taken away.
        until(lambda: started(ledger) >= before + 20, "the running workers to go on while every slot is taken")
    finally:
        released = time.time()
        for conn in hog:
            conn.close()
    until(lambda: live_jobs(chaos_dsn) == 0, "the queue to drain", deadline=120)
    report.update(check(ledger, ids, chaos_dsn))
    report["first_start_after_release_s"] = first_start_after(ledger, released)


def test_a_worker_started_while_every_slot_is_taken_waits_for_one(few_slots, chaos_dsn, ledger, spawn, report):
    ids = enqueue(chaos_dsn, 20, visibility=2)
    hog = _hog(few_slots)
    late = spawn(chaos_dsn, "late", "--concurrency", "2")
    try:
        with contextlib.suppress(subprocess.TimeoutExpired):  # still running after 5 s: it waits
            late.proc.wait(5)
    finally:
        released = time.time()
        for conn in hog:
            conn.close()
    report["rc_while_full"] = late.proc.poll()
    report["log_while_full"] = late.log().strip().splitlines()[-1:] if late.log().strip() else []
    assert late.proc.poll() is None, f"the worker exited while every slot was taken: {report['log_while_full']}"
    until(lambda: live_jobs(chaos_dsn) == 0, "the late worker to drain the queue")
    report["first_start_after_release_s"] = first_start_after(ledger, released)
    report.update(check(ledger, ids, chaos_dsn))
    assert late.stop() == 0, worker_summary(late)


def _throughput(chaos_dsn, ledger, spawn, n: int, names: tuple[str, str]) -> tuple[float, list[int]]:
    ids = enqueue(chaos_dsn, n, visibility=2)
    began = time.monotonic()
    workers = [spawn(chaos_dsn, name, "--concurrency", "4") for name in names]
    until(lambda: live_jobs(chaos_dsn) == 0, "the queue to drain", deadline=180, every=0.02)
    rate = n / (time.monotonic() - began)
    for worker in workers:
        assert worker.stop() == 0
    return rate, ids


@pytest.mark.slow
def test_a_transaction_holding_the_xmin_horizon(server, chaos_dsn, ledger, spawn, report):
    n = 1500
    # A clean run first (its ids are checked below with the held run's), then the same with a
    # snapshot held open: dead row versions of alk.jobs cannot be vacuumed meanwhile.
    clean, ids = _throughput(chaos_dsn, ledger, spawn, n, ("clean-a", "clean-b"))
    with psycopg.connect(chaos_dsn) as holder:
        holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM alk.jobs")
        xmin = holder.execute("SELECT backend_xmin FROM pg_stat_activity WHERE pid = pg_backend_pid()").fetchone()
        assert xmin is not None and xmin[0] is not None
        held, more = _throughput(chaos_dsn, ledger, spawn, n, ("held-a", "held-b"))
        dead_tuples = holder.execute("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'alk.jobs'::regclass"
                                     ).fetchone()
        holder.rollback()
    report.update(check(ledger, ids + more, chaos_dsn))
    report.update(clean_jobs_per_s=round(clean), held_jobs_per_s=round(held), ratio=round(held / clean, 2),
                  dead_tuples_while_held=dead_tuples[0] if dead_tuples else None)
