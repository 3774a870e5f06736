"""Issue 7 §4: hostile conditions.

A REPEATABLE READ transaction that has taken its snapshot and stays open
holds the xmin horizon: nothing deleted or updated after it can be vacuumed
or pruned, so every claim and ack leaves dead tuples behind and claims must
step over them. The row runs a steady queue (enqueue 1, claim 1, ack) with
and without such a holder, ours and the floor, and reports throughput, dead
tuples per job, table growth per job and WAL bytes per job.

Ours runs twice: as bare SQL with nothing rotating the job storage, and with
a session calling ``alk.rotate_jobs()`` every second beside it, as
docs/design.md ("Who rotates") asks of a deployment without pyalk workers
(pg_cron every second; a pyalk worker calls it every 0.1 s while it
settles). The rotation TRUNCATEs the slot it empties, which gives the space
back even while the snapshot is held.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg

from bench import pg
from bench.registry import Context, Row, RowResult, row

DEPTH = 1_000  # pre-filled backlog kept constant by the cycle script
CLIENTS = 2
#: The sides, in report order: ours bare, ours with its storage rotated, the floor.
OURS, ROTATED, FLOOR = "ours", "ours, rotated every 1 s", "floor"
SIDES = (OURS, ROTATED, FLOOR)
#: Seconds between the rotating side's calls (pg_cron's finest schedule), and the call.
ROTATE_EVERY = 1.0
ROTATE_SQL = "SELECT alk.rotate_jobs()"


class _Rotator:
    """Calls alk.rotate_jobs() every ROTATE_EVERY seconds on its own
    connection until closed; counts the answers."""

    def __init__(self, ctx: Context, db: str) -> None:
        self.answers: list[str] = []
        self._stop = threading.Event()
        self._conn = pg.connect(ctx, db)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                row = self._conn.execute(ROTATE_SQL).fetchone()
                self.answers.append(str(row[0]) if row else "")
            except psycopg.Error as error:  # counted, not raised: the row reports its rotations
                self.answers.append(f"error: {error}")
            if self._stop.wait(ROTATE_EVERY):
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self._conn.close()


def _run(ctx: Context, db: str, side: str, held: bool) -> dict[str, Any]:
    ours = side != FLOOR
    table = "alk.jobs" if ours else "alk_floor.jobs"
    script = "alk_cycle.sql" if ours else "floor_cycle.sql"
    with pg.connect(ctx, db) as conn:
        pg.reset_tables(conn)
        if ours:
            pg.fill_ours(conn, DEPTH)
        else:
            pg.fill_floor(conn, DEPTH)
        pg.settle(conn, table)
        pg.flush_stats(conn)
        before = pg.table_counters(conn, table)
        holder = pg.connect(ctx, db)
        rotator = None
        rotations = 0
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
            if side == ROTATED:
                rotator = _Rotator(ctx, db)
            result = pg.pgbench(ctx, db, script, CLIENTS, seconds=ctx.mode.xmin_seconds)
            if rotator is not None:
                rotator.close()  # before the counters are read
                rotations, rotator = rotator.answers.count("rotated"), None
            wal = pg.wal_bytes(conn, lsn)
            pg.flush_stats(conn)
            after = pg.table_counters(conn, table)
        finally:
            if rotator is not None:
                rotator.close()
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
        "rotations": rotations,
    }


@row(
    "hostile.held_xmin",
    "hostile",
    "held xmin horizon",
    "A steady queue (enqueue 1, claim 1, ack; depth 1,000; 2 clients) while a REPEATABLE READ "
    "transaction holds its snapshot for the whole run, against the same run without it; ours with "
    "nothing rotating its storage and with alk.rotate_jobs() every second, and the floor. Target: "
    "held-xmin throughput within 20% of the clean run, judged with the storage rotated.",
)
def held_xmin(ctx: Context) -> RowResult:
    started = time.perf_counter()
    records: list[dict[str, Any]] = []
    ctx.progress.start("held xmin horizon", total=2 * len(SIDES))
    with ctx.server.fresh_db("alk_bench_xmin") as db:
        results: dict[tuple[str, bool], dict[str, Any]] = {}
        for side in SIDES:
            for held in (False, True):
                results[(side, held)] = _run(ctx, db, side, held)
                ctx.progress.advance()
    for side in SIDES:
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
                    "rotations": r["rotations"],
                }
            )
    ratio = {side: results[(side, True)]["jobs/s"] / results[(side, False)]["jobs/s"] for side in (OURS, ROTATED)}
    return RowResult(
        key="hostile.held_xmin",
        title="held xmin horizon",
        status="ok",
        columns=["side", "run", "jobs/s", "held/clean", "dead tuples/job", "bytes/job", "WAL bytes/job", "vacuums",
                 "rotations"],
        records=records,
        notes=[
            f"{ctx.mode.xmin_seconds:g} s per run, {CLIENTS} pgbench clients, synchronous_commit off. "
            "dead tuples/job: growth of pg_stat_user_tables.n_dead_tup over the run / jobs; bytes/job: growth of "
            "pg_total_relation_size / jobs (both summed over alk.jobs' partitions); WAL bytes/job: "
            "pg_current_wal_lsn() difference / jobs (one job = enqueue + claim + ack); rotations: the calls that "
            "answered 'rotated'.",
            f"ours held/clean = {ratio[ROTATED]:.2f} with alk.rotate_jobs() every {ROTATE_EVERY:g} s, "
            f"{ratio[OURS]:.2f} with nothing rotating the storage (target >= 0.80, judged with it rotated).",
        ],
        extra={"raw": {f"{s}:{'held' if h else 'clean'}": v for (s, h), v in results.items()}},
        seconds=time.perf_counter() - started,
    )


#: This module's rows, in report order (bench/rows.py collects them).
ROWS: tuple[Row, ...] = (held_xmin,)
