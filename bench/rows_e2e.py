"""Issue 7 §2: end to end in Python. Enqueue N no-op jobs and process them,
pyalk's worker side by side with Procrastinate, PgQueuer and graphile-worker,
each in its own database on the same server in the same run, at
concurrency 1 and 10. Each runner is a subprocess (bench/peers/)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

from bench.peers import pyalk_worker
from bench.peers.common import ANALYZE_ENV
from bench.registry import Context, Row, RowResult, row

#: Runner modules in bench/peers/, pyalk first. A peer that cannot run here
#: (not installed) is reported as unavailable, not as an error.
PEERS: dict[str, str] = {
    "pyalk": "bench.peers.pyalk_worker",
    "procrastinate": "bench.peers.procrastinate_peer",
    "pgqueuer": "bench.peers.pgqueuer_peer",
    "graphile-worker": "bench.peers.graphile_peer",
}


def run_peer(ctx: Context, name: str, jobs: int, concurrency: int, env: dict[str, str] | None = None) -> dict[str, Any]:
    module = PEERS[name]
    with ctx.server.fresh_db(f"alk_bench_{name.replace('-', '_')}", pyalk=name == "pyalk", floor=False) as db:
        args = [
            ctx.peers_python or sys.executable,
            "-m",
            module,
            "--dsn",
            ctx.server.dsn_for(db),
            "--url",
            ctx.server.url_for(db),
            "--jobs",
            str(jobs),
            "--concurrency",
            str(concurrency),
        ]
        if ctx.peers_dir:
            args += ["--node-modules", ctx.peers_dir]
        timeout = 120 + jobs / 20  # a generous bound: 20 jobs/s
        args += ["--timeout", str(timeout)]
        proc = subprocess.run(
            args,
            capture_output=True,
            text=True,
            timeout=timeout + 30,
            check=False,
            env=dict(os.environ, **(env or {})),
        )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode == 3 and lines:
        return {"peer": name, "unavailable": json.loads(lines[-1])["unavailable"]}
    if proc.returncode != 0 or not lines:
        return {"peer": name, "error": (proc.stderr or proc.stdout)[-2000:]}
    return dict(json.loads(lines[-1]))


#: Peers an order of magnitude slower than the target's peer run fewer jobs
#: (a rate is a rate; at 20,000 jobs they alone would take half an hour).
SLOW_PEER_JOBS: dict[str, int] = {"procrastinate": 2_000, "pgqueuer": 2_000}

#: The peer the issue's target names, the ratio, and the forms it judges
#: as (system, concurrency): the threaded worker at c=10 is measured and
#: shown, not part of it (issue 11).
REFERENCE = "graphile-worker"
TARGET = 1.5
TARGET_FORMS = frozenset({("pyalk (async)", 1), ("pyalk (async)", 10), ("pyalk (threaded)", 1)})


#: ALK_BENCH_E2E="100000,5" overrides the mode's (jobs per run, rounds): issue
#: 25 asks for 100,000 jobs per run and 5 rounds, five times the full mode's N.
E2E_ENV = "ALK_BENCH_E2E"


def e2e_size(ctx: Context) -> tuple[int, int]:
    """(jobs per run, rounds): the mode's, or the ALK_BENCH_E2E override."""
    text = os.environ.get(E2E_ENV, "").strip()
    if not text:
        return ctx.mode.e2e_jobs, max(1, ctx.mode.e2e_repeats)
    jobs, rounds = (int(part) for part in text.split(","))
    if jobs < 1 or rounds < 1:
        raise ValueError(f"{E2E_ENV} must be 'jobs,rounds' with both >= 1, got {text!r}")
    return jobs, rounds


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


#: graphile-worker once more, without the statistics (as this row ran it
#: until 2026-12-06): a fresh database's plan, not the one it runs with in
#: production. Shown beside the target's reference, never judged against.
UNANALYZED = f"{REFERENCE} (no ANALYZE)"


def _systems() -> list[tuple[str, str, dict[str, str] | None]]:
    """(label, runner, env) for every system measured: each pyalk worker form
    on its own (the issue's target names both), then each peer, every one
    taking its statistics once its jobs are in; then graphile-worker without."""
    analyzed = {ANALYZE_ENV: "1"}
    systems: list[tuple[str, str, dict[str, str] | None]] = [
        (f"pyalk ({variant})", "pyalk", {"ALK_BENCH_PYALK_VARIANT": variant, **analyzed})
        for variant in pyalk_worker.VARIANTS
    ]
    peers: list[tuple[str, str, dict[str, str] | None]] = [(name, name, analyzed) for name in PEERS if name != "pyalk"]
    return systems + peers + [(UNANALYZED, REFERENCE, {ANALYZE_ENV: "0"})]


