"""Issue 7 §3: latency and scale.

* claim latency against the backlog (10^3 .. 10^6 pending): flat is the goal;
* the stale-statistics case: alk.jobs ANALYZEd while empty, then refilled,
  must not make enqueue or claim slower than with fresh statistics;
* wake latency: enqueue commit to handler start with the worker idle on
  LISTEN/NOTIFY, against a bare LISTEN;
* streams: publish commit to subscriber yield, and replay throughput.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import random
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from bench import pg
from bench.registry import Context, Row, RowResult, row

CLAIM_OURS = "SELECT id, attempts, payload FROM alk.claim('bench', 'lat', 1)"
ACK_OURS = "SELECT alk.ack(%s, 'lat', %s)"
CLAIM_FLOOR = """UPDATE alk_floor.jobs
   SET state = 'processing', worker_id = 'lat', attempts = attempts + 1,
       claim_expires_at = extract(epoch FROM clock_timestamp())::bigint + 300
 WHERE id = (SELECT id FROM alk_floor.jobs WHERE queue = 'bench' AND state = 'pending'
              ORDER BY priority DESC, run_at, id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id, attempts, payload"""
ACK_FLOOR = "DELETE FROM alk_floor.jobs WHERE id = %s AND attempts = %s"

WARMUP = 10  # round trips before timing: plan caches reach their steady state


def time_claims(conn: psycopg.Connection[Any], samples: int, *, floor: bool = False) -> dict[str, list[float]]:
    """Claim one job and ack it ``samples`` times on one connection; the
    wall time of each claim and each claim + ack, in milliseconds."""
    claim, ack = (CLAIM_FLOOR, ACK_FLOOR) if floor else (CLAIM_OURS, ACK_OURS)
    claims: list[float] = []
    totals: list[float] = []
    for i in range(WARMUP + samples):
        t0 = time.perf_counter()
        job = conn.execute(claim, prepare=True).fetchone()  # type: ignore[arg-type]
        t1 = time.perf_counter()
        if job is None:
            raise RuntimeError("the backlog ran dry during a latency measurement")
        conn.execute(ack, [job[0], job[1]], prepare=True)  # type: ignore[arg-type]
        t2 = time.perf_counter()
        if i >= WARMUP:
            claims.append((t1 - t0) * 1000)
            totals.append((t2 - t0) * 1000)
    return {"claim": claims, "claim+ack": totals}


def nested_plans(conn: psycopg.Connection[Any], statement: str, params: Any = None) -> list[str]:
    """EXPLAIN ANALYZE of every statement run inside the functions that
    ``statement`` calls (auto_explain with nested statements, sent back as
    NOTICEs). Needs a superuser (LOAD)."""
    plans: list[str] = []

    def collect(diag: psycopg.errors.Diagnostic) -> None:
        text = diag.message_primary or ""
        if "plan:" in text:
            plans.append(text.split("plan:", 1)[1].strip("\n"))

    conn.add_notice_handler(collect)
    try:
        conn.execute("LOAD 'auto_explain'")
        for setting, value in (
            ("auto_explain.log_min_duration", "0"),
            ("auto_explain.log_nested_statements", "on"),
            ("auto_explain.log_analyze", "on"),
            ("auto_explain.log_buffers", "on"),
            ("auto_explain.log_level", "notice"),
        ):
            conn.execute("SELECT set_config(%s, %s, false)", [setting, value])
        conn.execute(statement, params)  # type: ignore[arg-type]
    finally:
        conn.execute("SELECT set_config('auto_explain.log_min_duration', '-1', false)")
        conn.remove_notice_handler(collect)
    return plans


def claim_and_ack_plans(conn: psycopg.Connection[Any]) -> list[str]:
    """The nested plans (EXPLAIN ANALYZE) of the statements on alk.jobs in
    one claim and one ack, in a session whose plan caches are warm (run
    after time_claims on the same connection)."""
    plans = nested_plans(conn, "SELECT id, attempts FROM alk.claim('bench', 'lat', 1)")
    # The job the explained claim took, acked under auto_explain too.
    held = conn.execute(
        "SELECT id, attempts FROM alk.jobs WHERE state = 'processing' AND worker_id = 'lat'"
        " ORDER BY claimed_at DESC, id DESC LIMIT 1"
    ).fetchone()
    if held is not None:
        plans += nested_plans(conn, "SELECT alk.ack(%s, 'lat', %s)", [held[0], held[1]])
    return [p for p in plans if "jobs" in p and "Query Text: SELECT alk." not in p]


def _pending(conn: psycopg.Connection[Any], table: str) -> int:
    r = conn.execute(f"SELECT count(*) FROM {table} WHERE state = 'pending'").fetchone()  # type: ignore[arg-type]
    return int(r[0]) if r else 0


def _ms(value: float) -> float:
    return round(value, 3)


@row(
    "latency.claim_vs_backlog",
    "latency",
    "claim latency vs backlog",
    "Claim one job and ack it on one connection (prepared statements), timed per round trip, with "
    "10^3 .. 10^6 pending jobs in the queue; ours and the floor. Flat is the goal: p50 at the "
    "largest backlog within 2x of the smallest.",
)
def claim_vs_backlog(ctx: Context) -> RowResult:
    started = time.perf_counter()
    mode = ctx.mode
    records: list[dict[str, Any]] = []
    plans: dict[str, list[str]] = {}
    ctx.progress.start("claim latency vs backlog: filling", total=float(max(mode.backlog_sizes)) * 2)
    with ctx.server.fresh_db("alk_bench_backlog") as db, pg.connect(ctx, db) as conn:
        conn.execute("SET synchronous_commit = off")
        for size in mode.backlog_sizes:
            ours_need = size - _pending(conn, "alk.jobs")
            floor_need = size - _pending(conn, "alk_floor.jobs")
            if ours_need > 0:
                pg.fill_ours(conn, ours_need, progress=ctx.progress)
            if floor_need > 0:
                pg.fill_floor(conn, floor_need)
                ctx.progress.advance(floor_need)
            # Every size starts vacuumed and analyzed: this row is about the
            # backlog, not about bloat (the held-xmin row is about bloat).
            pg.settle(conn, "alk.jobs", "alk_floor.jobs")
            ctx.progress.note(f"backlog {size:,}: timing {mode.latency_samples} claims")
            with pg.connect(ctx, db) as worker:
                worker.execute("SET synchronous_commit = off")
                ours = time_claims(worker, mode.latency_samples)
                plans[str(size)] = claim_and_ack_plans(worker)
            with pg.connect(ctx, db) as worker:
                worker.execute("SET synchronous_commit = off")
                floor = time_claims(worker, mode.latency_samples, floor=True)
            o_claim = pg.percentiles(ours["claim"])
            o_total = pg.percentiles(ours["claim+ack"])
            f_total = pg.percentiles(floor["claim+ack"])
            records.append(
                {
                    "pending": size,
                    "ours claim p50 ms": _ms(o_claim["p50"]),
                    "ours claim p99 ms": _ms(o_claim["p99"]),
                    "ours claim+ack p50 ms": _ms(o_total["p50"]),
                    "ours claim+ack p99 ms": _ms(o_total["p99"]),
                    "floor claim+ack p50 ms": _ms(f_total["p50"]),
                    "floor claim+ack p99 ms": _ms(f_total["p99"]),
                }
            )
    first = records[0]
    worst = {
        m: max(r[m] for r in records) for m in ("ours claim p50 ms", "ours claim+ack p50 ms", "floor claim+ack p50 ms")
    }
    notes = [
        f"{mode.latency_samples} timed round trips per size after {WARMUP} warm-up ones; synchronous_commit off; "
        "one client; the queue is VACUUM ANALYZEd at each size.",
    ]
    summary: dict[str, Any] = {}
    for metric in ("ours claim p50 ms", "ours claim+ack p50 ms", "floor claim+ack p50 ms"):
        if first[metric]:
            summary[metric] = round(worst[metric] / first[metric], 2)
    notes.append(
        f"worst p50 over the sizes / p50 at {first['pending']:,}: "
        + ", ".join(f"{k.replace(' p50 ms', '')} {v}x" for k, v in summary.items())
        + " (target: within 2x)."
    )
    return RowResult(
        key="latency.claim_vs_backlog",
        title="claim latency vs backlog",
        status="ok",
        about="",
        columns=list(records[0].keys()),
        records=records,
        notes=notes,
        extra={"growth": summary, "plans": plans},
        seconds=time.perf_counter() - started,
    )


#: alk.jobs' partitions (sql/queue/10_table.sql): the rotating slots and the kept one.
JOB_PARTITIONS = ("alk.jobs_0", "alk.jobs_1", "alk.jobs_kept")


def _stale_scenario(ctx: Context, stale: bool) -> dict[str, Any]:
    """One scenario in its own database: ANALYZE while empty then refill
    (stale) or refill then ANALYZE (fresh); autovacuum off on alk.jobs so it
    cannot refresh the statistics halfway."""
    mode = ctx.mode
    n = mode.stale_backlog
    with ctx.server.fresh_db("alk_bench_stats") as db, pg.connect(ctx, db) as conn:
        for part in JOB_PARTITIONS:  # storage parameters are a partitioned table's partitions'
            conn.execute(f"ALTER TABLE {part} SET (autovacuum_enabled = off)")  # type: ignore[arg-type]
        if stale:
            conn.execute("ANALYZE alk.jobs")
            pg.fill_ours(conn, n)
            conn.execute("VACUUM alk.jobs")  # visibility map, no statistics
        else:
            pg.fill_ours(conn, n)
            conn.execute("VACUUM (ANALYZE) alk.jobs")
        conn.execute("CHECKPOINT")
        stats = conn.execute(
            "SELECT sum(greatest(c.reltuples, 0))::bigint, sum(c.relpages)::bigint FROM pg_class c"
            " JOIN pg_inherits i ON i.inhrelid = c.oid WHERE i.inhparent = 'alk.jobs'::regclass"
        ).fetchone()
        with pg.connect(ctx, db) as worker:
            worker.execute("SET synchronous_commit = off")
            lat = time_claims(worker, mode.latency_samples)
            plans = claim_and_ack_plans(worker)
        transactions = max(50, min(n // 4, mode.claim1_jobs // 2))
        claim = pg.pgbench(ctx, db, "alk_claim_1_ack.sql", 1, transactions=transactions)
        enqueue = pg.pgbench(ctx, db, "alk_enqueue_1.sql", 1, seconds=mode.enqueue_seconds)
    return {
        "reltuples": int(stats[0]) if stats else None,
        "relpages": int(stats[1]) if stats else None,
        "claim+ack p50 ms": pg.percentiles(lat["claim+ack"])["p50"],
        "claim+ack p99 ms": pg.percentiles(lat["claim+ack"])["p99"],
        "claim p50 ms": pg.percentiles(lat["claim"])["p50"],
        "claim 1 + ack jobs/s": claim.tps,
        "enqueue 1 jobs/s": enqueue.tps,
        "plans": plans,
    }


@row(
    "latency.stale_stats",
    "latency",
    "stale statistics",
    "alk.jobs ANALYZEd while empty, then refilled (autovacuum off so the statistics stay stale), "
    "against the same fill with fresh statistics: claim and enqueue must not be slower.",
)
def stale_stats(ctx: Context) -> RowResult:
    started = time.perf_counter()
    ctx.progress.start("stale statistics", total=2)
    fresh = _stale_scenario(ctx, stale=False)
    ctx.progress.advance()
    stale = _stale_scenario(ctx, stale=True)
    ctx.progress.advance()
    records = []
    for metric, higher_is_better in (
        ("claim p50 ms", False),
        ("claim+ack p50 ms", False),
        ("claim+ack p99 ms", False),
        ("claim 1 + ack jobs/s", True),
        ("enqueue 1 jobs/s", True),
    ):
        f, s = fresh[metric], stale[metric]
        ratio = (s / f) if f else float("nan")
        records.append(
            {
                "metric": metric,
                "fresh stats": round(f, 3),
                "stale stats": round(s, 3),
                "stale/fresh": round(ratio, 3),
                "worse by >10%": (ratio < 0.9) if higher_is_better else (ratio > 1.1),
            }
        )
    degraded = any(r["worse by >10%"] for r in records)
    notes = [
        f"backlog {ctx.mode.stale_backlog:,} jobs; pg_class after the fill: fresh reltuples={fresh['reltuples']}, "
        f"stale reltuples={stale['reltuples']} (relpages {fresh['relpages']} / {stale['relpages']}).",
    ]
    if degraded:
        notes.append("Stale statistics made something slower: the nested plans are in the JSON.")
    return RowResult(
        key="latency.stale_stats",
        title="stale statistics",
        status="ok",
        columns=["metric", "fresh stats", "stale stats", "stale/fresh", "worse by >10%"],
        records=records,
        notes=notes,
        extra={"degraded": degraded, "plans": {"fresh": fresh["plans"], "stale": stale["plans"]}},
        seconds=time.perf_counter() - started,
    )


@row(
    "latency.sweep_vs_dead",
    "latency",
    "sweep cost vs dead rows",
    "alk.sweep_expired on a queue holding 10^3 .. 10^6 dead jobs that are all inside their retention "
    "(so the sweep has nothing to do), plus 1,000 pending jobs: its cost should not grow with the dead rows.",
)
def sweep_vs_dead(ctx: Context) -> RowResult:
    started = time.perf_counter()
    mode = ctx.mode
    sizes = [s for s in mode.backlog_sizes]
    records: list[dict[str, Any]] = []
    plans: dict[str, list[str]] = {}
    calls = 20 if mode.quick else 50
    ctx.progress.start("sweep cost vs dead rows", total=float(max(sizes)))
    with ctx.server.fresh_db("alk_bench_sweep") as db, pg.connect(ctx, db) as conn:
        conn.execute("SET synchronous_commit = off")
        pg.fill_ours(conn, 1_000)
        dead = 0
        for size in sizes:
            # Dead rows through the public API: enqueued already expired, with
            # a day of retention, then buried by one sweep.
            while dead < size:
                k = min(pg.FILL_CHUNK, size - dead)
                conn.execute(
                    "SELECT count(*) FROM alk.enqueue_batch('bench', array_fill(%s::jsonb, ARRAY[%s::int]),"
                    " expires => -1, dead_letter_retention_s => 86400)",
                    [pg.PAYLOAD, k],
                )
                conn.execute("SELECT alk.sweep_expired('bench')")
                dead += k
                ctx.progress.advance(k)
            pg.settle(conn, "alk.jobs")
            timings: list[float] = []
            for i in range(calls + 3):
                t0 = time.perf_counter()
                conn.execute("SELECT alk.sweep_expired('bench')", prepare=True)
                if i >= 3:
                    timings.append((time.perf_counter() - t0) * 1000)
            plans[str(size)] = [p for p in nested_plans(conn, "SELECT alk.sweep_expired('bench')") if "alk.jobs" in p]
            pct = pg.percentiles(timings)
            records.append({"dead rows": size, "sweep p50 ms": _ms(pct["p50"]), "sweep p99 ms": _ms(pct["p99"])})
    growth = records[-1]["sweep p50 ms"] / records[0]["sweep p50 ms"] if records[0]["sweep p50 ms"] else None
    return RowResult(
        key="latency.sweep_vs_dead",
        title="sweep cost vs dead rows",
        status="ok",
        columns=["dead rows", "sweep p50 ms", "sweep p99 ms"],
        records=records,
        notes=[
            f"{calls} timed sweeps per size (one client, VACUUM ANALYZEd). p50 at {sizes[-1]:,} / p50 at "
            f"{sizes[0]:,}: {round(growth, 2) if growth else 'n/a'}x."
        ],
        extra={"growth": growth, "plans": plans},
        seconds=time.perf_counter() - started,
    )


def _needs_worker(ctx: Context) -> str | None:
    from bench.peers.pyalk_worker import missing

    return missing()


def _needs_subscribe(ctx: Context) -> str | None:
    from bench.peers.pyalk_worker import missing_subscribe

    return missing_subscribe()


def _now_ns() -> int:
    """CLOCK_MONOTONIC, the clock the listening process stamps with."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


class Listener:
    """A listening subprocess (bench/peers/pyalk_worker.py --listen KIND):
    a worker or subscription idle on LISTEN, one stdout line per wake-up."""

    def __init__(self, ctx: Context, db: str, kind: str) -> None:
        env = dict(os.environ)
        if ctx.session_options:
            env["PGOPTIONS"] = ctx.session_options
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.peers.pyalk_worker", "--listen", kind, "--dsn", ctx.server.dsn_for(db)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=str(Path(__file__).resolve().parent.parent),
            env=env,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if self.next_line(30.0) != "ready":
            raise RuntimeError(f"listener {kind} did not start: {self._stderr()}")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def _stderr(self) -> str:
        self.close()
        return (self.proc.stderr.read() if self.proc.stderr else "")[-2000:]

    def next_line(self, timeout: float) -> str:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"no wake-up within {timeout} s") from None
        if line is None:
            raise RuntimeError(f"the listener exited: {self._stderr()}")
        return line

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.close()  # the worker stops when stdin closes
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def wake_samples(ctx: Context, db: str, kind: str, statement: str, samples: int) -> dict[str, list[float]]:
    """One item at a time: run ``statement`` (an autocommit enqueue or
    publish of ``{"seq": i}``), stamp when its commit returns, wait for the
    listener's line, then a pause of 20-40 ms so the listener is idle again
    (every sample a fresh wake-up). Milliseconds from commit return and from
    statement send to the listener's stamp."""
    rng = random.Random(7)
    listener = Listener(ctx, db, kind)
    from_commit: list[float] = []
    from_send: list[float] = []
    try:
        with pg.connect(ctx, db) as conn:
            for i in range(WAKE_WARMUP + samples):
                payload = json.dumps({"seq": i})
                t_send = _now_ns()
                conn.execute(statement, [payload], prepare=True)  # type: ignore[arg-type]
                t_commit = _now_ns()
                seq_text, stamp_text = listener.next_line(30.0).split()
                stamp = int(stamp_text)
                if not kind.startswith("bare") and int(seq_text) != i:
                    raise RuntimeError(f"wake-up for item {seq_text}, expected {i}")
                if i >= WAKE_WARMUP:
                    from_commit.append((stamp - t_commit) / 1e6)
                    from_send.append((stamp - t_send) / 1e6)
                time.sleep(rng.uniform(0.02, 0.04))
    finally:
        listener.close()
    return {"from_commit": from_commit, "from_send": from_send}


