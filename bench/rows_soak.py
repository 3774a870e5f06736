"""Issue 25 §3: soak rows. Many runs of N no-op jobs back to back on ONE
database per system, pyalk's async worker against graphile-worker in the
same run, so what each run leaves behind (dead row versions, index entries,
bloat) weighs on the next one, as it does in production.

The runs reuse the end-to-end runners (bench/peers/): each run enqueues N
jobs with the system's bulk API, then its burst worker processes them; the
systems take turns run by run (pyalk run 1, graphile-worker run 1, pyalk
run 2, ...), each in its own database on the same server, with the server's
autovacuum. ``soak.held`` does the same while one REPEATABLE READ
transaction per database holds its snapshot for the whole soak, then
releases it and records the queue tables' size once autovacuum has been by.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from bench import pg, rows_e2e
from bench.peers import pyalk_worker
from bench.registry import Context, Row, RowResult, row

#: (runs, jobs per run) by mode; ALK_BENCH_SOAK="5,50000" overrides it (a
#: medium soak on a loaded machine).
SOAK: dict[str, tuple[int, int]] = {"quick": (2, 500), "full": (10, 100_000)}
SOAK_ENV = "ALK_BENCH_SOAK"
CONCURRENCY = 10
#: The runs whose best is the reference of "no decay".
EARLY_RUNS = 3

PYALK = "pyalk (async)"
REFERENCE = rows_e2e.REFERENCE
#: label -> runner in rows_e2e.PEERS, pyalk first.
SYSTEMS: dict[str, str] = {PYALK: "pyalk", REFERENCE: "graphile-worker"}

#: The tables that hold each system's jobs (with their indexes, and their
#: partitions if they are partitioned): the queue's storage the held row sizes.
QUEUE_TABLES: dict[str, tuple[str, ...]] = {
    PYALK: ("alk.jobs",),
    REFERENCE: ("graphile_worker._private_jobs", "graphile_worker._private_job_queues"),
}

#: What the holder runs once its REPEATABLE READ transaction has begun: it
#: takes the snapshot and reads a catalog, no job table.
HOLDER_SQL = "SELECT count(*) FROM pg_class"

#: How long the held row waits for autovacuum after the release: full mode
#: at least this, or 5 naptimes; quick mode this long, then a plain VACUUM.
VACUUM_WAIT_FULL = 300.0
VACUUM_WAIT_QUICK = 3.0
#: The most alk.rotate_jobs calls one rotation after the release may take
#: (each moves at most 20,000 rows).
MAX_ROTATION_CALLS = 20


@dataclass(frozen=True)
class Targets:
    """Issue 25's bar for one soak row."""

    worst_vs_best: float  # the worst run / the best of the first EARLY_RUNS
    median_vs_reference: float  # pyalk's median / graphile-worker's median
    size_vs_empty: float | None = None  # queue bytes after the release and a vacuum / empty


CHURN_TARGETS = Targets(worst_vs_best=0.9, median_vs_reference=1.5)
HELD_TARGETS = Targets(worst_vs_best=0.8, median_vs_reference=1.5, size_vs_empty=2.0)
#: The held row's bar, kept with a standing backlog of jobs scheduled ahead
#: (size: against the tables holding the backlog alone).
BACKLOG_TARGETS = HELD_TARGETS
#: The backlog row's jobs scheduled a day ahead in another queue: over the
#: 20,000 live jobs a rotation moved in one call until 0044.
BACKLOG = {"quick": 3_000, "full": 30_000}


def soak_size(ctx: Context) -> tuple[int, int]:
    """(runs, jobs per run): the mode's, or the ALK_BENCH_SOAK override."""
    text = os.environ.get(SOAK_ENV, "").strip()
    if not text:
        return SOAK.get(ctx.mode.name, SOAK["full"])
    runs, jobs = (int(part) for part in text.split(","))
    if runs < 1 or jobs < 1:
        raise ValueError(f"{SOAK_ENV} must be 'runs,jobs' with both >= 1, got {text!r}")
    return runs, jobs


