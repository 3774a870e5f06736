"""Issue 7 §4: hostile conditions.

A REPEATABLE READ transaction that has taken its snapshot and stays open
holds the xmin horizon: nothing deleted or updated after it can be vacuumed
or pruned, so every claim and ack leaves dead tuples behind and claims must
step over them. The row runs a steady queue (enqueue 1, claim 1, ack) with
and without such a holder, ours and the floor, and reports throughput, dead
tuples per job, table growth per job and WAL bytes per job.
"""

from __future__ import annotations

import time
from typing import Any

from bench import pg
from bench.registry import Context, Row, RowResult, row

DEPTH = 1_000  # pre-filled backlog kept constant by the cycle script
CLIENTS = 2


def _run(ctx: Context, db: str, side: str, held: bool) -> dict[str, Any]:
    table = "alk.jobs" if side == "ours" else "alk_floor.jobs"
    script = "alk_cycle.sql" if side == "ours" else "floor_cycle.sql"
    with pg.connect(ctx, db) as conn:
        pg.reset_tables(conn)
        if side == "ours":
            pg.fill_ours(conn, DEPTH)
        else:
            pg.fill_floor(conn, DEPTH)
        pg.settle(conn, table)
        pg.flush_stats(conn)
        before = pg.table_counters(conn, table)
        holder = pg.connect(ctx, db)
        try:
            if held:
                holder.autocommit = False
                holder.isolation_level = 3  # REPEATABLE READ
                holder.execute("SELECT count(*) FROM pg_class")  # the snapshot is taken now
                xmin = conn.execute(
                    "SELECT backend_xmin::text FROM pg_stat_activity WHERE pid = %s", [holder.info.backend_pid]
                ).fetchone()
                if not xmin or not xmin[0]:
                    raise RuntimeError("the REPEATABLE READ holder has no backend_xmin")
            lsn = pg.wal_lsn(conn)
            result = pg.pgbench(ctx, db, script, CLIENTS, seconds=ctx.mode.xmin_seconds)
            wal = pg.wal_bytes(conn, lsn)
            pg.flush_stats(conn)
            after = pg.table_counters(conn, table)
        finally:
            holder.close()  # rolls back: the horizon moves on
    jobs = max(1, result.transactions)
    return {
        "jobs/s": result.tps,
        "jobs": result.transactions,
        "dead tuples/job": (after["dead"] - before["dead"]) / jobs,
        "dead tuples at end": after["dead"],
        "table+index bytes/job": (after["bytes"] - before["bytes"]) / jobs,
        "WAL bytes/job": wal / jobs,
        "vacuums during run": after["vacuums"] - before["vacuums"],
        "latency ms": result.latency_ms,
    }


@row(
    "hostile.held_xmin",
    "hostile",
    "held xmin horizon",
    "A steady queue (enqueue 1, claim 1, ack; depth 1,000; 2 clients) while a REPEATABLE READ "
    "transaction holds its snapshot for the whole run, against the same run without it; ours and "
    "the floor. Target: held-xmin throughput within 20% of the clean run.",
)
def held_xmin(ctx: Context) -> RowResult:
    started = time.perf_counter()
    records: list[dict[str, Any]] = []
    ctx.progress.start("held xmin horizon", total=4)
    with ctx.server.fresh_db("alk_bench_xmin") as db:
        results: dict[tuple[str, bool], dict[str, Any]] = {}
        for side in ("ours", "floor"):
            for held in (False, True):
                results[(side, held)] = _run(ctx, db, side, held)
                ctx.progress.advance()
    for side in ("ours", "floor"):
        clean, held = results[(side, False)], results[(side, True)]
        for label, r in (("clean", clean), ("xmin held", held)):
            records.append(
                {
                    "side": side,
                    "run": label,
                    "jobs/s": round(r["jobs/s"], 1),
                    "held/clean": round(r["jobs/s"] / clean["jobs/s"], 3) if label == "xmin held" else 1.0,
                    "dead tuples/job": round(r["dead tuples/job"], 2),
                    "bytes/job": round(r["table+index bytes/job"], 1),
                    "WAL bytes/job": round(r["WAL bytes/job"]),
                    "vacuums": r["vacuums during run"],
                }
            )
    ours_ratio = results[("ours", True)]["jobs/s"] / results[("ours", False)]["jobs/s"]
    return RowResult(
        key="hostile.held_xmin",
        title="held xmin horizon",
        status="ok",
        columns=["side", "run", "jobs/s", "held/clean", "dead tuples/job", "bytes/job", "WAL bytes/job", "vacuums"],
        records=records,
        notes=[
            f"{ctx.mode.xmin_seconds:g} s per run, {CLIENTS} pgbench clients, synchronous_commit off. "
            "dead tuples/job: growth of pg_stat_user_tables.n_dead_tup over the run / jobs; bytes/job: growth of "
            "pg_total_relation_size / jobs; WAL bytes/job: pg_current_wal_lsn() difference / jobs (one job = "
            "enqueue + claim + ack).",
            f"ours held/clean = {ours_ratio:.2f} (target >= 0.80).",
        ],
        extra={"raw": {f"{s}:{'held' if h else 'clean'}": v for (s, h), v in results.items()}},
        seconds=time.perf_counter() - started,
    )


#: This module's rows, in report order (bench/rows.py collects them).
ROWS: tuple[Row, ...] = (held_xmin,)