WAKE_WARMUP = 5
ENQUEUE_WAKE = "SELECT alk.enqueue('wake', %s::jsonb)"
PUBLISH_TAIL = "SELECT alk.publish('tail', %s::jsonb)"


def _latency_record(label: str, samples: dict[str, list[float]]) -> dict[str, Any]:
    c = pg.percentiles(samples["from_commit"])
    s = pg.percentiles(samples["from_send"])
    return {
        "system": label,
        "samples": len(samples["from_commit"]),
        "p50 ms": _ms(c["p50"]),
        "p90 ms": _ms(c["p90"]),
        "p99 ms": _ms(c["p99"]),
        "max ms": _ms(max(samples["from_commit"])),
        "p50 from send ms": _ms(s["p50"]),
    }


@row(
    "latency.wake",
    "latency",
    "wake latency (enqueue commit to handler start)",
    "An AsyncWorker idle on LISTEN/NOTIFY (60 s fallback poll) in its own process; the enqueuer (another "
    "process) runs one autocommit alk.enqueue at a time and stamps CLOCK_MONOTONIC when the commit returns, the "
    "handler stamps the same clock on its first line; items 20-40 ms apart so each wake is a fresh one. Floors: "
    "a bare psycopg LISTEN on the same channel, stamped when the notification arrives, and the same followed by "
    "one prepared alk.claim (what any wake-up must do before a handler can start). Target: p50 <= 1 ms.",
    requires=_needs_worker,
)
def wake_latency(ctx: Context) -> RowResult:
    started = time.perf_counter()
    n = ctx.mode.wake_samples
    ctx.progress.start("wake latency", total=3)
    records = []
    raw: dict[str, Any] = {}
    with ctx.server.fresh_db("alk_bench_wake", floor=False) as db:
        for kind, label in (
            ("wake", "pyalk AsyncWorker"),
            ("listen-claim", "bare LISTEN + alk.claim on psycopg (no worker)"),
            ("bare-queue", "floor: bare LISTEN (no claim)"),
        ):
            ctx.progress.note(f"wake latency: {label}, {n} samples")
            samples = wake_samples(ctx, db, kind, ENQUEUE_WAKE, n)
            raw[kind] = samples
            records.append(_latency_record(label, samples))
            ctx.progress.advance()
    ours, claim_only, floor = records
    return RowResult(
        key="latency.wake",
        title="wake latency (enqueue commit to handler start)",
        status="ok",
        columns=list(ours.keys()),
        records=records,
        notes=[
            f"{n} samples per system after {WAKE_WARMUP} warm-up ones; latency = listener stamp - enqueuer's stamp "
            "when its commit returned (p50 from send: from when the enqueue was sent, i.e. including the "
            "enqueue's own round trip and commit). The bare LISTEN floor may be at or below zero: the server "
            "signals listeners at commit, before the enqueuer's reply is on its way.",
            f"p50 split: notification {floor['p50 ms']} ms; + the alk.claim round trip that must follow it "
            f"{claim_only['p50 ms'] - floor['p50 ms']:.3f} ms (bare LISTEN + alk.claim on psycopg); + the worker's "
            f"own path (LISTEN task to claim loop, pool, row decoding, handler task) "
            f"{ours['p50 ms'] - claim_only['p50 ms']:.3f} ms.",
        ],
        extra={"raw": raw},
        seconds=time.perf_counter() - started,
    )


