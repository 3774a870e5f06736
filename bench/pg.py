"""Shared helpers: run pgbench, fill tables, read counters."""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from bench.registry import Context
from bench.server import PGBENCH_SCRIPTS, pgbench_path, run_checked

PAYLOAD = '{"to": "user@example.com", "n": 1}'
QUEUE = "bench"
FILL_CHUNK = 50_000
#: pgbench runs a transaction that hit a deadlock or serialization failure
#: up to this many times, as any client would (the floor's one-statement
#: settle-and-claim deadlocks in about 1 of 10,000 transactions at 4
#: clients); retries are counted, and a failure after the last try still
#: fails the row.
MAX_TRIES = 5


@dataclass
class PgbenchResult:
    tps: float
    transactions: int
    failed: int
    latency_ms: float | None
    seconds: float
    command: str
    retried: int = 0  # transactions run again after a deadlock or serialization failure

    def jobs_per_s(self, jobs_per_tx: int) -> float:
        return self.tps * jobs_per_tx


_TPS = re.compile(r"^tps = ([0-9.]+) \(without initial connection time\)", re.M)
_DONE = re.compile(r"^number of transactions actually processed: (\d+)", re.M)
_FAILED = re.compile(r"^number of failed transactions: (\d+)", re.M)
_RETRIED = re.compile(r"^number of transactions retried: (\d+)", re.M)
_LATENCY = re.compile(r"^latency average = ([0-9.]+) ms", re.M)


def pgbench(
    ctx: Context,
    dbname: str,
    script: str,
    clients: int,
    *,
    transactions: int | None = None,
    seconds: float | None = None,
    defines: dict[str, Any] | None = None,
) -> PgbenchResult:
    """Run one pgbench script (a file in bench/pgbench/) and parse its summary.

    Prepared protocol (what psycopg does after a few executions); threads =
    min(clients, cores); no pgbench vacuum (our tables are not pgbench's).
    """
    import os

    threads = max(1, min(clients, os.cpu_count() or 1))
    args = [pgbench_path(), "-n", "-M", "prepared", "-c", str(clients), "-j", str(threads),
            "--max-tries", str(MAX_TRIES)]
    if transactions is not None:
        args += ["-t", str(transactions)]
    else:
        args += ["-T", str(max(1, round(seconds or 1)))]
    for key, value in (defines or {}).items():
        args += ["-D", f"{key}={value}"]
    args += ["-f", str(PGBENCH_SCRIPTS / script)]
    env = ctx.server.libpq_env(dbname)
    if ctx.session_options:
        env["PGOPTIONS"] = ctx.session_options
    started = time.perf_counter()
    proc = run_checked(args, env, timeout=900)
    elapsed = time.perf_counter() - started
    out = proc.stdout
    tps = _TPS.search(out)
    done = _DONE.search(out)
    if not tps or not done:
        raise RuntimeError(f"cannot parse pgbench output:\n{out}\n{proc.stderr}")
    failed = _FAILED.search(out)
    latency = _LATENCY.search(out)
    n_failed = int(failed.group(1)) if failed else 0
    retried = _RETRIED.search(out)
    if n_failed:
        raise RuntimeError(f"pgbench {script}: {n_failed} failed transactions\n{proc.stderr[-2000:]}")
    if "aborted" in proc.stderr or "client aborted" in out:
        raise RuntimeError(f"pgbench {script}: a client aborted\n{proc.stderr[-2000:]}")
    return PgbenchResult(
        tps=float(tps.group(1)),
        transactions=int(done.group(1)),
        failed=n_failed,
        latency_ms=float(latency.group(1)) if latency else None,
        seconds=elapsed,
        command=" ".join(args[1:]),
        retried=int(retried.group(1)) if retried else 0,
    )


def connect(ctx: Context, dbname: str) -> psycopg.Connection[Any]:
    return psycopg.connect(ctx.server.dsn_for(dbname), autocommit=True)


