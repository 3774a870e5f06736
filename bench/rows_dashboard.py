"""The dashboard's rows (docs/dashboard.md): what the overview's queries cost
on a big database, whether a dashboard refreshing every second slows the
workers, and what the throughput counter costs the settle path."""

from __future__ import annotations

import json
import os
import re
import socket
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any, LiteralString

import psycopg

from bench.registry import Context, Row, RowResult, row

QUEUES = 10
STREAMS = 5

#: The overview's statements, as pyalk/dashboard/data.py sends them (its
#: EXACT_LIMIT restated: the bench runs without the dashboard extra).
OVERVIEW: tuple[LiteralString, ...] = (
    "SELECT * FROM alk.queue_stats(exact_limit => 1000)",
    "SELECT * FROM alk.queue_throughput()",
    "SELECT * FROM alk.stream_stats()",
    "SELECT * FROM alk.stream_consumer_lag()",
    "SELECT * FROM alk.schedule_overview()",
    "SELECT * FROM alk.list_locks()",
)

#: Everything one overview page load sends, in order: the clock (Data.now's
#: statement), the overview's reads, and the action check every page makes
#: for a role that may act (Data.allowed over data.ACTIONS). Restated rather
#: than imported so the bench runs without the dashboard extra.
OVERVIEW_PAGE: tuple[LiteralString, ...] = (
    "SELECT floor(extract(epoch FROM clock_timestamp()))::bigint AS now",
    *OVERVIEW,
    "SELECT coalesce(has_function_privilege(to_regprocedure('alk.requeue_dead(text, bigint[])'), 'EXECUTE'), false) "
    "AS requeue, coalesce(has_function_privilege(to_regprocedure('alk.cancel(text, bigint)'), 'EXECUTE'), false) "
    "AS cancel, coalesce(has_function_privilege(to_regprocedure('alk.pause_queue(text)'), 'EXECUTE'), false) AS pause, "
    "coalesce(has_function_privilege(to_regprocedure('alk.resume_queue(text)'), 'EXECUTE'), false) AS resume",
)

#: Not sent by the page: a bare index-only count(*) of every entry of the
#: three partial indexes, per queue, the floor any exact count pays. The
#: states are literals: a partial index serves only a predicate it implies.
FLOOR: LiteralString = """
    SELECT sum((SELECT count(*) FROM alk.jobs j WHERE j.queue = q.queue AND j.state = 'pending')
             + (SELECT count(*) FROM alk.jobs j WHERE j.queue = q.queue AND j.state = 'processing')
             + (SELECT count(*) FROM alk.jobs j WHERE j.queue = q.queue AND j.state = 'dead'))
      FROM (SELECT 'queue-' || g AS queue FROM generate_series(0, 9) g) q  -- QUEUES"""

#: Not sent by the page either: every count exact, what the overview cost
#: before it estimated past its exact limit.
EXACT: LiteralString = "SELECT * FROM alk.queue_stats()"
NOT_SENT: tuple[LiteralString, ...] = (FLOOR, EXACT)