def _fill_stream(conn: psycopg.Connection[Any], events: int) -> None:
    left = events
    while left > 0:
        k = min(pg.FILL_CHUNK, left)
        conn.execute(
            "SELECT count(*) FROM alk.publish_batch('replay', array_fill(%s::jsonb, ARRAY[%s::int]))",
            [pg.PAYLOAD, k],
        )
        left -= k
    conn.execute(
        "INSERT INTO alk_floor.events (stream, payload) SELECT 'replay', %s::jsonb FROM generate_series(1, %s)",
        [pg.PAYLOAD, events],
    )


def _replay_wrapper(ctx: Context, db: str, events: int) -> float:
    """Stream.read_since(after, 100) from 0 to the end; events/s."""
    from pyalk import Alk

    with Alk(ctx.server.dsn_for(db), max_connections=1) as alk:
        stream = alk.stream("replay")
        stream.read_since(0, 100)  # pool open, statement prepared
        seen, after = 0, 0
        t0 = time.perf_counter()
        while True:
            batch = stream.read_since(after, 100)
            if not batch:
                break
            seen += len(batch)
            after = batch[-1].offset
        elapsed = time.perf_counter() - t0
    if seen != events:
        raise RuntimeError(f"replay read {seen} events, expected {events}")
    return seen / elapsed