@row(
    "e2e.process",
    "e2e",
    "enqueue and process N no-op jobs",
    "Each system enqueues N no-op jobs with its bulk API and ANALYZEs, then its worker (configured as its docs "
    "recommend for throughput; graphile-worker with its performance preset) processes them; jobs/s = N / "
    "time from worker start to the N-th handler run. Repeated, the systems taking turns (round robin, "
    "the order rotating each round), medians reported. Durable commits: the server's settings. "
    "Target: the async worker at c=1 and c=10 and the threaded worker at c=1 >= 1.5x graphile-worker at "
    "equal concurrency.",
)
def e2e_process(ctx: Context) -> RowResult:
    started = time.perf_counter()
    mode = ctx.mode
    systems = _systems()
    e2e_jobs, repeats = e2e_size(ctx)
    runs: dict[tuple[int, str], list[dict[str, Any]]] = {}
    ctx.progress.start("end to end: pyalk vs peers", total=len(systems) * len(mode.e2e_concurrency) * repeats)
    for concurrency in mode.e2e_concurrency:
        for round_no in range(repeats):
            # Rotate who goes first: a slow patch of the machine hits each system in turn.
            order = systems[round_no % len(systems):] + systems[: round_no % len(systems)]
            for label, runner, env in order:
                ctx.progress.note(f"{label} at concurrency {concurrency}, round {round_no + 1} of {repeats}")
                jobs = min(e2e_jobs, SLOW_PEER_JOBS.get(runner, e2e_jobs))
                r = run_peer(ctx, runner, jobs, concurrency, env=env)
                r["concurrency"] = concurrency
                r["system"] = label
                runs.setdefault((concurrency, label), []).append(r)
                ctx.progress.advance()
    records: list[dict[str, Any]] = []
    notes: list[str] = []
    for concurrency in mode.e2e_concurrency:
        medians: dict[str, float | None] = {}
        for label, _runner, _env in systems:
            done = [r["jobs_per_s"] for r in runs[(concurrency, label)] if r.get("jobs_per_s")]
            medians[label] = _median(done) if len(done) == repeats else None
        reference = medians.get(REFERENCE)
        peers = [v for k, v in medians.items() if not k.startswith("pyalk") and v]
        best = max(peers) if peers else None
        for label, _runner, _env in systems:
            tries = runs[(concurrency, label)]
            value = medians[label]
            enq = [r["enqueue_jobs_per_s"] for r in tries if r.get("enqueue_jobs_per_s")]
            records.append({
                "concurrency": concurrency,
                "system": label,
                "version": next((r.get("version", "") for r in tries if r.get("version")), ""),
                "process jobs/s": round(value, 1) if value else None,
                "runs jobs/s": ", ".join(f"{r['jobs_per_s']:,.0f}" for r in tries if r.get("jobs_per_s")),
                "enqueue jobs/s": round(_median(enq), 1) if enq else None,
                f"vs {REFERENCE}": round(value / reference, 3) if value and reference else None,
                "vs best peer": round(value / best, 3) if value and best else None,
                "status": "ok" if value else ("pending" if any("unavailable" in r for r in tries) else "error"),
            })
            for r in tries:
                if "unavailable" in r:
                    notes.append(f"{label} (concurrency {concurrency}): {r['unavailable']}")
                if "error" in r:
                    notes.append(f"{label} (concurrency {concurrency}) failed: {r['error'][-300:]}")
    settings = {r["system"]: r.get("settings") for rs in runs.values() for r in rs if r.get("settings")}
    notes.append(
        f"N = {e2e_jobs:,} jobs per system, concurrency and round ("
        + ", ".join(f"{k} {min(v, e2e_jobs):,}" for k, v in SLOW_PEER_JOBS.items())
        + f": an order of magnitude slower); {repeats} rounds, the systems taking turns, medians; each run in a "
        "fresh database on the same server."
    )
    notes.append("Settings: " + "; ".join(f"{k}: {json.dumps(v)}" for k, v in settings.items()))
    if pyalk_worker.missing():
        notes.append("pyalk's row is pending until its worker is importable; the peers' numbers are real.")
    return RowResult(
        key="e2e.process",
        title="enqueue and process N no-op jobs",
        status="ok",
        columns=[
            "concurrency", "system", "version", "process jobs/s", "runs jobs/s", "enqueue jobs/s",
            f"vs {REFERENCE}", "vs best peer", "status",
        ],
        records=records,
        notes=list(dict.fromkeys(notes)),
        extra={"raw": [r for rs in runs.values() for r in rs]},
        seconds=time.perf_counter() - started,
    )