def fill_ours(conn: psycopg.Connection[Any], n: int, queue: str = QUEUE, progress: Any = None) -> None:
    """n pending jobs through alk.enqueue_batch, in large batches."""
    left = n
    while left > 0:
        k = min(FILL_CHUNK, left)
        conn.execute(
            "SELECT count(*) FROM alk.enqueue_batch(%s, array_fill(%s::jsonb, ARRAY[%s::int]))",
            [queue, PAYLOAD, k],
        )
        left -= k
        if progress is not None:
            progress.advance(k)


def fill_floor(conn: psycopg.Connection[Any], n: int, queue: str = QUEUE, table: str = "alk_floor.jobs") -> None:
    """n pending jobs in a floor table (alk_floor.jobs or alk_floor.rotating_jobs)."""
    conn.execute(
        f"INSERT INTO {table} (queue, payload, run_at)"  # type: ignore[arg-type]  # one of bench/floor.sql's
        " SELECT %s, %s::jsonb, extract(epoch FROM clock_timestamp())::bigint FROM generate_series(1, %s)",
        [queue, PAYLOAD, n],
    )


def reset_tables(conn: psycopg.Connection[Any]) -> None:
    """Empty both job tables (a benchmark-only shortcut; users call alk.*)."""
    conn.execute("TRUNCATE alk.jobs, alk_floor.jobs, alk_floor.rotating_jobs")


def settle(conn: psycopg.Connection[Any], *tables: str) -> None:
    """Same starting line for every measurement: vacuumed, analyzed,
    checkpointed. No tables: the whole database."""
    for table in tables or ("",):
        conn.execute(f"VACUUM (ANALYZE) {table}")  # type: ignore[arg-type]
    conn.execute("CHECKPOINT")


def has_function(name: str) -> Any:
    """A ``requires`` check: the installed pyalk defines function ``name``."""

    def check(ctx: Context) -> str | None:
        from pyalk.schema.install import install_script

        if f"CREATE FUNCTION {name}(" in install_script() or f"CREATE OR REPLACE FUNCTION {name}(" in install_script():
            return None
        return f"{name} does not exist yet"

    return check


def percentiles(samples: Sequence[float], points: Sequence[float] = (50, 90, 99)) -> dict[str, float]:
    if not samples:
        return {f"p{int(p)}": float("nan") for p in points}
    ordered = sorted(samples)
    result: dict[str, float] = {}
    for p in points:
        # nearest-rank percentile
        index = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
        result[f"p{int(p)}"] = ordered[index]
    result["mean"] = statistics.fmean(ordered)
    return result


def table_counters(conn: psycopg.Connection[Any], table: str) -> dict[str, int]:
    """Cumulative counters and total size of ``table``, summed over its
    partitions when it is partitioned (alk.jobs since 0031: the parent has
    no statistics row and no storage of its own)."""
    row = conn.execute(
        "SELECT sum(s.n_tup_ins), sum(s.n_tup_upd), sum(s.n_tup_del), sum(s.n_live_tup), sum(s.n_dead_tup),"
        " sum(s.n_tup_hot_upd), sum(coalesce(s.vacuum_count + s.autovacuum_count, 0)),"
        " sum(pg_total_relation_size(t.relid))"
        # The leaves of its partition tree, or the plain table itself (which has no tree).
        " FROM (SELECT relid FROM pg_partition_tree(%(t)s::regclass) WHERE isleaf"
        "       UNION SELECT oid FROM pg_class WHERE oid = %(t)s::regclass AND relkind = 'r') t"
        " LEFT JOIN pg_stat_user_tables s ON s.relid = t.relid",
        {"t": table},
    ).fetchone()
    keys = ("ins", "upd", "del", "live", "dead", "hot_upd", "vacuums", "bytes")
    return dict(zip(keys, (int(v or 0) for v in row), strict=True)) if row else dict.fromkeys(keys, 0)


def wal_lsn(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


def wal_bytes(conn: psycopg.Connection[Any], since: str) -> int:
    row = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s::pg_lsn)::bigint", [since]).fetchone()
    assert row is not None
    return int(row[0])


def flush_stats(conn: psycopg.Connection[Any]) -> None:
    """Let other backends' cumulative statistics reach shared memory (they
    flush at most once a second), then drop this session's snapshot."""
    time.sleep(1.2)
    conn.execute("SELECT pg_stat_clear_snapshot()")