def _replay_subscribe(ctx: Context, db: str, events: int) -> float:
    """subscribe() (batch 100) from a new consumer to the last event; events/s."""
    from pyalk import Alk

    with Alk(ctx.server.dsn_for(db), max_connections=1) as alk:
        seen = 0
        t0 = time.perf_counter()
        with alk.stream("replay").subscribe(f"replay-{secrets.token_hex(4)}", batch=100) as subscription:
            for event in subscription:
                seen += 1
                if event.offset >= events:
                    break
        elapsed = time.perf_counter() - t0
    return seen / elapsed


def _replay_sql(ctx: Context, db: str, events: int, floor: bool) -> float:
    """The same batches as bare statements on psycopg (prepared, tuples):
    alk.read_since, or the floor's index range scan."""
    statement = (
        "SELECT * FROM alk_floor.events WHERE stream = 'replay' AND event_offset > %s ORDER BY event_offset LIMIT 100"
        if floor
        else "SELECT * FROM alk.read_since('replay', %s, 100)"
    )
    with pg.connect(ctx, db) as conn:
        offset_at = 1
        conn.execute(statement, [0], prepare=True)  # type: ignore[arg-type]
        seen, after = 0, 0
        t0 = time.perf_counter()
        while True:
            rows = conn.execute(statement, [after], prepare=True).fetchall()  # type: ignore[arg-type]
            if not rows:
                break
            seen += len(rows)
            after = rows[-1][offset_at]
        elapsed = time.perf_counter() - t0
    if seen != events:
        raise RuntimeError(f"replay read {seen} events, expected {events}")
    return seen / elapsed


