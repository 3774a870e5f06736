"""Issue 27 §7: what operating pyalk costs the hot path. The worker registry
(100 registered workers beating on the documented interval) against none,
and a queue that keeps completed jobs (alk.set_queue_retention) against one
that deletes them at ack. Both rows drain the same pre-filled backlog with
the sql rows' pgbench scripts, A and B interleaved in one run (the order
flips each round), and report per-round ratios and their median.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from bench import pg
from bench.registry import Context, Row, RowResult, row

#: The registry under test: this many workers, each beating every BEAT_S
#: seconds (alk.worker_beat's documented interval, sql/workers.sql).
WORKERS = 100
BEAT_S = 5.0
#: What a queue with retention on keeps its completed jobs for.
RETENTION_S = 3600
#: Clients of every measured run (the machine's cores, not more).
CLIENTS = 2


@dataclass(frozen=True)
class Sizes:
    rounds: int  # A/B pairs, the order flipped each round
    claim1_jobs: int  # jobs drained per run by claim 1 + ack
    claim100_jobs: int  # jobs drained per run by claim 100 + ack_batch


QUICK_SIZES = Sizes(rounds=2, claim1_jobs=200, claim100_jobs=2_000)
#: Full: a claim 100 run lasts several beat intervals, so every run sees the
#: registry's steady beat rate, not a lucky gap.
FULL_SIZES = Sizes(rounds=7, claim1_jobs=20_000, claim100_jobs=300_000)

#: The registry target: the hot path with the registry over without (median of the rounds' ratios).
REGISTRY_TARGET = 0.98


def sizes(ctx: Context) -> Sizes:
    return QUICK_SIZES if ctx.mode.quick else FULL_SIZES


class Beater:
    """One connection standing in for WORKERS registered workers: it registers
    them, then beats each every BEAT_S seconds, the beats spread evenly over
    the interval (one every BEAT_S / WORKERS seconds), as independent workers'
    beats fall. Times each beat (for the report's "what limits us")."""

    def __init__(self, ctx: Context, db: str) -> None:
        self.conn = pg.connect(ctx, db)
        backend = self.conn.execute("SELECT pg_backend_pid()").fetchone()
        assert backend is not None
        self.backend_pid = int(backend[0])
        self.ids = [f"bench-worker-{i:03d}" for i in range(WORKERS)]
        for wid in self.ids:
            self.conn.execute(
                "SELECT alk.worker_register(%s, %s, 'bench-host', %s, 10, 'bench')", [wid, pg.QUEUE, os.getpid()]
            )
        self.beat_seconds: list[float] = []
        #: CPU seconds the beating thread itself has used (this process, the same cores).
        self.client_cpu_s = 0.0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        step = BEAT_S / WORKERS
        due = time.monotonic()
        i = 0
        try:
            while not self._stop.wait(max(0.0, due - time.monotonic())):
                t0 = time.perf_counter()
                stopping = self.conn.execute(
                    "SELECT alk.worker_beat(%s, 10)", [self.ids[i % WORKERS]], prepare=True
                ).fetchone()
                self.beat_seconds.append(time.perf_counter() - t0)
                self.client_cpu_s = time.thread_time()
                if stopping is None or stopping[0] is None:
                    raise RuntimeError(f"worker {self.ids[i % WORKERS]} lost its registry row")
                i += 1
                # A late beat does not make the next ones come faster: a
                # fleet of workers does not catch up on missed beats either.
                due = max(due + step, time.monotonic())
        except BaseException as error:  # reported by close(), not lost in the thread
            self.error = error

    def beats(self) -> int:
        return len(self.beat_seconds)

    def backend_cpu_s(self) -> float | None:
        """CPU seconds the beating connection's backend has used (user +
        system, /proc); None when the server is not on this machine."""
        try:
            fields = Path(f"/proc/{self.backend_pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)
        for wid in self.ids:
            self.conn.execute("SELECT alk.worker_deregister(%s)", [wid])
        self.conn.close()
        if self.error:
            raise RuntimeError(f"the bench beater failed: {self.error!r}")


def _fill(conn: psycopg.Connection[Any], per_tx: int, jobs: int) -> int:
    """Empty the table, fill a backlog of about ``jobs`` for CLIENTS clients
    and settle it; returns the transactions each client runs (pgbench -t)."""
    conn.execute("TRUNCATE alk.jobs")  # a benchmark-only shortcut to the same starting line
    per_client = max(1, jobs // (CLIENTS * per_tx))
    pg.fill_ours(conn, per_client * CLIENTS * per_tx)
    pg.settle(conn, "alk.jobs")
    return per_client


def _drain(ctx: Context, db: str, conn: psycopg.Connection[Any], script: str, per_tx: int,
           per_client: int) -> tuple[pg.PgbenchResult, float]:
    """Drain the backlog with ``script``: pgbench's result and WAL bytes per job."""
    lsn = pg.wal_lsn(conn)
    result = pg.pgbench(ctx, db, script, CLIENTS, transactions=per_client)
    return result, pg.wal_bytes(conn, lsn) / max(1, result.transactions * per_tx)


def _spread(ratios: list[float]) -> str:
    return f"{min(ratios):.3f}-{max(ratios):.3f}"


@row(
    "ops.registry_cost",
    "sql",
    "hot path with 100 registered workers beating",
    f"claim 100 + ack_batch jobs/s of {CLIENTS} clients (pgbench, alk_claim_100_ack_batch.sql) with {WORKERS} "
    f"registered workers beating every {BEAT_S:g} s (one connection issuing alk.worker_beat for each, spread over "
    "the interval) vs an empty registry, interleaved rounds in one run (the order flips each round); per round "
    "with / without, then the median ratio and its spread.",
    requires=pg.has_function("alk.worker_beat"),
)
def registry_cost(ctx: Context) -> RowResult:
    started = time.perf_counter()
    size = sizes(ctx)
    setups = ("without", "with")
    rates: dict[str, list[float]] = {name: [] for name in setups}
    beats_per_s: list[float] = []
    beat_ms: list[float] = []
    beat_cpu: list[float] = []  # the beating backend's CPU over each run, share of a core
    client_cpu: list[float] = []  # the beating thread's CPU over each run, share of a core
    raw: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    ctx.progress.start("registry cost", total=size.rounds * 2)
    with ctx.server.fresh_db("alk_bench_ops", floor=False) as db, pg.connect(ctx, db) as conn:
        for r in range(size.rounds):
            for name in setups if r % 2 == 0 else setups[::-1]:
                beater = Beater(ctx, db) if name == "with" else None
                try:
                    per_client = _fill(conn, 100, size.claim100_jobs)
                    before = beater.beats() if beater else 0
                    cpu_before = beater.backend_cpu_s() if beater else None
                    client_before = beater.client_cpu_s if beater else 0.0
                    result, _ = _drain(ctx, db, conn, "alk_claim_100_ack_batch.sql", 100, per_client)
                    if beater:
                        beats_per_s.append((beater.beats() - before) / result.seconds)
                        beat_ms.extend(s * 1000 for s in beater.beat_seconds)
                        client_cpu.append((beater.client_cpu_s - client_before) / result.seconds)
                        cpu_after = beater.backend_cpu_s()
                        if cpu_before is not None and cpu_after is not None:
                            beat_cpu.append((cpu_after - cpu_before) / result.seconds)
                finally:
                    if beater:
                        beater.close()
                rates[name].append(result.jobs_per_s(100))
                raw.append({"round": r + 1, "setup": name, **result.__dict__})
                ctx.progress.advance()
    load_after = os.getloadavg()
    ratios = [w / wo for w, wo in zip(rates["with"], rates["without"], strict=True)]
    records = [
        {"setup": "empty registry", "jobs/s p50": round(statistics.median(rates["without"]))},
        {
            "setup": f"{WORKERS} workers beating every {BEAT_S:g} s",
            "jobs/s p50": round(statistics.median(rates["with"])),
            "with/without p50": round(statistics.median(ratios), 3),
            "with/without min-max": _spread(ratios),
            "beats/s": round(statistics.median(beats_per_s), 1),
            "beat ms p50": round(statistics.median(beat_ms), 3) if beat_ms else None,
            "beats' backend CPU": f"{statistics.median(beat_cpu):.2%}" if beat_cpu else None,
            "beats' client CPU": f"{statistics.median(client_cpu):.2%}" if client_cpu else None,
        },
    ]
    return RowResult(
        key="ops.registry_cost",
        title="hot path with 100 registered workers beating",
        status="ok",
        columns=["setup", "jobs/s p50", "with/without p50", "with/without min-max", "beats/s", "beat ms p50",
                 "beats' backend CPU", "beats' client CPU"],
        records=records,
        notes=[
            f"{size.rounds} interleaved rounds, {CLIENTS} clients draining {size.claim100_jobs:,} jobs per run; "
            f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after ({os.cpu_count()} cores).",
            "Every round's jobs/s: " + "; ".join(f"{n}: {[round(x) for x in rates[n]]}" for n in setups)
            + f"; beat round trips timed in the beating connection (p50 over {len(beat_ms)}; durable commits, "
            "as a worker's beats); its backend's CPU from /proc and the beating thread's own CPU "
            "(time.thread_time) over each run (median share of a core).",
        ],
        extra={"pgbench": raw, "ratios": ratios, "beats_per_s": beats_per_s},
        seconds=time.perf_counter() - started,
    )


RETENTION_SCRIPTS = (
    ("claim 1 + ack", "alk_claim_1_ack.sql", 1),
    ("claim 100 + ack_batch", "alk_claim_100_ack_batch.sql", 100),
)


@row(
    "ops.retention_cost",
    "sql",
    "hot path with completed-job retention on",
    f"claim 1 + ack and claim 100 + ack_batch jobs/s of {CLIENTS} clients (pgbench, the sql rows' scripts) on a "
    f"queue that keeps acked jobs as completed (alk.set_queue_retention 3600 s: the ack updates the row) vs one "
    "that deletes them at ack (retention 0, the default), interleaved rounds (the order flips each round); per "
    "round on / off, the median ratio and its spread, and WAL bytes per job. No target: the cost is stated.",
    requires=pg.has_function("alk.set_queue_retention"),
)
def retention_cost(ctx: Context) -> RowResult:
    started = time.perf_counter()
    size = sizes(ctx)
    records: list[dict[str, Any]] = []
    raw: list[dict[str, Any]] = []
    notes: list[str] = []
    load_before = os.getloadavg()
    ctx.progress.start("retention cost", total=size.rounds * 2 * len(RETENTION_SCRIPTS))
    with ctx.server.fresh_db("alk_bench_ops", floor=False) as db, pg.connect(ctx, db) as conn:
        for title, script, per_tx in RETENTION_SCRIPTS:
            jobs = size.claim1_jobs if per_tx == 1 else size.claim100_jobs
            rates: dict[int, list[float]] = {0: [], RETENTION_S: []}
            wal: dict[int, list[float]] = {0: [], RETENTION_S: []}
            for r in range(size.rounds):
                for keep in (0, RETENTION_S) if r % 2 == 0 else (RETENTION_S, 0):
                    conn.execute("SELECT alk.set_queue_retention(%s, %s)", [pg.QUEUE, keep])
                    result, wal_per_job = _drain(ctx, db, conn, script, per_tx, _fill(conn, per_tx, jobs))
                    # Every acked job kept when on, none when off: the setting took.
                    found = conn.execute("SELECT count(*) FROM alk.jobs WHERE state = 'completed'").fetchone()
                    expected = result.transactions * per_tx if keep else 0
                    if found is None or found[0] != expected:
                        raise RuntimeError(f"retention {keep} s: {found} completed jobs, expected {expected}")
                    rates[keep].append(result.jobs_per_s(per_tx))
                    wal[keep].append(wal_per_job)
                    raw.append({"script": script, "round": r + 1, "retention_s": keep, "wal_per_job": wal_per_job,
                                **result.__dict__})
                    ctx.progress.advance()
            ratios = [on / off for on, off in zip(rates[RETENTION_S], rates[0], strict=True)]
            records.append({
                "hot path": title,
                "retention 0 jobs/s": round(statistics.median(rates[0])),
                f"retention {RETENTION_S} s jobs/s": round(statistics.median(rates[RETENTION_S])),
                "on/off p50": round(statistics.median(ratios), 3),
                "on/off min-max": _spread(ratios),
                "off WAL B/job": round(statistics.median(wal[0])),
                "on WAL B/job": round(statistics.median(wal[RETENTION_S])),
            })
            notes.append(f"{title} every round's jobs/s: off {[round(x) for x in rates[0]]}, "
                         f"on {[round(x) for x in rates[RETENTION_S]]}")
        conn.execute("SELECT alk.set_queue_retention(%s, 0)", [pg.QUEUE])
    load_after = os.getloadavg()
    return RowResult(
        key="ops.retention_cost",
        title="hot path with completed-job retention on",
        status="ok",
        columns=list(records[0]),
        records=records,
        notes=[
            f"{size.rounds} interleaved rounds, {CLIENTS} clients; load average {load_before[0]:.2f} before, "
            f"{load_after[0]:.2f} after ({os.cpu_count()} cores).",
            "Retention on: the ack keeps the job as completed (an UPDATE of the row) where off deletes it; "
            "each run starts from an emptied table, so completed rows never pile up across runs.",
            *notes,
        ],
        extra={"pgbench": raw},
        seconds=time.perf_counter() - started,
    )


#: This module's rows, in report order (bench/rows.py collects them).
ROWS: tuple[Row, ...] = (registry_cost, retention_cost)