#: ALK_BENCH_MEMORY_JOBS="10000,300000" overrides the mode's (first, last)
#: counts of the memory row (a loaded machine may not fit 10^6 jobs).
MEMORY_JOBS_ENV = "ALK_BENCH_MEMORY_JOBS"


def memory_checkpoints(first: int, last: int) -> list[int]:
    """The handler counts at which the memory row reads the RSS: first, last
    and a few between (x5, x10, x25, x50 ... of first), the growth curve."""
    points = {first, last}
    step = first
    while step < last:
        for factor in (1, 2.5, 5):
            at = int(step * factor)
            if first < at < last:
                points.add(at)
        step *= 10
    return sorted(points)


def memory_jobs(ctx: Context) -> tuple[int, int]:
    text = os.environ.get(MEMORY_JOBS_ENV, "").strip()
    if not text:
        return ctx.mode.memory_jobs
    first, last = (int(part) for part in text.split(","))
    if not 0 < first < last:
        raise ValueError(f"{MEMORY_JOBS_ENV} must be 'first,last' with 0 < first < last, got {text!r}")
    return first, last


@row(
    "e2e.memory",
    "e2e",
    "worker memory: RSS after the first jobs vs after many",
    "One burst pyalk worker process (each form, concurrency 10, defaults) processes N no-op jobs enqueued "
    "ahead; its resident set (VmRSS, /proc/self/statm) is read in the same run when the handler has run the "
    "first checkpoint's count, at a few counts between, and at N. Target: RSS at N within 1.2x of RSS at the "
    "first checkpoint (no per-job growth).",
    requires=lambda ctx: pyalk_worker.missing(),
)
def e2e_memory(ctx: Context) -> RowResult:
    started = time.perf_counter()
    first, last = memory_jobs(ctx)
    points = memory_checkpoints(first, last)
    ctx.progress.start("worker memory", total=len(pyalk_worker.VARIANTS))
    records: list[dict[str, Any]] = []
    notes: list[str] = []
    raw: list[dict[str, Any]] = []
    for variant in pyalk_worker.VARIANTS:
        ctx.progress.note(f"pyalk ({variant}): RSS after {first:,} ... {last:,} jobs")
        env = {"ALK_BENCH_PYALK_VARIANT": variant, "ALK_BENCH_PYALK_RSS_AT": ",".join(map(str, points))}
        t0 = time.perf_counter()
        r = run_peer(ctx, "pyalk", last, 10, env=env)
        r["row_seconds"] = time.perf_counter() - t0
        ctx.progress.advance()
        raw.append(r)
        rss = {int(k): v for k, v in r.get("measures", {}).get("rss_kib_after", {}).items()}
        if first in rss and last in rss:
            ratio = rss[last] / rss[first]
            records.append({
                "worker": variant,
                f"RSS MiB after {first:,}": round(rss[first] / 1024, 1),
                f"RSS MiB after {last:,}": round(rss[last] / 1024, 1),
                "ratio": round(ratio, 3),
                "status": "ok" if ratio <= 1.2 else "over target",
            })
            curve = ", ".join(f"{n:,}: {rss[n] / 1024:.1f}" for n in sorted(rss))
            notes.append(f"pyalk ({variant}) RSS MiB by jobs run: {curve}; {r['row_seconds']:.0f} s "
                         f"(enqueue and process).")
        else:
            records.append({"worker": variant, "status": "error"})
            notes.append(f"pyalk ({variant}) failed: {r.get('error', r.get('unavailable', r))!s:.300}")
    notes.append(f"N = {last:,} jobs per worker form, enqueued ahead with enqueue_batch by the same process "
                 "before its worker starts; concurrency 10.")
    return RowResult(
        key="e2e.memory",
        title="worker memory: RSS after the first jobs vs after many",
        status="ok" if all(rec["status"] != "error" for rec in records) else "error",
        columns=["worker", f"RSS MiB after {first:,}", f"RSS MiB after {last:,}", "ratio", "status"],
        records=records,
        notes=notes,
        extra={"raw": raw, "checkpoints": points},
        seconds=time.perf_counter() - started,
    )


#: This module's rows, in report order (bench/rows.py collects them).
ROWS: tuple[Row, ...] = (e2e_process, e2e_memory)