def _fill(conn: psycopg.Connection, jobs: int, events: int) -> None:
    """jobs spread over QUEUES queues (80 % ready, 10 % scheduled, 5 %
    processing, 5 % dead), events over STREAMS streams with two consumers
    each, schedules, locks and an hour of throughput counters. The jobs are
    written straight into the table: this is the data, not the thing measured."""
    now = int(conn.execute("SELECT alk.now()").fetchone()[0])  # type: ignore[index]
    # The hour of counters first, by real settles under each minute's pinned
    # clock (one job per queue and minute), before the filled jobs could be claimed.
    conn.execute("""DO $$ DECLARE m int; q int; clock bigint := alk.now(); BEGIN
        FOR m IN 0..59 LOOP FOR q IN 0..9 LOOP
            PERFORM set_config('alk.now', (clock - (59 - m) * 60)::text, true);
            PERFORM alk.enqueue('queue-' || q, '{}');
            PERFORM alk.ack(c.id, 'seeder', c.attempts) FROM alk.claim('queue-' || q, 'seeder', 1) c;
        END LOOP; END LOOP; END $$""")
    conn.execute("RESET alk.now")  # the DO block pinned it per minute
    conn.execute("""
        INSERT INTO alk.jobs (queue, state, payload, priority, run_at, attempts, max_attempts, worker_id, claimed_at,
                              claim_expires_at, created_at, visibility_timeout_s, backoff_base_s, last_error, died_at)
        SELECT 'queue-' || (i %% %(queues)s),
               CASE WHEN k %% 20 = 0 THEN 'processing' WHEN k %% 20 = 1 THEN 'dead' ELSE 'pending' END,
               jsonb_build_object('n', i, 'to', 'user' || i || '@example.com'),
               i %% 3, CASE WHEN k %% 10 = 2 THEN %(now)s + 3600 + i %% 600 ELSE %(now)s - i %% 600 END,
               CASE WHEN k %% 20 IN (0, 1) THEN 1 ELSE 0 END, 3,
               CASE WHEN k %% 20 IN (0, 1) THEN 'w' END, CASE WHEN k %% 20 IN (0, 1) THEN %(now)s - 10 END,
               CASE WHEN k %% 20 = 0 THEN %(now)s + 290 - i %% 600 END, %(now)s - 1000, 300, 5,
               CASE WHEN k %% 20 = 1 THEN 'boom' END, CASE WHEN k %% 20 = 1 THEN %(now)s - 5 END
          -- k: the job's number within its queue, so every queue holds the same mix of states
          FROM generate_series(1, %(jobs)s) i, LATERAL (SELECT i / %(queues)s AS k) n""",
                 {"queues": QUEUES, "jobs": jobs, "now": now})
    for s in range(STREAMS):
        stream = f"stream-{s}"
        conn.execute("SELECT count(*) FROM alk.publish_batch(%s, (SELECT array_agg(jsonb_build_object('i', i)) "
                     "FROM generate_series(1, %s) i))", [stream, events // STREAMS])
        conn.execute("SELECT alk.save_offset(%s, 'billing', %s), alk.save_offset(%s, 'audit', %s)",
                     [stream, events // STREAMS, stream, events // STREAMS // 2])
    conn.execute("SELECT alk.schedule('s' || i, '*/5 * * * *', 'queue-' || (i % 10)) FROM generate_series(1, 20) i")
    conn.execute("SELECT alk.try_lock('lock-' || i, 'owner', 600) FROM generate_series(1, 20) i")
    # What autovacuum does to a real queue table: without it the visibility
    # map is unset, every index-only scan fetches the heap (and the first
    # reads set hint bits): 1.2-2.3 s instead of ~0.1 s for queue_stats.
    conn.execute("VACUUM (ANALYZE) alk.jobs")
    conn.execute("VACUUM (ANALYZE) alk.stream_events")


@row(
    "dashboard.overview",
    "latency",
    "Dashboard overview queries on a big database",
    "Every statement one overview page load sends, timed on 10^6 jobs in 10 queues and 10^5 stream events "
    "(10^4 and 10^3 in --quick), vacuumed as autovacuum would: 15 page loads after a warm-up, p50 and max per "
    "statement and per load; beside it the floor, a bare index-only count of the same index entries.",
)
def overview_row(ctx: Context) -> RowResult:
    started = time.perf_counter()
    jobs, events = (10_000, 1_000) if ctx.mode.quick else (1_000_000, 100_000)
    loads = 15
    timings: dict[str, list[float]] = {query: [] for query in (*OVERVIEW_PAGE, *NOT_SENT)}
    totals: list[float] = []
    counts: dict[str, int] = {}
    with ctx.server.fresh_db("alk_bench_dash", floor=False) as db, \
            psycopg.connect(ctx.server.dsn_for(db), autocommit=True) as conn, \
            psycopg.connect(ctx.server.dsn_for(db), autocommit=True,
                            options="-c enable_seqscan=off -c enable_bitmapscan=off") as floor_conn:
        ctx.progress.start("filling", total=loads + 1)
        _fill(conn, jobs, events)
        def run(query: LiteralString) -> int:
            # The floor on its own connection, held to index-only scans.
            return len((floor_conn if query is FLOOR else conn).execute(query).fetchall())

        for query in (*OVERVIEW_PAGE, *NOT_SENT):
            run(query)  # warm-up: the same cache state every load sees
        ctx.progress.advance()
        load_before = os.getloadavg()
        for _ in range(loads):
            total = 0.0
            for query in (*OVERVIEW_PAGE, *NOT_SENT):  # one page load, in the page's order, then the floor
                t0 = time.perf_counter()
                counts[query] = run(query)
                took = (time.perf_counter() - t0) * 1000
                timings[query].append(took)
                total += 0.0 if query in NOT_SENT else took
            totals.append(total)
            ctx.progress.advance()
        load_after = os.getloadavg()

    def record(statement: str, rows: int | None, samples: list[float]) -> dict[str, Any]:
        return {"statement": statement, "rows": rows, "p50 ms": round(statistics.median(samples), 2),
                "max ms": round(max(samples), 2)}

    records = [record(" ".join(query.split())[:90], counts[query], timings[query]) for query in OVERVIEW_PAGE]
    records.append(record("one overview page load (sum of the above)", None, totals))
    records.append(record("floor, not sent: bare index-only count(*) of the same entries", None, timings[FLOOR]))
    records.append(record("not sent: alk.queue_stats() with every count exact", counts[EXACT], timings[EXACT]))
    queue_stats = statistics.median(timings[OVERVIEW[0]])
    exact = statistics.median(timings[EXACT])
    return RowResult(
        key="dashboard.overview", title="Dashboard overview queries on a big database", status="ok",
        columns=["statement", "rows", "p50 ms", "max ms"], records=records,
        notes=[f"{jobs} jobs in {QUEUES} queues (each 80 % ready, 10 % scheduled, 5 % processing, 5 % dead), "
               f"{events} events in {STREAMS} streams, 20 schedules, 20 locks, an hour of counters; "
               "VACUUM (ANALYZE) after the fill, as autovacuum would on a real queue table (without it every "
               "index-only scan reads the heap). "
               "The page counts each queue's states exactly up to 1,000 and shows the planner's estimate past it "
               "(the dashboard's exact limit); every count exact is the last row. "
               f"Exact alk.queue_stats / floor = {exact / statistics.median(timings[FLOOR]):.2f}, "
               f"the page's alk.queue_stats / exact = {queue_stats / exact:.2f}. "
               f"{loads} page loads; load average {load_before[0]:.2f} before, {load_after[0]:.2f} after "
               f"({os.cpu_count()} cores)."],
        seconds=time.perf_counter() - started)


def _drain(dsn: str, options: str, stop: threading.Event, counts: list[int], index: int) -> None:
    with psycopg.connect(dsn, autocommit=True, options=options) as conn:
        worker = f"w{index}"
        while not stop.is_set():
            claimed = conn.execute("SELECT id, attempts FROM alk.claim('work', %s, 10)", [worker]).fetchall()
            if not claimed:
                continue
            conn.execute("SELECT alk.ack_batch(%s, %s, %s, 'work')",
                         [[r[0] for r in claimed], worker, [r[1] for r in claimed]])
            counts[index] += len(claimed)


def _throughput(dsn: str, options: str, clients: int, seconds: float, dashboard: Callable[[], None] | None) -> float:
    stop = threading.Event()
    counts = [0] * clients
    threads = [threading.Thread(target=_drain, args=(dsn, options, stop, counts, i)) for i in range(clients)]
    if dashboard is not None:
        threads.append(threading.Thread(target=_refresh_every_second, args=(dashboard, stop)))
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    return sum(counts) / seconds


def _refresh_every_second(refresh: Callable[[], None], stop: threading.Event) -> None:
    while not stop.is_set():
        t0 = time.monotonic()
        refresh()
        stop.wait(max(0.0, 1.0 - (time.monotonic() - t0)))


@row(
    "dashboard.no_interference",
    "latency",
    "Worker throughput with the dashboard refreshing every second",
    "claim 10 + ack_batch throughput of 2 clients on a 10^5-job queue (10^4 in --quick) beside 10^5 other jobs: "
    "alone, with the dashboard's statements every second, and with the real dashboard (pyalk dashboard in its own "
    "process; the overview, its fragment and the queue page fetched every second), interleaved in rotated order "
    "over 7 rounds: per round each setup's jobs/s over that round's alone, then the median ratio and its spread.",
)
def no_interference_row(ctx: Context) -> RowResult:
    import subprocess
    import sys
    import urllib.request

    import psutil

    started = time.perf_counter()
    backlog, seconds, rounds = (10_000, 2.0, 2) if ctx.mode.quick else (100_000, 6.0, 7)
    setups = ("workers alone", "+ the dashboard's SQL every 1 s", "+ pyalk dashboard, 3 pages every 1 s")
    rates: dict[str, list[float]] = {name: [] for name in setups}
    drained: list[str] = []  # runs that emptied the backlog: their rate is a lower bound
    with ctx.server.fresh_db("alk_bench_dash", floor=False) as db:
        dsn = ctx.server.dsn_for(db)
        with psycopg.connect(dsn, autocommit=True) as conn:
            _fill(conn, 100_000 if not ctx.mode.quick else 5_000, 1_000)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dashboard = subprocess.Popen([sys.executable, "-m", "pyalk", "dashboard", "--dsn", dsn, "--port", str(port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        process = psutil.Process(dashboard.pid)
        dashboard_cpu: list[float] = []
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(base + "/", timeout=5).read()
                break
            except OSError:
                if time.monotonic() > deadline or dashboard.poll() is not None:
                    raise
                time.sleep(0.1)

        def pages() -> None:
            for path in ("/", "/fragments/overview", "/queue?name=work"):
                with urllib.request.urlopen(base + path, timeout=10) as response:
                    response.read()

        sql_conn = psycopg.connect(dsn, autocommit=True)

        def statements() -> None:
            for query in (*OVERVIEW, *OVERVIEW):  # the overview and its fragment
                sql_conn.execute(query).fetchall()
            sql_conn.execute("SELECT * FROM alk.queue_stats('work', 1000)").fetchall()
            sql_conn.execute("SELECT * FROM alk.browse_jobs('work', 'pending', 51)").fetchall()

        refreshers: dict[str, Callable[[], None] | None] = dict(zip(setups, (None, statements, pages), strict=True))
        load_before = os.getloadavg()
        try:
            ctx.progress.start("rounds", total=rounds * len(setups))
            for r in range(rounds):
                # Rotated each round: a machine that slows down over the run biases no setup.
                for name in setups[r % len(setups):] + setups[:r % len(setups)]:
                    with psycopg.connect(dsn, autocommit=True) as conn:
                        conn.execute("SELECT count(*) FROM alk.enqueue_batch('work', (SELECT array_agg("
                                     "jsonb_build_object('n', i)) FROM generate_series(1, %s) i))", [backlog])
                        conn.execute("VACUUM ANALYZE alk.jobs")
                    cpu_before = sum(process.cpu_times()[:2])
                    rates[name].append(_throughput(dsn, ctx.session_options, 2, seconds, refreshers[name]))
                    with psycopg.connect(dsn, autocommit=True) as conn:
                        if not conn.execute("SELECT EXISTS (SELECT FROM alk.jobs WHERE queue = 'work' "
                                            "AND state = 'pending')").fetchone()[0]:  # type: ignore[index]
                            drained.append(f"{name} (round {r + 1})")
                    if refreshers[name] is pages:
                        dashboard_cpu.append((sum(process.cpu_times()[:2]) - cpu_before) / seconds)
                    with psycopg.connect(dsn, autocommit=True) as conn:
                        conn.execute("DELETE FROM alk.jobs WHERE queue = 'work'")
                    ctx.progress.advance()
        finally:
            sql_conn.close()
            dashboard.terminate()
            dashboard.wait(10)
    load_after = os.getloadavg()
    # Paired per round: a setup against the alone run beside it in time, so
    # the machine's drift over the run cancels out of each ratio.
    ratios = {name: [x / a for x, a in zip(rates[name], rates[setups[0]], strict=True)] for name in setups}
    records = [{"setup": name, "jobs/s p50": round(statistics.median(rates[name])),
                "vs alone p50": f"{statistics.median(ratios[name]):.3f}",
                "vs alone min-max": f"{min(ratios[name]):.2f}-{max(ratios[name]):.2f}"} for name in setups]
    return RowResult(
        key="dashboard.no_interference", title="Worker throughput with the dashboard refreshing every second",
        status="ok", columns=["setup", "jobs/s p50", "vs alone p50", "vs alone min-max"], records=records,
        notes=[f"{rounds} interleaved rounds of {seconds:g} s each, load average {load_before[0]:.2f} before and "
               f"{load_after[0]:.2f} after ({os.cpu_count()} cores); every round's jobs/s: "
               + "; ".join(f"{name}: {json.dumps([round(x) for x in rates[name]])}" for name in setups)
               + f". The dashboard process used {statistics.median(dashboard_cpu):.0%} of a core while refreshing. "
               "Workers, server and dashboard share the machine's 2 cores: CPU the dashboard takes shows "
               "here too, not only locks (the dashboard's reads are single alk.* snapshot reads in autocommit: "
               "AccessShareLock only, which no claim, settle or enqueue waits for). "
               + (f"The backlog ran out in {', '.join(drained)}: those rates are lower bounds."
                  if drained else "No run emptied the backlog.")],
        seconds=time.perf_counter() - started)


#: The counting CTE of alk._settle's two statements (sql/queue/50_settle.sql): the
#: counter upsert (its insert trigger prunes), up to the statement's main SELECT.
_COUNTING = re.compile(r"\), counted AS \(.*?RETURNING c\.queue\s*\)", re.S)


def _uncounted_settle(conn: psycopg.Connection) -> None:
    """alk_bench._settle: alk._settle as installed, its counting CTEs cut
    out; everything else (plans, the fast path) is the real one. Same name,
    another schema: the body qualifies its arguments by the function's name."""
    # By name, whatever its signature grew since (results in 0026, wake in 0033).
    source = str(conn.execute("SELECT pg_get_functiondef(p.oid) FROM pg_proc p WHERE p.proname = '_settle'"
                              " AND p.pronamespace = 'alk'::regnamespace").fetchone()[0])  # type: ignore[index]
    cut, n = _COUNTING.subn(")", source)
    assert n == 2 and "queue_counts" not in cut, "alk._settle no longer has the two counting CTEs this row cuts"
    conn.execute("CREATE SCHEMA alk_bench")
    conn.execute(cut.replace("alk._settle(", "alk_bench._settle(", 1))


def _settle_rate(dsn: str, options: str, clients: int, jobs: int, batch: int, counted: bool) -> float:
    # What alk.ack_batch runs: alk._settle's all-ack path, counted or with the counting cut out.
    function = "alk._settle" if counted else "alk_bench._settle"
    per_client = jobs // clients
    done = [0] * clients

    def drain(index: int) -> None:
        with psycopg.connect(dsn, autocommit=True, options=options) as conn:
            queue = "settle"
            while done[index] < per_client:
                claimed = conn.execute("SELECT id, attempts FROM alk.claim(%s, %s, %s)",
                                       [queue, f"w{index}", batch]).fetchall()
                if not claimed:
                    return
                acked = conn.execute(f"SELECT count(state) FROM {function}(%s, %s, %s, %s, NULL, NULL, NULL)",
                                     [queue, f"w{index}", [r[0] for r in claimed], [r[1] for r in claimed]]).fetchone()
                assert acked is not None and acked[0] == len(claimed)
                done[index] += len(claimed)

    threads = [threading.Thread(target=drain, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(done) / (time.perf_counter() - t0)


@row(
    "dashboard.counter_cost",
    "latency",
    "What the throughput counter costs the settle path",
    "claim + the all-ack settle (alk._settle, what alk.ack_batch runs) throughput with its counting CTEs and with "
    "them cut out, batches of 1 and 100, 1 and 4 clients on one queue, synchronous_commit off (the CPU cost) and on "
    "(where a shared counter row would serialise the commits), alternated; the medians.",
)
def counter_cost_row(ctx: Context) -> RowResult:
    started = time.perf_counter()
    rounds = 1 if ctx.mode.quick else 3
    records: list[dict[str, Any]] = []
    runs: list[str] = []
    with ctx.server.fresh_db("alk_bench_dash", floor=False) as db:
        dsn = ctx.server.dsn_for(db)
        with psycopg.connect(dsn, autocommit=True) as conn:
            _uncounted_settle(conn)
        cases = [(sync, batch, clients) for sync in ("off", "on") for batch in (1, 100) for clients in (1, 4)]
        ctx.progress.start("settle", total=len(cases) * rounds * 2)
        for sync, batch, clients in cases:
            options = f"-c synchronous_commit={sync}"
            jobs = (400 if batch == 1 else 8_000) if ctx.mode.quick else (2_000 if batch == 1 else 50_000)
            rates: dict[bool, list[float]] = {False: [], True: []}
            if sync == "off":
                jobs *= 4
            for r in range(rounds):
                # The order flips each round: a machine that slows down over the run biases neither.
                for counted in (False, True) if r % 2 == 0 else (True, False):
                    with psycopg.connect(dsn, autocommit=True) as conn:
                        conn.execute("SELECT count(*) FROM alk.enqueue_batch('settle', (SELECT array_agg("
                                     "jsonb_build_object('n', i)) FROM generate_series(1, %s) i))", [jobs])
                        conn.execute("VACUUM ANALYZE alk.jobs")
                    rates[counted].append(_settle_rate(dsn, options, clients, jobs, batch, counted))
                    ctx.progress.advance()
            plain, counted_rate = statistics.median(rates[False]), statistics.median(rates[True])
            runs.append(f"{sync}/{batch}/{clients}: without {[round(x) for x in rates[False]]}, "
                        f"with {[round(x) for x in rates[True]]}")
            records.append({"synchronous_commit": sync, "batch": batch, "clients": clients,
                            "without jobs/s": round(plain),
                            "with counter jobs/s": round(counted_rate), "ratio": f"{counted_rate / plain:.3f}"})
    return RowResult(
        key="dashboard.counter_cost", title="What the throughput counter costs the settle path", status="ok",
        columns=["synchronous_commit", "batch", "clients", "without jobs/s", "with counter jobs/s", "ratio"],
        records=records,
        notes=["Both variants are alk._settle as installed, called directly: 'with' is the real function, "
               "'without' a copy of it (alk_bench._settle) with the counter upsert and its prune cut out, "
               "so the difference is the counting alone. Each backend writes its own counter row "
               "(queue, minute, backend pid): concurrent settles never wait for each other's commit. "
               "Every run's jobs/s (synchronous_commit/batch/clients): " + "; ".join(runs) + "."],
        seconds=time.perf_counter() - started)


#: This module's rows, in report order (bench/rows.py collects them).
ROWS: tuple[Row, ...] = (overview_row, no_interference_row, counter_cost_row)