@dataclass(frozen=True)
class Summary:
    """One system's runs, in order."""

    rates: tuple[float, ...]

    @property
    def best_early(self) -> float:
        return max(self.rates[:EARLY_RUNS])

    @property
    def best_early_run(self) -> int:  # 1-based
        return self.rates.index(self.best_early) + 1

    @property
    def worst(self) -> float:
        return min(self.rates)

    @property
    def worst_run(self) -> int:  # 1-based
        return self.rates.index(self.worst) + 1

    @property
    def worst_vs_best(self) -> float:
        return self.worst / self.best_early

    @property
    def median(self) -> float:
        return statistics.median(self.rates)


# -- the database side ------------------------------------------------------------


#: The tables of a list of names (%s, text[]) that hold rows: each table
#: itself or, when partitioned, its partitions; names that do not exist
#: yet count nothing.
LEAVES = (
    "WITH roots AS (SELECT to_regclass(t.name) AS root FROM unnest(%s::text[]) AS t(name)"
    " WHERE to_regclass(t.name) IS NOT NULL),"
    " leaves AS (SELECT c.oid AS relid FROM pg_class c"
    " WHERE c.relkind = 'r' AND (c.oid IN (SELECT root FROM roots)"
    " OR c.oid IN (SELECT p.relid FROM roots, pg_partition_tree(root) AS p))) "
)


def queue_sizes(conn: psycopg.Connection[Any], system: str) -> dict[str, int]:
    """Heap (with TOAST and maps) and index bytes of the system's job tables
    and their partitions; tables that do not exist count nothing."""
    row_ = conn.execute(
        LEAVES + "SELECT coalesce(sum(pg_table_size(relid)), 0)::bigint,"
        " coalesce(sum(pg_indexes_size(relid)), 0)::bigint FROM leaves",
        [list(QUEUE_TABLES[system])],
    ).fetchone()
    heap, indexes = (int(v) for v in row_) if row_ else (0, 0)
    return {"heap": heap, "indexes": indexes, "total": heap + indexes}


