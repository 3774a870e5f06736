"""Issue 7 §1: SQL-level rows. Each row runs a pgbench script that calls
alk.* and its floor twin (bare SQL on the plain table of bench/floor.sql) at
each client count, on the same database, one after the other, and reports
jobs/s and the ratio ours/floor.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import psycopg

from bench import pg
from bench.registry import Context, RowResult, row

Kind = Literal["enqueue", "claim", "publish", "read"]


@dataclass(frozen=True)
class Pair:
    key: str
    title: str
    ours: str
    floor: str
    per_tx: int  # jobs (or events) per pgbench transaction
    kind: Kind
    about: str


PAIRS: list[Pair] = [
    Pair(
        "sql.enqueue_1",
        "enqueue 1",
        "alk_enqueue_1.sql",
        "floor_enqueue_1.sql",
        1,
        "enqueue",
        "One alk.enqueue per transaction vs one bare INSERT.",
    ),
    Pair(
        "sql.enqueue_batch_100",
        "enqueue_batch 100",
        "alk_enqueue_batch_100.sql",
        "floor_enqueue_batch_100.sql",
        100,
        "enqueue",
        "One alk.enqueue_batch of 100 payloads per transaction vs one INSERT ... SELECT of 100 rows.",
    ),
    Pair(
        "sql.claim_1_ack",
        "claim 1 + ack",
        "alk_claim_1_ack.sql",
        "floor_claim_1_delete.sql",
        1,
        "claim",
        "alk.claim(n => 1) then alk.ack (two transactions, as a worker does) vs "
        "UPDATE ... WHERE id = (SELECT ... FOR UPDATE SKIP LOCKED LIMIT 1) then DELETE; "
        "both drain the same pre-filled backlog.",
    ),
    Pair(
        "sql.claim_100_ack_batch",
        "claim 100 + ack_batch",
        "alk_claim_100_ack_batch.sql",
        "floor_claim_100_delete.sql",
        100,
        "claim",
        "alk.claim(n => 100) then alk.ack_batch with the fencing tokens vs "
        "UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED LIMIT 100) then one DELETE.",
    ),
    Pair(
        "sql.publish_1",
        "publish 1",
        "alk_publish_1.sql",
        "floor_publish_1.sql",
        1,
        "publish",
        "One alk.publish per transaction vs one INSERT into an append-only table.",
    ),
    Pair(
        "sql.publish_100",
        "publish 100",
        "alk_publish_100.sql",
        "floor_publish_100.sql",
        100,
        "publish",
        "100 alk.publish calls in one statement vs one INSERT ... SELECT of 100 events.",
    ),
    Pair(
        "sql.publish_batch_100",
        "publish_batch 100",
        "alk_publish_batch_100.sql",
        "floor_publish_100.sql",
        100,
        "publish",
        "One alk.publish_batch of 100 events per transaction vs one INSERT ... SELECT of 100 events.",
    ),
    Pair(
        "sql.read_since_100",
        "read_since 100",
        "alk_read_since_100.sql",
        "floor_read_since_100.sql",
        100,
        "read",
        "alk.read_since 100 events after a random offset vs an index range scan with LIMIT 100.",
    ),
]

COLUMNS = [
    "clients",
    "ours jobs/s",
    "floor jobs/s",
    "ours/floor",
    "ours latency ms",
    "floor latency ms",
    "ours WAL B/job",
    "floor WAL B/job",
]


def _prepare(
    ctx: Context, conn: psycopg.Connection[Any], pair: Pair, side: str, clients: int, filled: set[str]
) -> dict[str, Any]:
    """Bring the table of ``side`` to its starting line; returns pgbench
    keyword arguments (how long to run)."""
    mode = ctx.mode
    if pair.kind == "enqueue":
        pg.reset_tables(conn)
        pg.settle(conn, "alk.jobs" if side == "ours" else "alk_floor.jobs")
        return {"seconds": mode.enqueue_seconds}
    if pair.kind == "claim":
        pg.reset_tables(conn)
        total = mode.claim1_jobs if pair.per_tx == 1 else mode.claim100_jobs
        per_client = max(1, total // (clients * pair.per_tx))
        backlog = per_client * clients * pair.per_tx
        if side == "ours":
            pg.fill_ours(conn, backlog)
        else:
            pg.fill_floor(conn, backlog)
        pg.settle(conn, "alk.jobs" if side == "ours" else "alk_floor.jobs")
        return {"transactions": per_client}
    # Streams: publishing appends (both tables grow alike, no reset needed);
    # reading needs a stream filled once per side.
    if pair.kind == "read" and side not in filled:
        events = mode.stream_events
        if side == "ours":
            conn.execute(
                "SELECT count(alk.publish('bench', p)) FROM unnest(array_fill(%s::jsonb, ARRAY[%s::int])) AS p",
                [pg.PAYLOAD, events],
            )
        else:
            conn.execute(
                "INSERT INTO alk_floor.events (stream, payload) SELECT 'bench', %s::jsonb FROM generate_series(1, %s)",
                [pg.PAYLOAD, events],
            )
        filled.add(side)
    pg.settle(conn)
    defines = {"max_after": max(0, mode.stream_events - 100)} if pair.kind == "read" else {}
    return {"seconds": mode.enqueue_seconds, "defines": defines}


def run_pair(ctx: Context, pair: Pair) -> RowResult:
    started = time.perf_counter()
    mode = ctx.mode
    records: list[dict[str, Any]] = []
    filled: set[str] = set()
    raw: list[dict[str, Any]] = []
    ctx.progress.start(f"{pair.title}: ours vs floor", total=len(mode.clients) * 2 * mode.repeats)
    with ctx.server.fresh_db("alk_bench_sql") as db, pg.connect(ctx, db) as conn:
        for clients in mode.clients:
            measured: dict[str, list[pg.PgbenchResult]] = {"ours": [], "floor": []}
            wal_per_job: dict[str, list[float]] = {"ours": [], "floor": []}
            for rep in range(mode.repeats):
                # Alternate who goes first so neither always runs on a warmer cache.
                order = ("ours", "floor") if rep % 2 == 0 else ("floor", "ours")
                for side in order:
                    kwargs = _prepare(ctx, conn, pair, side, clients, filled)
                    script = pair.ours if side == "ours" else pair.floor
                    lsn = pg.wal_lsn(conn)
                    result = pg.pgbench(ctx, db, script, clients, **kwargs)
                    wal = pg.wal_bytes(conn, lsn) / max(1, result.transactions * pair.per_tx)
                    measured[side].append(result)
                    wal_per_job[side].append(wal)
                    raw.append({"clients": clients, "side": side, "rep": rep, "wal_per_job": wal, **result.__dict__})
                    ctx.progress.advance()
            ours = statistics.median(r.jobs_per_s(pair.per_tx) for r in measured["ours"])
            floor = statistics.median(r.jobs_per_s(pair.per_tx) for r in measured["floor"])
            records.append(
                {
                    "clients": clients,
                    "ours jobs/s": round(ours, 1),
                    "floor jobs/s": round(floor, 1),
                    "ours/floor": round(ours / floor, 3) if floor else None,
                    "ours latency ms": _median_latency(measured["ours"]),
                    "floor latency ms": _median_latency(measured["floor"]),
                    "ours WAL B/job": round(statistics.median(wal_per_job["ours"])),
                    "floor WAL B/job": round(statistics.median(wal_per_job["floor"])),
                }
            )
    notes = [
        f"{pair.ours} vs {pair.floor}; jobs/s = pgbench tps x {pair.per_tx}; latency = pgbench's average per "
        "script run; WAL B/job = pg_current_wal_lsn() difference / jobs (includes full-page images after "
        "the CHECKPOINT that starts each run, alike for both)."
    ]
    if pair.kind == "claim":
        notes.append(
            "Each side drains a backlog it was given just before (VACUUM ANALYZE, CHECKPOINT), "
            "of clients x transactions x batch jobs: the same work for both."
        )
    return RowResult(
        key=pair.key,
        title=pair.title,
        status="ok",
        about=pair.about,
        columns=COLUMNS,
        records=records,
        notes=notes,
        extra={"pgbench": raw},
        seconds=time.perf_counter() - started,
    )


def _median_latency(results: list[pg.PgbenchResult]) -> float | None:
    values = [r.latency_ms for r in results if r.latency_ms is not None]
    return round(statistics.median(values), 3) if values else None


def _register(pair: Pair) -> None:
    requires: Callable[[Context], str | None] | None = None
    if pair.kind in ("publish", "read"):
        requires = pg.has_function("alk.publish")
    fn: Callable[[Context], RowResult] = lambda ctx: run_pair(ctx, pair)  # noqa: E731
    row(pair.key, "sql", pair.title, pair.about, requires=requires)(fn)


for _pair in PAIRS:
    _register(_pair)