@row(
    "latency.stream_tail",
    "latency",
    "stream tail latency and replay throughput",
    "Tail: a subscribe() iterator idle on LISTEN in its own process; the publisher runs one autocommit "
    "alk.publish at a time (20-40 ms apart) and stamps CLOCK_MONOTONIC when its commit returns, the subscriber "
    "stamps when the event is yielded; floor: a bare LISTEN on the stream's channel. Replay: read a pre-filled "
    "stream from offset 0 to its end in batches of 100, through the wrapper, subscribe(), and bare SQL; floor: "
    "an index range scan of an append-only table with the same rows.",
    requires=_needs_subscribe,
)
def stream_tail(ctx: Context) -> RowResult:
    started = time.perf_counter()
    mode = ctx.mode
    ctx.progress.start("stream tail latency and replay", total=4)
    with ctx.server.fresh_db("alk_bench_stream") as db:
        tail = wake_samples(ctx, db, "stream", PUBLISH_TAIL, mode.wake_samples)
        ctx.progress.advance()
        bare = wake_samples(ctx, db, "bare-stream", PUBLISH_TAIL, mode.wake_samples)
        ctx.progress.advance()
        with pg.connect(ctx, db) as conn:
            _fill_stream(conn, mode.replay_events)
            pg.settle(conn)
        ctx.progress.advance()
        # Alternate the replays (two rounds, best of each) so load shifts hit all.
        rates: dict[str, list[float]] = {"wrapper": [], "subscribe": [], "sql": [], "floor": []}
        for _ in range(2):
            rates["wrapper"].append(_replay_wrapper(ctx, db, mode.replay_events))
            rates["floor"].append(_replay_sql(ctx, db, mode.replay_events, floor=True))
            rates["sql"].append(_replay_sql(ctx, db, mode.replay_events, floor=False))
            rates["subscribe"].append(_replay_subscribe(ctx, db, mode.replay_events))
        ctx.progress.advance()
    t, b = pg.percentiles(tail["from_commit"]), pg.percentiles(bare["from_commit"])
    best = {k: max(v) for k, v in rates.items()}
    floor = best["floor"]
    records: list[dict[str, Any]] = [
        {"metric": "tail latency p50 ms (publish commit to yield)", "pyalk": _ms(t["p50"]), "floor": _ms(b["p50"])},
        {"metric": "tail latency p99 ms", "pyalk": _ms(t["p99"]), "floor": _ms(b["p99"])},
        {
            "metric": "replay events/s: Stream.read_since(after, 100)",
            "pyalk": round(best["wrapper"]),
            "floor": round(floor),
            "pyalk/floor": round(best["wrapper"] / floor, 3),
        },
        {
            "metric": "replay events/s: subscribe(batch=100)",
            "pyalk": round(best["subscribe"]),
            "floor": round(floor),
            "pyalk/floor": round(best["subscribe"] / floor, 3),
        },
        {
            "metric": "replay events/s: alk.read_since 100 on bare psycopg",
            "pyalk": round(best["sql"]),
            "floor": round(floor),
            "pyalk/floor": round(best["sql"] / floor, 3),
        },
    ]
    return RowResult(
        key="latency.stream_tail",
        title="stream tail latency and replay throughput",
        status="ok",
        columns=["metric", "pyalk", "floor", "pyalk/floor"],
        records=records,
        notes=[
            f"tail: {mode.wake_samples} samples each after {WAKE_WARMUP} warm-up ones; floor = a bare LISTEN on "
            "alk.stream_channel('tail'), stamped when the notification arrives (no read).",
            f"replay: a stream of {mode.replay_events:,} events (and {mode.replay_events:,} rows in "
            "alk_floor.events), VACUUM ANALYZEd; one client on one connection, batches of 100 from offset 0 to the "
            "end; best of 2 alternating rounds. The floor is the same loop on psycopg: "
            "SELECT ... WHERE stream = $1 AND event_offset > $2 ORDER BY event_offset LIMIT 100.",
        ],
        extra={"raw": {"tail": tail, "bare": bare, "replay": rates}},
        seconds=time.perf_counter() - started,
    )