def _leaf_stats(conn: psycopg.Connection[Any], system: str) -> list[tuple[str, int, int]]:
    """(relation, n_dead_tup, autovacuum_count) of each leaf of the job tables."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    rows_ = conn.execute(
        LEAVES + "SELECT l.relid::regclass::text, s.n_dead_tup, s.autovacuum_count"
        " FROM leaves l JOIN pg_stat_user_tables s ON s.relid = l.relid ORDER BY 1",
        [list(QUEUE_TABLES[system])],
    ).fetchall()
    return [(str(name), int(dead), int(vacuums)) for name, dead, vacuums in rows_]


def table_state(conn: psycopg.Connection[Any], system: str) -> dict[str, int]:
    """Sizes, dead tuples and autovacuums so far of the system's job tables
    (the statistics as the server shows them now: up to a second behind)."""
    leaves = _leaf_stats(conn, system)
    return {
        **queue_sizes(conn, system),
        "dead_tuples": sum(dead for _name, dead, _vacuums in leaves),
        "autovacuums": sum(vacuums for _name, _dead, vacuums in leaves),
    }


def server_activity(conns: dict[str, psycopg.Connection[Any]]) -> dict[str, int]:
    """Counters of what the whole server does beside the runs: checkpoints
    done, autovacuums of any table of the soak's databases, WAL written. The
    difference across a run is what ran beside it: on 2 shared cores a
    checkpoint's writes or a vacuum of the other system's tables slow a run
    as much as anything in the run itself."""
    conn = next(iter(conns.values()))
    version = conn.info.server_version
    checkpoints_sql = ("SELECT num_done FROM pg_stat_checkpointer" if version >= 170000
                       else "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter")
    checkpoints = conn.execute(checkpoints_sql).fetchone()
    wal = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    vacuums = 0
    for c in conns.values():
        c.execute("SELECT pg_stat_clear_snapshot()")
        found = c.execute("SELECT coalesce(sum(autovacuum_count), 0)::bigint FROM pg_stat_user_tables").fetchone()
        vacuums += int(found[0]) if found else 0
    return {
        "checkpoints": int(checkpoints[0]) if checkpoints else 0,
        "autovacuums": vacuums,
        "wal_bytes": int(wal[0]) if wal else 0,
    }


#: The server's own processes whose CPU a run shares the cores with, by the
#: title PostgreSQL gives them (/proc/PID/cmdline).
UPKEEP = ("autovacuum worker", "checkpointer", "background writer", "walwriter")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class UpkeepCpu:
    """CPU seconds the server's upkeep processes (:data:`UPKEEP`) spend while
    a run goes on, sampled from /proc every ``interval`` seconds on a thread:
    autovacuum workers come and go, so their counters are read while they
    live (the last interval of one that exits is missed). Empty where there
    is no /proc (the numbers are then not recorded)."""

    def __init__(self, interval: float = 0.1) -> None:
        self._interval = interval
        self._seen: dict[tuple[int, str], tuple[int, int]] = {}  # (pid, kind) -> (first, last) ticks
        self._kinds: dict[int, str | None] = {}  # pid -> its kind, None: not one to count (read once)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-upkeep-cpu", daemon=True)

    def __enter__(self) -> UpkeepCpu:
        if Path("/proc/self/stat").exists():
            self._sample()
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
            self._sample()

    def seconds(self) -> dict[str, float]:
        """CPU seconds by kind of process, over the run."""
        by_kind: dict[str, float] = {}
        for (_pid, kind), (first, last) in self._seen.items():
            by_kind[kind] = by_kind.get(kind, 0.0) + (last - first) / CLOCK_TICKS
        return {kind: round(value, 2) for kind, value in sorted(by_kind.items())}

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._sample()

    def _sample(self) -> None:
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            pid = int(proc.name)
            try:
                if pid not in self._kinds:  # each process's title is read once, not every sample
                    title = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    self._kinds[pid] = next((k for k in UPKEEP if title.startswith(f"postgres: {k}")), None)
                kind = self._kinds[pid]
                if kind is None:
                    continue
                fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # exited meanwhile
                continue
            ticks = int(fields[11]) + int(fields[12])  # utime, stime
            first, _last = self._seen.get((pid, kind), (ticks, ticks))
            self._seen[(pid, kind)] = (first, ticks)


def _beside(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {name: after[name] - before[name] for name in before}


def wait_for_autovacuum(
    conns: dict[str, psycopg.Connection[Any]], deadline: float, poll: float = 0.5
) -> dict[str, dict[str, float | None]]:
    """Wait until autovacuum has run on every leaf with dead tuples, a run
    that started after now (one in progress now does not count: its horizon
    is from before), or until ``deadline`` (time.monotonic()). By system and
    leaf: seconds until pg_stat_user_tables showed it, None if it did not."""
    started = time.monotonic()
    waiting: dict[tuple[str, str], int] = {}
    for system, conn in conns.items():
        running = {
            str(name)
            for (name,) in conn.execute(
                "SELECT relid::regclass::text FROM pg_stat_progress_vacuum WHERE datid = "
                "(SELECT oid FROM pg_database WHERE datname = current_database())"
            ).fetchall()
        }
        for name, dead, vacuums in _leaf_stats(conn, system):
            if dead > 0:
                waiting[(system, name)] = vacuums + (1 if name in running else 0)
    seen: dict[str, dict[str, float | None]] = {system: {} for system in conns}
    for system, name in waiting:
        seen[system][name] = None
    while waiting:
        for system, conn in conns.items():
            for name, _dead, vacuums in _leaf_stats(conn, system):
                if (system, name) in waiting and vacuums > waiting[(system, name)]:
                    del waiting[(system, name)]
                    seen[system][name] = round(time.monotonic() - started, 1)
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(poll)  # a poll of the statistics, bounded by the deadline
    return seen


def hold_snapshot(ctx: Context, db: str) -> psycopg.Connection[Any]:
    """A connection in REPEATABLE READ whose snapshot is taken and held (its
    backend_xmin is checked); closing it ends the transaction."""
    holder = psycopg.connect(ctx.server.dsn_for(db))
    holder.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    holder.execute(HOLDER_SQL)
    if holder_xmin(ctx, db, holder) is None:
        holder.close()
        raise RuntimeError("the REPEATABLE READ holder has no backend_xmin")
    return holder


def holder_xmin(ctx: Context, db: str, holder: psycopg.Connection[Any]) -> str | None:
    with pg.connect(ctx, db) as conn:
        found = conn.execute(
            "SELECT backend_xmin::text FROM pg_stat_activity WHERE pid = %s", [holder.info.backend_pid]
        ).fetchone()
    return str(found[0]) if found and found[0] else None


def install_graphile(ctx: Context, db: str) -> str | None:
    """graphile-worker's schema, installed empty (its CLI's --schema-only),
    so the held row can size it before the first job. Why not (None: done)."""
    node = shutil.which("node")
    if not node:
        return "node is not on PATH"
    module = Path(ctx.peers_dir or "node_modules") / "graphile-worker"
    if not (module / "package.json").exists():
        return f"graphile-worker is not installed under {module.parent}"
    with tempfile.TemporaryDirectory() as cwd:  # no graphile.config.* of anyone else's is picked up
        proc = subprocess.run(
            [node, str(module.resolve() / "dist" / "cli.js"), "--connection", ctx.server.url_for(db), "--schema-only"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    if proc.returncode != 0:
        raise RuntimeError(f"graphile-worker --schema-only failed: {(proc.stderr or proc.stdout)[-1000:]}")
    return None


def run_on(ctx: Context, runner: str, db: str, jobs: int, env: dict[str, str] | None = None) -> dict[str, Any]:
    """One run of a peer runner (bench/peers/) on an existing database: what
    rows_e2e.run_peer does on a fresh one."""
    timeout = 120 + jobs / 20  # a generous bound: 20 jobs/s
    args = [
        ctx.peers_python or sys.executable,
        "-m",
        rows_e2e.PEERS[runner],
        "--dsn",
        ctx.server.dsn_for(db),
        "--url",
        ctx.server.url_for(db),
        "--jobs",
        str(jobs),
        "--concurrency",
        str(CONCURRENCY),
        "--timeout",
        str(timeout),
    ]
    if ctx.peers_dir:
        args += ["--node-modules", ctx.peers_dir]
    proc = subprocess.run(
        args, capture_output=True, text=True, timeout=timeout + 30, check=False, env=dict(os.environ, **(env or {}))
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode == 3 and lines:
        return {"unavailable": json.loads(lines[-1])["unavailable"]}
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{runner} run failed ({proc.returncode}): {(proc.stderr or proc.stdout)[-1500:]}")
    return dict(json.loads(lines[-1]))


# -- the soak ---------------------------------------------------------------------


def _load() -> list[float] | None:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def _mib(n: int) -> float:
    return round(n / 2**20, 3)


def soak(ctx: Context, key: str, title: str, held: bool, backlog: int = 0) -> RowResult:
    started = time.perf_counter()
    runs, jobs = soak_size(ctx)
    load_start = _load()
    notes: list[str] = []
    per_run: dict[str, list[dict[str, Any]]] = {label: [] for label in SYSTEMS}
    sizes: dict[str, dict[str, dict[str, int]]] = {label: {} for label in SYSTEMS}
    vacuum: dict[str, str] = {}
    vacuum_seen: dict[str, dict[str, float | None]] = {}
    unavailable: dict[str, str] = {}
    with ExitStack() as stack:
        dbs = {
            PYALK: stack.enter_context(ctx.server.fresh_db("alk_bench_soak_pyalk", pyalk=True, floor=False)),
            REFERENCE: stack.enter_context(ctx.server.fresh_db("alk_bench_soak_graphile", pyalk=False, floor=False)),
        }
        reason = install_graphile(ctx, dbs[REFERENCE])
        if reason:
            unavailable[REFERENCE] = reason
        systems = [label for label in SYSTEMS if label not in unavailable]
        conns = {label: stack.enter_context(pg.connect(ctx, dbs[label])) for label in systems}
        for label in systems:
            if backlog:
                schedule_ahead(conns[label], label, backlog)
            sizes[label]["empty"] = queue_sizes(conns[label], label)
        holders: dict[str, psycopg.Connection[Any]] = {}
        xmins: dict[str, str | None] = {}
        if held:
            for label in systems:
                holders[label] = stack.enter_context(hold_snapshot(ctx, dbs[label]))
                xmins[label] = holder_xmin(ctx, dbs[label], holders[label])
        ctx.progress.start(title, total=runs * len(systems))
        for run_no in range(1, runs + 1):
            for label in list(systems):
                ctx.progress.note(f"{label}: run {run_no} of {runs} ({jobs:,} jobs)")
                env = {"ALK_BENCH_PYALK_VARIANT": "async"} if label == PYALK else None
                activity = server_activity(conns)
                with UpkeepCpu() as upkeep:
                    result = run_on(ctx, SYSTEMS[label], dbs[label], jobs, env=env)
                if "unavailable" in result:
                    unavailable[label] = result["unavailable"]
                    systems.remove(label)
                    continue
                result.update(table_state(conns[label], label), run=run_no,
                              beside={**_beside(activity, server_activity(conns)), "upkeep_cpu_s": upkeep.seconds()})
                per_run[label].append(result)
                ctx.progress.advance()
        if held:
            for label in systems:
                sizes[label]["end"] = queue_sizes(conns[label], label)
                if holder_xmin(ctx, dbs[label], holders[label]) != xmins[label]:
                    raise RuntimeError(f"{label}: the holder's backend_xmin moved during the soak")
                holders[label].close()  # rolls back: the horizon moves on
            wait = VACUUM_WAIT_QUICK if ctx.mode.quick else max(VACUUM_WAIT_FULL, 5 * _naptime(conns))
            vacuum_seen = wait_for_autovacuum({label: conns[label] for label in systems}, time.monotonic() + wait)
            for label in systems:
                missed = [name for name, after in vacuum_seen[label].items() if after is None]
                if not vacuum_seen[label]:
                    vacuum[label] = "no dead tuples"
                elif missed and ctx.mode.quick:
                    for name in missed:
                        conns[label].execute(f"VACUUM {name}")
                    vacuum[label] = "VACUUM (quick mode)"
                elif missed:
                    vacuum[label] = f"no autovacuum in {wait:.0f} s"
                else:
                    after = max((s for s in vacuum_seen[label].values() if s is not None), default=0.0)
                    vacuum[label] = f"autovacuum after {after:.0f} s"
                if label == PYALK:
                    # "Within one rotation": the one a worker's next jobs or a cron call make,
                    # in as many calls as it takes ('moving': 20,000 rows a call since 0044).
                    calls, answer = 0, "moving"
                    while answer == "moving" and calls < MAX_ROTATION_CALLS:
                        found = conns[label].execute("SELECT alk.rotate_jobs(0)").fetchone()
                        calls, answer = calls + 1, found[0] if found else None
                    vacuum[label] += f", then one rotation ({calls} alk.rotate_jobs(0) calls): {answer}"
                sizes[label]["after vacuum"] = queue_sizes(conns[label], label)
    records = _records(per_run, sizes, vacuum, unavailable, held)
    load_end = _load()
    notes.append(
        f"{runs} runs of {jobs:,} no-op jobs per system on one database each, c={CONCURRENCY}, the systems taking "
        f"turns run by run; load average (1/5/15 min) {load_start} at start, {load_end} at end."
    )
    if held:
        notes.append(
            f"Holder: one connection per database, BEGIN ISOLATION LEVEL REPEATABLE READ then `{HOLDER_SQL}` "
            "(a catalog, no job table), open from before run 1 until after the last run."
        )
        notes.append(
            "Queue MiB: pg_table_size + pg_indexes_size of "
            + "; ".join(f"{label} {', '.join(tables)}" for label, tables in QUEUE_TABLES.items())
            + "; empty (installed), at the end, after the release and a vacuum (pyalk: and one rotation)."
        )
    if backlog:
        notes.append(
            f"Backlog: {backlog:,} jobs due a day ahead in a queue no runner takes (pyalk: alk.enqueue_batch with "
            "delay => 86400; graphile-worker: graphile_worker.add_job with run_at => now() + 1 day), enqueued "
            "before the holder and the 'empty' size, so over 20,000 jobs are live for the whole soak."
        )
    for label, why in unavailable.items():
        notes.append(f"{label}: not run: {why}")
    return RowResult(
        key=key,
        title=title,
        status="ok",
        columns=_columns(held),
        records=records,
        notes=notes,
        extra={
            "runs": runs,
            "jobs": jobs,
            "backlog": backlog,
            "raw": per_run,
            "sizes": sizes,
            "vacuum_seen_after_s": vacuum_seen,
            "load_average": {"start": load_start, "end": load_end},
        },
        seconds=time.perf_counter() - started,
    )


def schedule_ahead(conn: psycopg.Connection[Any], system: str, jobs: int) -> None:
    """A standing backlog: jobs due a day from now, in a queue (a task) no
    runner of the soak takes, so they stay live through every run."""
    if system == PYALK:
        conn.execute("SELECT count(*) FROM alk.enqueue_batch('later', array_fill('{}'::jsonb, ARRAY[%s::int]),"
                     " delay => 86400)", [jobs])
    else:
        conn.execute("SELECT count(*) FROM (SELECT graphile_worker.add_job('later', '{}'::json,"
                     " run_at => now() + interval '1 day') FROM generate_series(1, %s)) j", [jobs])
    # The enqueue's counts reach the statistics before VACUUM sets the live
    # tuples: flushed after it (a backend flushes at most once a second),
    # they were added again, and the job tables said twice the backlog, which
    # pyalk's rotation reads above 100,000 live jobs (0048).
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("VACUUM ANALYZE")


def _naptime(conns: dict[str, psycopg.Connection[Any]]) -> float:
    conn = next(iter(conns.values()))
    found = conn.execute("SELECT setting::float FROM pg_settings WHERE name = 'autovacuum_naptime'").fetchone()
    return float(found[0]) if found else 60.0


def _columns(held: bool) -> list[str]:
    columns = [
        "system", "version", "runs jobs/s", "best early", "worst", "worst run", "worst/best", "median",
        f"median vs {REFERENCE}", "dead tuples at end", "autovacuums",
    ]
    if held:
        columns += ["queue MiB empty", "at end", "after vacuum", "after/empty", "vacuum"]
    return [*columns, "status"]


def _records(
    per_run: dict[str, list[dict[str, Any]]],
    sizes: dict[str, dict[str, dict[str, int]]],
    vacuum: dict[str, str],
    unavailable: dict[str, str],
    held: bool,
) -> list[dict[str, Any]]:
    summaries = {label: Summary(tuple(r["jobs_per_s"] for r in runs)) for label, runs in per_run.items() if runs}
    reference = summaries.get(REFERENCE)
    records: list[dict[str, Any]] = []
    for label in SYSTEMS:
        if label not in summaries:
            records.append({"system": label, "status": "pending" if label in unavailable else "error"})
            continue
        s, runs = summaries[label], per_run[label]
        rec: dict[str, Any] = {
            "system": label,
            "version": runs[0].get("version", ""),
            "runs jobs/s": ", ".join(f"{rate:,.0f}" for rate in s.rates),
            "best early": round(s.best_early, 1),
            "worst": round(s.worst, 1),
            "worst run": s.worst_run,
            "worst/best": round(s.worst_vs_best, 3),
            "median": round(s.median, 1),
            f"median vs {REFERENCE}": round(s.median / reference.median, 3) if reference else None,
            "dead tuples at end": runs[-1]["dead_tuples"],
            "autovacuums": runs[-1]["autovacuums"],
            # what the worst run started from: the table as the run before it left it
            "dead tuples before worst": runs[s.worst_run - 2]["dead_tuples"] if s.worst_run > 1 else 0,
            # what ran on the server beside the worst run and beside the best early one
            "beside worst": runs[s.worst_run - 1].get("beside"),
            "beside best early": runs[s.best_early_run - 1].get("beside"),
            "status": "ok",
        }
        if held:
            empty, end, after = (sizes[label][k] for k in ("empty", "end", "after vacuum"))
            rec.update({
                "queue MiB empty": _mib(empty["total"]),
                "at end": _mib(end["total"]),
                "after vacuum": _mib(after["total"]),
                "after/empty": round(after["total"] / empty["total"], 2) if empty["total"] else None,
                "heap MiB after vacuum": _mib(after["heap"]),
                "index MiB after vacuum": _mib(after["indexes"]),
                "vacuum": vacuum.get(label, ""),
            })
        records.append(rec)
    return records


@row(
    "soak.churn",
    "e2e",
    "soak: runs back to back on one database",
    "R runs of N no-op jobs back to back on one database per system (full: 10 of 100,000), pyalk's async worker "
    "at c=10 with its defaults and graphile-worker's preset at c=10, taking turns run by run, default "
    "autovacuum; jobs/s per run. Targets: pyalk's worst run >= 0.9 of its best of the first three, and its "
    "median >= 1.5x graphile-worker's.",
    requires=lambda ctx: pyalk_worker.missing(),
)
def soak_churn(ctx: Context) -> RowResult:
    return soak(ctx, "soak.churn", "soak: runs back to back on one database", held=False)


@row(
    "soak.held",
    "e2e",
    "soak under a held snapshot",
    "soak.churn while one REPEATABLE READ transaction per database holds its snapshot for the whole soak; then "
    "it ends, and the queue tables' size (with indexes) is read once autovacuum has run. Targets: pyalk's worst "
    "run >= 0.8 of its best early run, median >= 1.5x graphile-worker's, size back within 2x of empty.",
    requires=lambda ctx: pyalk_worker.missing(),
)
def soak_held(ctx: Context) -> RowResult:
    return soak(ctx, "soak.held", "soak under a held snapshot", held=True)


@row(
    "soak.backlog",
    "e2e",
    "soak under a held snapshot with a standing backlog",
    "soak.held with 30,000 jobs (quick: 3,000) scheduled a day ahead in another queue of each system before the "
    "soak, so more than 20,000 jobs stay live throughout (a slot of over 20,000 live jobs never rotated until "
    "0044). Targets: soak.held's, the size against the tables holding the backlog alone.",
    requires=lambda ctx: pyalk_worker.missing(),
)
def soak_backlog(ctx: Context) -> RowResult:
    backlog = BACKLOG.get(ctx.mode.name, BACKLOG["full"])
    return soak(ctx, "soak.backlog", "soak under a held snapshot with a standing backlog", held=True,
                backlog=backlog)


#: This module's rows, in report order (bench/rows.py collects them).
ROWS: tuple[Row, ...] = (soak_churn, soak_held, soak_backlog)
