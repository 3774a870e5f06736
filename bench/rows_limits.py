"""Issue 26 §8: what queue limits and serial groups cost the claim. Three
rows, each an A/B measured interleaved in one run on one server, through
alk.* only (no table internals), so they measure whatever the SQL does:

- ``limits.blocked_groups``: one claim behind 10^4 blocked serial groups vs
  the same claim on a queue without groups;
- ``limits.max_running``: a queue limited to max_running = 10 drained at
  concurrency 10 vs the same queue unlimited;
- ``limits.hot_path``: the hot path of a queue with no limits on the SQL as
  installed vs the SQL before limits existed (version 0028).
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

import psycopg

from bench import pg, rows_e2e
from bench.peers.pyalk_worker import MAX_RUNNING_ENV
from bench.registry import Context, Row, RowResult, row
from bench.server import install_pyalk

#: The targets (issue 26 §8): blocked groups / none at most this (claim p50);
#: limited / unlimited jobs/s at least this; installed / before-limits jobs/s at least this.
GROUPS_TARGET = 1.5
MAX_RUNNING_TARGET = 0.9
HOT_PATH_TARGET = 0.97
#: The limit under test and the concurrency that drains it.
MAX_RUNNING = 10
#: The last version before queue limits (0029_queue_limits): the hot path's baseline.
BEFORE_LIMITS = "0028"
#: Clients of the hot-path runs (the machine's cores, not more).
CLIENTS = 2


@dataclass(frozen=True)
class Sizes:
    groups: int  # blocked serial groups ahead of the claimable job
    claim_samples: int  # timed claims per side (blocked groups)
    rounds: int  # A/B pairs, the order flipped each round
    limit_jobs: int  # jobs drained per max_running run
    worker_jobs: int  # jobs a worker processes per max_running run
    claim1_jobs: int  # jobs drained per hot-path run by claim 1 + ack
    claim100_jobs: int  # ... by claim 100 + ack_batch
    enqueue_seconds: float  # pgbench -T of the enqueue runs


QUICK_SIZES = Sizes(groups=1_000, claim_samples=30, rounds=2, limit_jobs=1_000, worker_jobs=1_000,
                    claim1_jobs=400, claim100_jobs=4_000, enqueue_seconds=1.0)
FULL_SIZES = Sizes(groups=10_000, claim_samples=200, rounds=7, limit_jobs=20_000, worker_jobs=20_000,
                   claim1_jobs=20_000, claim100_jobs=300_000, enqueue_seconds=5.0)


def sizes(ctx: Context) -> Sizes:
    return QUICK_SIZES if ctx.mode.quick else FULL_SIZES


def _spread(ratios: list[float]) -> str:
    return f"{min(ratios):.3f}-{max(ratios):.3f}"


def _load() -> str:
    return f"{os.getloadavg()[0]:.2f}"


# -- claim behind blocked serial groups ---------------------------------------------

GROUPED = "grouped"
PLAIN = "plain"
#: The blocked groups' running jobs hold their lease for the whole row.
LEASE_S = 7200
CLAIM = "SELECT id FROM alk.claim(%s, 'bench-claimer', 1)"


def _fill_grouped(conn: psycopg.Connection[Any], groups: int) -> int:
    """``groups`` serial groups, each with one job processing (a valid lease)
    and one pending behind it, then one job without a group: all due, the
    groups' pending jobs ahead of it in claim order. Returns its id."""
    keys = [f"g{i}" for i in range(groups)]
    payloads = [pg.PAYLOAD] * groups
    conn.execute(
        "SELECT count(*) FROM alk.enqueue_batch(%s, %s::jsonb[], visibility_timeout_s => %s, group_keys => %s)",
        [GROUPED, payloads, LEASE_S, keys],
    )
    claimed = conn.execute("SELECT count(*) FROM alk.claim(%s, 'bench-holder', %s)", [GROUPED, groups]).fetchone()
    if claimed is None or claimed[0] != groups:
        raise RuntimeError(f"claimed {claimed} of the {groups} groups' first jobs")
    conn.execute("SELECT count(*) FROM alk.enqueue_batch(%s, %s::jsonb[], group_keys => %s)",
                 [GROUPED, payloads, keys])
    found = conn.execute("SELECT alk.enqueue(%s, %s::jsonb)", [GROUPED, pg.PAYLOAD]).fetchone()
    assert found is not None
    return int(found[0])


def _fill_plain(conn: psycopg.Connection[Any], jobs: int) -> int:
    """``jobs`` pending jobs without groups; returns the first one's id."""
    ids = conn.execute("SELECT min(id) FROM alk.enqueue_batch(%s, array_fill(%s::jsonb, ARRAY[%s::int])) AS id",
                       [PLAIN, pg.PAYLOAD, jobs]).fetchone()
    assert ids is not None
    return int(ids[0])