# -- claim latency with higher-priority future rows (issue 11 §2) -----------------

FUTURE_DELAY_S = 86_400
#: Alternating rounds per side, each on a new connection: one connection's
#: round trips can differ from the next one's by more than the effect
#: measured (2 rounds gave 0.95x-1.29x for the same code, 2026-12-07).
FUTURE_ROUNDS = 6


def _fill_future(conn: psycopg.Connection[Any], n: int) -> None:
    """n pending jobs of priority 1, due in a day: ahead of every due job in
    claim order, but not claimable."""
    left = n
    while left > 0:
        k = min(pg.FILL_CHUNK, left)
        conn.execute(
            "SELECT count(*) FROM alk.enqueue_batch(%s, array_fill(%s::jsonb, ARRAY[%s::int]),"
            " delay => %s, priority => 1)",
            [pg.QUEUE, pg.PAYLOAD, k, FUTURE_DELAY_S],
        )
        left -= k


def future_vs_clean(dsn_for: Any, due: int, samples: int) -> dict[str, dict[str, float]]:
    """Two databases (given by name through ``dsn_for``): 'fut' holds ``due``
    due jobs and ``due`` higher-priority future ones, 'ref' only the due ones.
    Timed claim + ack rounds alternate between them; per side the claim
    percentiles over every round."""
    claims: dict[str, list[float]] = {"fut": [], "ref": []}
    totals: dict[str, list[float]] = {"fut": [], "ref": []}
    for side in ("fut", "ref"):
        with psycopg.connect(dsn_for(side), autocommit=True) as conn:
            pg.fill_ours(conn, due + samples * FUTURE_ROUNDS + WARMUP * FUTURE_ROUNDS)
            if side == "fut":
                _fill_future(conn, due)
            pg.settle(conn, "alk.jobs")
    for rnd in range(FUTURE_ROUNDS):
        for side in ("fut", "ref") if rnd % 2 == 0 else ("ref", "fut"):
            with psycopg.connect(dsn_for(side), autocommit=True) as conn:
                conn.execute("SET synchronous_commit = off")
                timed = time_claims(conn, samples)
            claims[side] += timed["claim"]
            totals[side] += timed["claim+ack"]
    return {
        side: {
            "claim p50": pg.percentiles(claims[side])["p50"],
            "claim p99": pg.percentiles(claims[side])["p99"],
            "claim+ack p50": pg.percentiles(totals[side])["p50"],
        }
        for side in ("fut", "ref")
    }


