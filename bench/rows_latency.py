"""Issue 7 §3: latency and scale.

* claim latency against the backlog (10^3 .. 10^6 pending): flat is the goal;
* the stale-statistics case: alk.jobs ANALYZEd while empty, then refilled,
  must not make enqueue or claim slower than with fresh statistics;
* wake latency (LISTEN/NOTIFY) and the stream rows wait for the worker and
  streams: registered as pending until those exist.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg

from bench import pg
from bench.registry import Context, RowResult, row

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


def _stale_scenario(ctx: Context, stale: bool) -> dict[str, Any]:
    """One scenario in its own database: ANALYZE while empty then refill
    (stale) or refill then ANALYZE (fresh); autovacuum off on alk.jobs so it
    cannot refresh the statistics halfway."""
    mode = ctx.mode
    n = mode.stale_backlog
    with ctx.server.fresh_db("alk_bench_stats") as db, pg.connect(ctx, db) as conn:
        conn.execute("ALTER TABLE alk.jobs SET (autovacuum_enabled = off)")
        if stale:
            conn.execute("ANALYZE alk.jobs")
            pg.fill_ours(conn, n)
            conn.execute("VACUUM alk.jobs")  # visibility map, no statistics
        else:
            pg.fill_ours(conn, n)
            conn.execute("VACUUM (ANALYZE) alk.jobs")
        conn.execute("CHECKPOINT")
        stats = conn.execute(
            "SELECT reltuples::bigint, relpages FROM pg_class WHERE oid = 'alk.jobs'::regclass"
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
        notes.append("Stale statistics made something slower: the nested plans are in the JSON (and below).")
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
    try:
        import pyalk.worker  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        return "pyalk's worker (LISTEN/NOTIFY wake-ups) does not exist yet"
    return None


@row(
    "latency.wake",
    "latency",
    "wake latency (enqueue commit to handler start)",
    "p50/p99 from the enqueue's commit to the handler's first line, with the worker idle on LISTEN/NOTIFY.",
    requires=_needs_worker,
)
def wake_latency(ctx: Context) -> RowResult:  # pragma: no cover - slot for the worker
    from bench.peers.pyalk_worker import wake_latency as measure

    return measure(ctx)


@row(
    "latency.stream_tail",
    "latency",
    "stream tail latency and replay throughput",
    "Publish-commit to subscriber-yield latency, and read_since replay throughput over a long stream.",
    requires=lambda ctx: _needs_subscribe(),
)
def stream_tail(ctx: Context) -> RowResult:  # pragma: no cover - slot for streams
    raise NotImplementedError("stream tail latency: write it when pyalk's subscribe() lands")


def _needs_subscribe() -> str | None:
    return "pyalk's stream subscribe() does not exist yet; this row is a slot for it"