def _timed_claim(conn: psycopg.Connection[Any], queue: str, expected: int) -> float:
    """One alk.claim of 1 in a transaction rolled back (every claim sees the
    same jobs); its round trip in ms. It must claim ``expected``."""
    with conn.transaction(force_rollback=True):
        t0 = time.perf_counter()
        got = conn.execute(CLAIM, [queue], prepare=True).fetchall()
        elapsed = time.perf_counter() - t0
    if [r[0] for r in got] != [expected]:
        raise RuntimeError(f"alk.claim({queue!r}) returned {got}, expected job {expected}")
    return elapsed * 1000


@row(
    "limits.blocked_groups",
    "sql",
    "claim behind 10^4 blocked groups",
    "alk.claim(n => 1) on a queue where 10^4 serial groups each have a job processing (valid lease) and one "
    "pending, enqueued before one job without a group, vs a queue of 10^4 + 1 jobs without groups; each claim in "
    "a transaction rolled back, the two sides alternating claim by claim; p50 and p99 of the round trip.",
    requires=pg.has_function("alk.set_queue_limits"),
)
def blocked_groups(ctx: Context) -> RowResult:
    started = time.perf_counter()
    size = sizes(ctx)
    samples: dict[str, list[float]] = {GROUPED: [], PLAIN: []}
    load_before = _load()
    ctx.progress.start("claim behind blocked groups", total=size.claim_samples)
    with ctx.server.fresh_db("alk_bench_limits", floor=False) as db, pg.connect(ctx, db) as conn:
        expected = {GROUPED: _fill_grouped(conn, size.groups), PLAIN: _fill_plain(conn, size.groups + 1)}
        pg.settle(conn, "alk.jobs")
        for i in range(10 + size.claim_samples):  # 10 warm-up claims per side, not kept
            for queue in (GROUPED, PLAIN) if i % 2 == 0 else (PLAIN, GROUPED):
                ms = _timed_claim(conn, queue, expected[queue])
                if i >= 10:
                    samples[queue].append(ms)
            if i >= 10:
                ctx.progress.advance()
    stats = {queue: pg.percentiles(samples[queue]) for queue in samples}
    ratio = stats[GROUPED]["p50"] / stats[PLAIN]["p50"]
    records = [
        {"queue": f"{size.groups:,} blocked groups + 1", "claim p50 ms": round(stats[GROUPED]["p50"], 3),
         "claim p99 ms": round(stats[GROUPED]["p99"], 3), "p50 vs no groups": round(ratio, 3)},
        {"queue": f"{size.groups + 1:,} jobs, no groups", "claim p50 ms": round(stats[PLAIN]["p50"], 3),
         "claim p99 ms": round(stats[PLAIN]["p99"], 3)},
    ]
    return RowResult(
        key="limits.blocked_groups",
        title="claim behind 10^4 blocked groups",
        status="ok",
        columns=["queue", "claim p50 ms", "claim p99 ms", "p50 vs no groups"],
        records=records,
        notes=[
            f"{size.claim_samples} claims per side after 10 warm-up, alternating; {size.groups:,} groups; "
            f"load average {load_before} before, {_load()} after.",
        ],
        extra={"samples_ms": samples, "groups": size.groups},
        seconds=time.perf_counter() - started,
    )


# -- a queue limited to max_running = 10, drained at concurrency 10 -----------------