def _future_records(server: str, stats: dict[str, dict[str, float]]) -> list[dict[str, Any]]:
    fut, ref = stats["fut"], stats["ref"]
    return [
        {
            "server": server,
            "metric": metric,
            "with future rows ms": _ms(fut[metric]),
            "no future rows ms": _ms(ref[metric]),
            "ratio": round(fut[metric] / ref[metric], 3) if ref[metric] else None,
        }
        for metric in ("claim p50", "claim p99", "claim+ack p50")
    ]


def _pg15_future(due: int, samples: int) -> tuple[list[dict[str, Any]], str | None]:
    """The same measurement on a throwaway Debian PostgreSQL 15 (no skip
    scan), when its binaries are installed."""
    from bench import pg15
    from bench.server import install_pyalk

    if not (pg15.BIN / "postgres").exists():
        return [], f"PostgreSQL 15 not installed ({pg15.BIN}): PG15 part skipped"
    server = pg15.Pg15()
    server.start()
    try:
        for side in ("fut", "ref"):
            with psycopg.connect(server.dsn("postgres"), autocommit=True) as conn:
                conn.execute(f"CREATE DATABASE alk_future_{side}")  # type: ignore[arg-type]
            with psycopg.connect(server.dsn(f"alk_future_{side}"), autocommit=True) as conn:
                install_pyalk(conn)
        stats = future_vs_clean(lambda side: server.dsn(f"alk_future_{side}"), due, samples)
        version = ""
        with psycopg.connect(server.dsn("postgres"), autocommit=True) as conn:
            got = conn.execute("SHOW server_version").fetchone()
            version = str(got[0]) if got else "15"
        return _future_records(f"PG {version.split()[0]} (Debian, fsync off)", stats), None
    finally:
        server.stop()