def _fill(conn: psycopg.Connection[Any], clients: int, per_tx: int, jobs: int) -> int:
    """Empty the table, fill a backlog of about ``jobs`` for ``clients``
    clients and settle it; returns the transactions each client runs."""
    conn.execute("TRUNCATE alk.jobs")  # a benchmark-only shortcut to the same starting line
    per_client = max(1, jobs // (clients * per_tx))
    pg.fill_ours(conn, per_client * clients * per_tx)
    pg.settle(conn, "alk.jobs")
    return per_client


def _set_limit(conn: psycopg.Connection[Any], limited: bool) -> None:
    conn.execute("SELECT alk.set_queue_limits(%s, max_running => %s)", [pg.QUEUE, MAX_RUNNING if limited else None])


@row(
    "limits.max_running",
    "sql",
    "max_running = 10 at concurrency 10",
    f"A queue limited to max_running = {MAX_RUNNING} (alk.set_queue_limits) vs the same queue unlimited, drained "
    f"at concurrency {MAX_RUNNING}: {MAX_RUNNING} pgbench clients each looping claim 1 + ack "
    "(alk_claim_1_ack.sql), and pyalk's AsyncWorker at concurrency 10 with its defaults (the e2e row's runner, "
    "in its own process and database); interleaved rounds, the order flipped each round; jobs/s, the median "
    "ratio and its spread.",
    requires=pg.has_function("alk.set_queue_limits"),
)
def max_running(ctx: Context) -> RowResult:
    started = time.perf_counter()
    size = sizes(ctx)
    drainers = ("pgbench claim 1 + ack", "AsyncWorker")
    rates: dict[tuple[str, bool], list[float]] = {(d, lim): [] for d in drainers for lim in (False, True)}
    raw: list[dict[str, Any]] = []
    notes: list[str] = []
    load_before = _load()
    ctx.progress.start("max_running = 10", total=size.rounds * 2 * len(drainers))
    with ctx.server.fresh_db("alk_bench_limits", floor=False) as db, pg.connect(ctx, db) as conn:
        for r in range(size.rounds):
            for limited in (False, True) if r % 2 == 0 else (True, False):
                _set_limit(conn, limited)
                per_client = _fill(conn, MAX_RUNNING, 1, size.limit_jobs)
                result = pg.pgbench(ctx, db, "alk_claim_1_ack.sql", MAX_RUNNING, transactions=per_client)
                left = conn.execute("SELECT count(*) FROM alk.jobs").fetchone()
                if left is None or left[0] != 0:
                    raise RuntimeError(f"pgbench left {left} jobs: a claim came back empty")
                rates[(drainers[0], limited)].append(result.jobs_per_s(1))
                raw.append({"drainer": drainers[0], "round": r + 1, "limited": limited, **result.__dict__})
                ctx.progress.advance()
                env = {"ALK_BENCH_PYALK_VARIANT": "async", MAX_RUNNING_ENV: str(MAX_RUNNING) if limited else ""}
                peer = rows_e2e.run_peer(ctx, "pyalk", size.worker_jobs, MAX_RUNNING, env=env)
                if not peer.get("jobs_per_s"):
                    raise RuntimeError(f"the pyalk worker failed: {peer.get('error', peer)}")
                rates[(drainers[1], limited)].append(peer["jobs_per_s"])
                raw.append({"drainer": drainers[1], "round": r + 1, "limited": limited, **peer})
                ctx.progress.advance()
        _set_limit(conn, False)
    records: list[dict[str, Any]] = []
    for drainer in drainers:
        ratios = [a / b for a, b in zip(rates[(drainer, True)], rates[(drainer, False)], strict=True)]
        records.append({
            "drained by": drainer,
            "unlimited jobs/s": round(statistics.median(rates[(drainer, False)])),
            f"max_running {MAX_RUNNING} jobs/s": round(statistics.median(rates[(drainer, True)])),
            "limited/unlimited p50": round(statistics.median(ratios), 3),
            "min-max": _spread(ratios),
        })
        notes.append(f"{drainer} every round's jobs/s: unlimited {[round(x) for x in rates[(drainer, False)]]}, "
                     f"limited {[round(x) for x in rates[(drainer, True)]]}")
    return RowResult(
        key="limits.max_running",
        title="max_running = 10 at concurrency 10",
        status="ok",
        columns=list(records[0]),
        records=records,
        notes=[
            f"{size.rounds} interleaved rounds; pgbench drains {size.limit_jobs:,} jobs, the worker processes "
            f"{size.worker_jobs:,}; load average {load_before} before, {_load()} after.",
            *notes,
        ],
        extra={"raw": raw},
        seconds=time.perf_counter() - started,
    )


# -- the hot path with no limits set: as installed vs before limits -------------------

HOT_SCRIPTS = (
    ("claim 1 + ack", "alk_claim_1_ack.sql", 1),
    ("claim 100 + ack_batch", "alk_claim_100_ack_batch.sql", 100),
    ("enqueue 1", "alk_enqueue_1.sql", 1),
)
#: The installed SQL, the SQL with queue limits and nothing later (what the
#: limits alone cost), and the baseline before them.
WITH_LIMITS = "0029"
INSTALLED = "installed"
SIDES = (INSTALLED, WITH_LIMITS, BEFORE_LIMITS)


def _run_hot(ctx: Context, db: str, conn: psycopg.Connection[Any], script: str, per_tx: int, jobs: int,
             seconds: float) -> pg.PgbenchResult:
    if script.startswith("alk_enqueue"):
        conn.execute("TRUNCATE alk.jobs")
        pg.settle(conn, "alk.jobs")
        return pg.pgbench(ctx, db, script, CLIENTS, seconds=seconds)
    return pg.pgbench(ctx, db, script, CLIENTS, transactions=_fill(conn, CLIENTS, per_tx, jobs))


@row(
    "limits.hot_path",
    "sql",
    "hot path, no limits: now vs 0028",
    f"claim 1 + ack, claim 100 + ack_batch and enqueue 1 ({CLIENTS} pgbench clients, the sql rows' scripts) on a "
    "queue with no limits set, in three databases on the same server: pyalk as installed, the versions up to "
    f"{WITH_LIMITS} (queue limits, nothing later) and up to {BEFORE_LIMITS} (before them); interleaved rounds "
    f"(the order rotates each round); per round installed / {BEFORE_LIMITS} and {WITH_LIMITS} / {BEFORE_LIMITS}, "
    "the median ratios and their spread.",
    requires=pg.has_function("alk.set_queue_limits"),
)
def hot_path(ctx: Context) -> RowResult:
    started = time.perf_counter()
    size = sizes(ctx)
    records: list[dict[str, Any]] = []
    notes: list[str] = []
    raw: list[dict[str, Any]] = []
    load_before = _load()
    ctx.progress.start("hot path: installed vs before limits", total=size.rounds * len(SIDES) * len(HOT_SCRIPTS))
    with (
        ctx.server.fresh_db("alk_bench_limits_now", floor=False) as now_db,
        ctx.server.fresh_db("alk_bench_limits_0029", pyalk=False, floor=False) as with_db,
        ctx.server.fresh_db("alk_bench_limits_0028", pyalk=False, floor=False) as old_db,
        pg.connect(ctx, now_db) as now_conn,
        pg.connect(ctx, with_db) as with_conn,
        pg.connect(ctx, old_db) as old_conn,
    ):
        install_pyalk(with_conn, WITH_LIMITS)
        install_pyalk(old_conn, BEFORE_LIMITS)
        dbs = {INSTALLED: (now_db, now_conn), WITH_LIMITS: (with_db, with_conn), BEFORE_LIMITS: (old_db, old_conn)}
        # The baseline has no queue limits at all; the other two have them.
        has_limits = {side: _has_limits(conn) for side, (_, conn) in dbs.items()}
        if has_limits != {INSTALLED: True, WITH_LIMITS: True, BEFORE_LIMITS: False}:
            raise RuntimeError(f"alk.set_queue_limits exists where: {has_limits}; not the versions compared")
        for title, script, per_tx in HOT_SCRIPTS:
            jobs = size.claim1_jobs if per_tx == 1 else size.claim100_jobs
            rates: dict[str, list[float]] = {side: [] for side in SIDES}
            for r in range(size.rounds):
                # Rotate who goes first, so none always runs on a warmer (or busier) machine.
                for side in SIDES[r % len(SIDES):] + SIDES[: r % len(SIDES)]:
                    db, conn = dbs[side]
                    result = _run_hot(ctx, db, conn, script, per_tx, jobs, size.enqueue_seconds)
                    rates[side].append(result.jobs_per_s(per_tx))
                    raw.append({"script": script, "round": r + 1, "side": side, **result.__dict__})
                    ctx.progress.advance()
            now = [a / b for a, b in zip(rates[INSTALLED], rates[BEFORE_LIMITS], strict=True)]
            limits = [a / b for a, b in zip(rates[WITH_LIMITS], rates[BEFORE_LIMITS], strict=True)]
            records.append({
                "hot path": title,
                f"{BEFORE_LIMITS} jobs/s": round(statistics.median(rates[BEFORE_LIMITS])),
                f"{WITH_LIMITS} jobs/s": round(statistics.median(rates[WITH_LIMITS])),
                "installed jobs/s": round(statistics.median(rates[INSTALLED])),
                f"installed/{BEFORE_LIMITS} p50": round(statistics.median(now), 3),
                "min-max": _spread(now),
                f"{WITH_LIMITS}/{BEFORE_LIMITS} p50": round(statistics.median(limits), 3),
            })
            notes.append(f"{title} every round's jobs/s: "
                         + "; ".join(f"{side} {[round(x) for x in rates[side]]}" for side in SIDES))
    return RowResult(
        key="limits.hot_path",
        title="hot path, no limits: now vs 0028",
        status="ok",
        columns=list(records[0]),
        records=records,
        notes=[
            f"{size.rounds} interleaved rounds, {CLIENTS} clients; installed is version {_installed(ctx)}; "
            f"load average {load_before} before, {_load()} after.",
            *notes,
        ],
        extra={"pgbench": raw, "versions": {INSTALLED: _installed(ctx), "with limits": WITH_LIMITS,
                                            "before": BEFORE_LIMITS}},
        seconds=time.perf_counter() - started,
    )


def _has_limits(conn: psycopg.Connection[Any]) -> bool:
    found = conn.execute("SELECT to_regproc('alk.set_queue_limits') IS NOT NULL").fetchone()
    return bool(found and found[0])


def _installed(ctx: Context) -> str:
    """The newest version the installed side has."""
    from pyalk.schema.install import head

    return ctx.server.pyalk_upto or head()


#: This module's rows, in report order (bench/rows.py collects them).
ROWS: tuple[Row, ...] = (blocked_groups, max_running, hot_path)