@row(
    "latency.claim_vs_future",
    "latency",
    "claim latency vs future rows",
    "Claim one job and ack it on one connection with 10^5 higher-priority jobs scheduled a day ahead and 10^5 due "
    "ones, against a queue with only the due ones; rounds alternate between the two databases. Target: p50 within "
    "1.2x. On the bench server and, in full mode, on a Debian PostgreSQL 15 (no skip scan) when installed.",
)
def claim_vs_future(ctx: Context) -> RowResult:
    started = time.perf_counter()
    mode = ctx.mode
    due = mode.stale_backlog  # 10^5 in full mode
    samples = mode.latency_samples
    ctx.progress.start("claim latency vs future rows", total=None)
    notes = [
        f"{due:,} due jobs (priority 0) on both sides, plus {due:,} priority-1 jobs due in {FUTURE_DELAY_S:,} s on "
        f"one; {FUTURE_ROUNDS} alternating rounds of {samples} timed claim + ack round trips per side after "
        f"{WARMUP} warm-up ones; synchronous_commit off; VACUUM ANALYZE after the fill."
    ]
    with ctx.server.fresh_db("alk_bench_fut") as fut_db, ctx.server.fresh_db("alk_bench_ref") as ref_db:
        names = {"fut": fut_db, "ref": ref_db}
        with psycopg.connect(ctx.server.dsn_for(fut_db), autocommit=True) as conn:
            got = conn.execute("SHOW server_version").fetchone()
            version = str(got[0]).split()[0] if got else "?"
        stats = future_vs_clean(lambda side: ctx.server.dsn_for(names[side]), due, samples)
    records = _future_records(f"PG {version} (bench server)", stats)
    if not mode.quick:
        try:
            extra_records, why = _pg15_future(due, samples)
        except Exception as exc:  # the PG15 part is optional; the report says why it is missing
            extra_records, why = [], f"PG15 part failed: {exc!r}"
        records += extra_records
        if why:
            notes.append(why)
    return RowResult(
        key="latency.claim_vs_future",
        title="claim latency vs future rows",
        status="ok",
        about="",
        columns=list(records[0].keys()),
        records=records,
        notes=notes,
        seconds=time.perf_counter() - started,
    )


#: This module's rows, in report order (bench/rows.py collects them).
ROWS: tuple[Row, ...] = (claim_vs_backlog, stale_stats, sweep_vs_dead, wake_latency, stream_tail, claim_vs_future)
