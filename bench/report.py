"""Write a run's results: JSON (everything), markdown (tables, notes, plans
that matter) and a PNG plot (when matplotlib is installed)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from bench import rows_e2e, rows_hostile, rows_limits, rows_ops, rows_soak
from bench.registry import GROUPS, RowResult

TARGETS = [
    ("SQL path >= 90% of the floor at batch 1 and batch 100", "sql"),
    ("end to end >= 1.5x graphile-worker at equal concurrency (async c=1, c=10, threaded c=1)", "e2e"),
    ("durable enqueue with pyalk's wake-ups >= 0.9 of no NOTIFY, with and without an idle worker", "durable"),
    ("claim with 10^5 higher-priority future rows within 1.2x of none (p50; PostgreSQL 18 and 15)", "future"),
    ("wake latency p50 <= 1 ms, p99 <= 3 ms", "wake"),
    ("worker RSS after 10^6 jobs within 1.2x of after 10^4", "memory"),
    ("claim latency at 10^6 pending within 2x of 10^3", "backlog"),
    ("held-xmin throughput within 20% of the clean run", "xmin"),
    ("dashboard overview: one page load's queries < 100 ms at 10^6 jobs", "overview"),
    ("workers with the dashboard refreshing every second within 5% of alone", "interference"),
    (
        "soak: 10 runs of 100,000 jobs on one database, c=10: worst >= 0.9 of the best early run, "
        "median >= 1.5x graphile-worker",
        "soak",
    ),
    (
        "soak under a held REPEATABLE READ snapshot: worst >= 0.8 of the best early run, median >= 1.5x "
        "graphile-worker, size back within 2x of empty",
        "soak_held",
    ),
    (
        "soak under a held snapshot with 30,000 jobs scheduled ahead: worst >= 0.8 of the best early run, "
        "median >= 1.5x graphile-worker, size within 2x of the backlog's",
        "soak_backlog",
    ),
    ("100 registered workers beating every 5 s cost the hot path < 2% (claim 100 + ack_batch with / without >= 0.98)",
     "registry"),
    ("claim behind 10^4 blocked serial groups within 1.5x of a queue without groups (p50)", "groups"),
    ("max_running = 10 at concurrency 10 >= 0.9 of the same queue unlimited", "max_running"),
    ("hot path of a queue with no limits within 3% of before limits (installed / 0028 >= 0.97)", "hot_path"),
]

#: Targets judged by one row that runs on its own: listed only when the run
#: has that row (a saved run from before the row renders as it did).
TARGET_ROW = {
    "soak": "soak.churn",
    "soak_held": "soak.held",
    "soak_backlog": "soak.backlog",
    "registry": "ops.registry_cost",
    "groups": "limits.blocked_groups",
    "max_running": "limits.max_running",
    "hot_path": "limits.hot_path",
}

#: The section a row is shown in, when its key's prefix is not a group.
SECTION = {"soak": "e2e", "ops": "sql", "limits": "sql"}


#: The rows the SQL target judges (batch 1 and batch 100, and the prefetching loop).
SQL_TARGET_ROWS = (
    "sql.enqueue_1",
    "sql.enqueue_batch_100",
    "sql.claim_1_ack",
    "sql.claim_100_ack_batch",
    "sql.settle_and_claim",
)


def _by_key(results: list[RowResult]) -> dict[str, RowResult]:
    return {r.key: r for r in results}


def _rec(r: RowResult | None, **match: Any) -> dict[str, Any] | None:
    if r is None or r.status != "ok":
        return None
    return next((rec for rec in r.records if all(rec.get(k) == v for k, v in match.items())), None)


# What limits us, one line per unmet target, built from this run's numbers.
# The analyses behind them (with the evidence measured outside the run) are
# prose in bench/README.md, "What limits us", a section per target.


def _sql_limits(rows: dict[str, RowResult]) -> str:
    """Where the SQL path loses to the floor: server CPU, with the WAL per job
    ratio as the check that it is not I/O."""
    wals: list[float] = []
    for key in SQL_TARGET_ROWS:
        one = _rec(rows.get(key), clients=1)
        if one and one.get("ours WAL B/job") and one.get("floor WAL B/job"):
            wals.append(one["ours WAL B/job"] / one["floor WAL B/job"])
    if not wals:
        return ""
    return f"server CPU in the functions, not I/O: WAL/job {min(wals):.2f}-{max(wals):.2f}x the floor's"


def _e2e_limits(rows: dict[str, RowResult]) -> str:
    r = rows.get("e2e.process")
    if not r or r.status != "ok":
        return ""
    cost = [
        f"{_form(rec['system'])} c={rec['concurrency']} {1e6 / rec['process jobs/s']:.0f}"
        for rec in r.records
        if str(rec["system"]).startswith("pyalk") and rec["process jobs/s"]
    ]
    return "the CPU each side spends per job; wall us per job: " + ", ".join(cost) if cost else ""


#: The durable row's worker modes, each with its own cause (the README's
#: "Durable enqueue" section explains each).
DURABLE_CAUSES = {
    "no": "no idle worker: the run's spread",
    "yes": "synthetic idle worker: its advert commits",
    "AsyncWorker": "a real AsyncWorker: its CPU differs by side",
}


def _durable_limits(rows: dict[str, RowResult]) -> str:
    r = rows.get("sql.enqueue_durable")
    if not r or r.status != "ok":
        return ""
    missed = [
        mode
        for mode in DURABLE_CAUSES
        if any(
            rec["idle worker"] == mode and rec["ours/no-notify"] is not None and rec["ours/no-notify"] < 0.9
            for rec in r.records
        )
    ]
    return "; ".join(DURABLE_CAUSES[mode] for mode in missed)


def _future_limits(rows: dict[str, RowResult]) -> str:
    r = rows.get("latency.claim_vs_future")
    if not r or r.status != "ok":
        return ""
    extra = [
        f"{_server(rec['server'])} +{rec['with future rows ms'] - rec['no future rows ms']:.3f} ms"
        for rec in r.records
        if rec["metric"] == "claim p50" and rec.get("ratio") is not None
    ]
    return "a fixed step per claim, not a walk: " + ", ".join(extra) if extra else ""


def _wake_limits(rows: dict[str, RowResult]) -> str:
    r = rows.get("latency.wake")
    if not r or r.status != "ok" or len(r.records) < 3:
        return ""
    ours, claim_only, floor = r.records[0], r.records[1], r.records[2]
    return (
        f"the claim's round trip to an idle backend; p50 bare LISTEN {floor['p50 ms']} ms, LISTEN + claim "
        f"{claim_only['p50 ms']} ms, worker {ours['p50 ms']} ms"
    )


def _backlog_limits(rows: dict[str, RowResult]) -> str:
    r = rows.get("latency.claim_vs_backlog")
    if not r or r.status != "ok":
        return ""
    first = r.records[0]
    worst = max(r.records, key=lambda rec: rec["ours claim+ack p50 ms"])
    floor_growth = r.extra.get("growth", {}).get("floor claim+ack p50 ms")
    return (
        f"worst at {worst['pending']:,} pending: claim+ack p50 {worst['ours claim+ack p50 ms']} vs "
        f"{first['ours claim+ack p50 ms']} ms; the floor grew {floor_growth}x"
    )


def _xmin_limits(rows: dict[str, RowResult]) -> str:
    r = rows.get("hostile.held_xmin")
    if not r or r.status != "ok":
        return ""
    oh, fh = _rec(r, side="ours", run="xmin held"), _rec(r, side="floor", run="xmin held")
    rh = _rec(r, side=rows_hostile.ROTATED, run="xmin held")
    if not (oh and fh):
        return ""
    if rh:
        return (f"one-job claims walk what settled since the last rotation ({rh['rotations']} in the held run); "
                f"unrotated, ours {oh['held/clean']:.2f} and the floor {fh['held/clean']:.2f}")
    loses = "as much or more" if fh["held/clean"] <= oh["held/clean"] + 0.05 else "less"
    return (
        f"MVCC: nothing below the held horizon can be pruned; the floor loses {loses} "
        f"(held/clean {fh['held/clean']:.2f} vs ours {oh['held/clean']:.2f})"
    )


def _soak_limits(r: RowResult, bar: rows_soak.Targets) -> str:
    """What the soak's numbers show for each missed part: the dead tuples the
    worst run started with, the time per job at the medians, where the space
    stayed after the release."""
    ours, ref = _rec(r, system=rows_soak.PYALK), _rec(r, system=rows_soak.REFERENCE)
    if not ours or ours.get("status") != "ok":
        return ""
    parts = []
    if ours["worst/best"] < bar.worst_vs_best:
        parts.append(
            f"run {ours['worst run']}: {ours['worst']:,.0f} jobs/s after {ours['dead tuples before worst']:,} dead "
            f"tuples, {ours['autovacuums']} autovacuums" + _beside(ours)
        )
    ratio = ours.get(f"median vs {rows_soak.REFERENCE}")
    if ratio is not None and ref and ratio < bar.median_vs_reference:
        parts.append(f"median {1e6 / ours['median']:.0f} vs {1e6 / ref['median']:.0f} us/job")
    after = ours.get("after/empty")
    if bar.size_vs_empty is not None and (after is None or after > bar.size_vs_empty):
        parts.append(
            f"after vacuum heap {ours['heap MiB after vacuum']:.1f} + indexes {ours['index MiB after vacuum']:.1f} "
            f"MiB, empty {ours['queue MiB empty']:.2f}"
        )
    return "; ".join(parts)


def _beside(ours: dict[str, Any]) -> str:
    """What the server ran beside the worst run and the best early one
    (checkpoints, autovacuums of either system's tables), when recorded."""
    worst, best = ours.get("beside worst"), ours.get("beside best early")
    if not worst or not best:
        return ""
    return (f"; beside it: {worst['checkpoints']} ckpt, {worst['autovacuums']} autovac, "
            f"{worst['wal_bytes'] / 2**20:.0f} MiB WAL{_upkeep(worst)} (best early {best['checkpoints']}, "
            f"{best['autovacuums']}, {best['wal_bytes'] / 2**20:.0f}{_upkeep(best)})")


def _upkeep(beside: dict[str, Any]) -> str:
    """The server's upkeep CPU beside a run (UpkeepCpu), when recorded."""
    cpu = beside.get("upkeep_cpu_s")
    return "" if cpu is None else f", upkeep CPU {sum(cpu.values()):.1f} s"


def _soak_target(r: RowResult, bar: rows_soak.Targets) -> tuple[str, bool | None]:
    """What a soak row measured against its bar, and whether it met it (None:
    not judged, graphile-worker or pyalk did not run)."""
    if r.status != "ok":
        return f"not run ({r.status}{': ' + r.notes[0][:100] if r.notes else ''})", None
    ours, ref = _rec(r, system=rows_soak.PYALK), _rec(r, system=rows_soak.REFERENCE)
    if not ours or ours.get("status") != "ok":
        return "not run: pyalk's soak did not finish", None
    measured = [f"pyalk worst/best {ours['worst/best']:.2f} (run {ours['worst run']})"]
    checks = [ours["worst/best"] >= bar.worst_vs_best]
    ratio = ours.get(f"median vs {rows_soak.REFERENCE}")
    if ratio is not None and ref:
        measured[0] += f", {rows_soak.REFERENCE} {ref['worst/best']:.2f}"
        measured.append(f"median {ratio:.2f}x {rows_soak.REFERENCE}")
        checks.append(ratio >= bar.median_vs_reference)
    else:
        measured.append(f"{rows_soak.REFERENCE} not run")
    if bar.size_vs_empty is not None:
        after = ours.get("after/empty")
        measured.append(f"size after vacuum {after:.1f}x empty" if after is not None else "size not read")
        checks.append(after is not None and after <= bar.size_vs_empty)
    size = (r.extra.get("runs"), r.extra.get("jobs"))
    if None not in size and size != rows_soak.SOAK["full"]:  # a quick or medium soak says so
        measured.append(f"{size[0]} runs of {size[1]:,}")
    met = False if not all(checks) else (True if ratio is not None else None)
    return "; ".join(measured), met


def _registry_limits(r: RowResult) -> str:
    """The beats' own cost: how many a second, how long each, the share of a
    core that makes on the cores the hot path runs on."""
    beating = r.records[-1] if r.records else None
    if not beating or not beating.get("beats/s"):
        return ""
    shares = {side: beating.get(f"beats' {side} CPU") for side in ("backend", "client")}
    cpu = [f"{side} {share}" for side, share in shares.items() if share]
    return (
        f"{beating['beats/s']:g} durable beat commits/s beside the hot path on shared cores"
        + (f", their {' and '.join(cpu)} of a core" if cpu else "")
        + f"; rounds {beating['with/without min-max']}"
        + (", straddling 1" if _straddles_one(str(beating["with/without min-max"])) else "")
    )


def _straddles_one(spread: str) -> bool:
    """'0.694-1.223' -> True: some rounds ran faster with the registry, some slower."""
    low, _, high = spread.partition("-")
    return float(low) < 1 < float(high)


def _not_run(r: RowResult) -> str:
    return f"not run ({r.status}{': ' + r.notes[0][:100] if r.notes else ''})"


def _groups_target(r: RowResult) -> tuple[str, bool | None, str]:
    """The blocked-groups claim against the plain one: measured, met, and
    (missed) the extra time per claim and per blocked group."""
    if r.status != "ok" or len(r.records) < 2:
        return _not_run(r), None, ""
    grouped, plain = r.records[0], r.records[1]
    ratio = grouped["p50 vs no groups"]
    groups = int(r.extra.get("groups") or 0)
    measured = f"claim p50 {grouped['claim p50 ms']} vs {plain['claim p50 ms']} ms: {ratio:.2f}x"
    if groups != rows_limits.FULL_SIZES.groups:
        measured += f" ({groups:,} groups)"
    extra_ms = grouped["claim p50 ms"] - plain["claim p50 ms"]
    limits = (f"the claim passes over each blocked group's job: +{extra_ms:.2f} ms per claim, "
              f"{extra_ms * 1000 / max(1, groups):.1f} us per blocked group")
    return measured, ratio <= rows_limits.GROUPS_TARGET, limits


def _max_running_target(r: RowResult) -> tuple[str, bool | None, str]:
    if r.status != "ok" or not r.records:
        return _not_run(r), None, ""
    key = "limited/unlimited p50"
    measured = "limited/unlimited p50: " + ", ".join(f"{rec['drained by']} {rec[key]:.2f}" for rec in r.records)
    met = all(rec[key] >= rows_limits.MAX_RUNNING_TARGET for rec in r.records)
    missed = [rec for rec in r.records if rec[key] < rows_limits.MAX_RUNNING_TARGET]
    limits = "; ".join(
        f"{rec['drained by']} {rec['unlimited jobs/s']:,} -> {rec[f'max_running {rows_limits.MAX_RUNNING} jobs/s']:,} "
        f"jobs/s (rounds {rec['min-max']})"
        for rec in missed
    )
    return measured, met, limits


def _hot_path_target(r: RowResult) -> tuple[str, bool | None, str]:
    if r.status != "ok" or not r.records:
        return _not_run(r), None, ""
    base, limits_only = rows_limits.BEFORE_LIMITS, rows_limits.WITH_LIMITS
    now = f"installed/{base} p50"
    alone = f"{limits_only}/{base} p50"
    measured = f"installed/{base} p50: " + ", ".join(f"{rec['hot path']} {rec[now]:.2f}" for rec in r.records)
    met = all(rec[now] >= rows_limits.HOT_PATH_TARGET for rec in r.records)
    limits = f"limits alone ({limits_only}/{base}): " + ", ".join(
        f"{rec['hot path']} {rec[alone]:.2f}" for rec in r.records
    )
    return measured, met, limits


def _overview_limits() -> str:
    return "counts exact up to 1,000 per queue; all exact costs about the floor's count(*)"


def _form(system: Any) -> str:
    """'pyalk (async)' -> 'async'."""
    return str(system).removeprefix("pyalk (").removesuffix(")")


def _server(label: Any) -> str:
    """'PG 18.6 (bench server)' -> 'PG 18.6'."""
    return str(label).split(" (")[0]


def targets(results: list[RowResult]) -> list[dict[str, Any]]:
    """The issue's targets, each with what this run measured, whether it was
    met (None: not measured in this run) and, when not met, what limits it
    (built from this run's numbers)."""
    rows = _by_key(results)
    out: list[dict[str, Any]] = []
    for label, kind in TARGETS:
        if kind in TARGET_ROW and TARGET_ROW[kind] not in rows:
            continue
        measured = "not measured"
        met: bool | None = None
        limits = ""
        if kind == "sql":
            # Judged against the floor of the storage pyalk has (the rotating
            # floor, issue 25), the plain floor beside it; rows without a
            # rotating floor (an older saved run) against the plain one.
            ratios = []
            plain: list[str] = []
            against_rotating = False
            for key in SQL_TARGET_ROWS:
                r = rows.get(key)
                if r and r.status == "ok":
                    worst = min(rec["ours/floor"] for rec in r.records if rec["ours/floor"] is not None)
                    rotating = [rec["ours/rotating floor"] for rec in r.records
                                if rec.get("ours/rotating floor") is not None]
                    judged = min(rotating) if rotating else worst
                    ratios.append(f"{r.title} {judged:.2f}")
                    plain.append(f"{worst:.2f}")
                    against_rotating = against_rotating or bool(rotating)
                    met = (judged >= 0.9) if met is None else (met and judged >= 0.9)
            if ratios:
                floor = "rotating floor" if against_rotating else "floor"
                measured = f"worst ours/{floor} over client counts: " + ", ".join(ratios)
            limits = (f"plain floor {', '.join(plain)}; " if against_rotating else "") + _sql_limits(rows)
        elif kind == "e2e":
            r = rows.get("e2e.process")
            if r and r.status == "ok":
                ours = [
                    rec
                    for rec in r.records
                    if str(rec["system"]).startswith("pyalk") and rec.get("vs graphile-worker") is not None
                ]
                if ours:
                    measured = "vs graphile-worker: " + ", ".join(
                        f"{_form(rec['system'])} c={rec['concurrency']} {rec['vs graphile-worker']:.2f}x"
                        for rec in ours
                    )
                    named = [rec for rec in ours if (rec["system"], rec["concurrency"]) in rows_e2e.TARGET_FORMS]
                    met = bool(named) and all(rec["vs graphile-worker"] >= rows_e2e.TARGET for rec in named)
                else:
                    measured = "pending: pyalk's worker or graphile-worker did not run"
            limits = _e2e_limits(rows)
        elif kind == "durable":
            r = rows.get("sql.enqueue_durable")
            if r and r.status == "ok" and r.records:
                clients = list(dict.fromkeys(rec["clients"] for rec in r.records))
                modes = list(dict.fromkeys(rec["idle worker"] for rec in r.records))
                measured = f"ours/no-notify at {'/'.join(map(str, clients))} clients, idle worker: " + ", ".join(
                    mode
                    + " "
                    + "/".join(
                        _cell(next((rec["ours/no-notify"] for rec in r.records
                                    if rec["idle worker"] == mode and rec["clients"] == c), None))
                        for c in clients
                    )
                    for mode in modes
                )
                met = all(rec["ours/no-notify"] is not None and rec["ours/no-notify"] >= 0.9 for rec in r.records)
            limits = _durable_limits(rows)
        elif kind == "future":
            r = rows.get("latency.claim_vs_future")
            if r and r.status == "ok":
                p50s = [rec for rec in r.records if rec["metric"] == "claim p50" and rec.get("ratio") is not None]
                if p50s:
                    measured = "claim p50 with / without: " + ", ".join(
                        f"{_server(rec['server'])} {rec['ratio']}x" for rec in p50s
                    )
                    met = all(rec["ratio"] <= 1.2 for rec in p50s)
            limits = _future_limits(rows)
        elif kind == "wake":
            r = rows.get("latency.wake")
            if r and r.status == "ok" and r.records:
                p50 = r.records[0].get("p50 ms")
                measured = f"p50 {p50} ms, p99 {r.records[0].get('p99 ms')} ms"
                p99 = r.records[0].get("p99 ms")
                met = p50 is not None and p99 is not None and p50 <= 1 and p99 <= 3
            elif r:
                measured = f"{r.status}: {r.notes[0] if r.notes else ''}"
            limits = _wake_limits(rows)
        elif kind == "memory":
            r = rows.get("e2e.memory")
            if r and r.status == "ok" and r.records:
                measured = ", ".join(f"{rec['worker']}: {rec.get('ratio')}x" for rec in r.records)
                met = all(rec.get("ratio") is not None and rec["ratio"] <= 1.2 for rec in r.records)
            elif r:
                measured = f"{r.status}: {r.notes[0] if r.notes else ''}"
        elif kind == "overview":
            r = rows.get("dashboard.overview")
            load = _rec(r, statement="one overview page load (sum of the above)")
            stats = _rec(r, statement="SELECT * FROM alk.queue_stats(exact_limit => 1000)")
            if load and stats:
                measured = f"p50 {load['p50 ms']} ms per page load, of which alk.queue_stats {stats['p50 ms']} ms"
                met = load["p50 ms"] < 100
                limits = _overview_limits()
        elif kind == "interference":
            r = rows.get("dashboard.no_interference")
            if r and r.status == "ok" and len(r.records) > 1:
                measured = ", ".join(f"{rec['setup']}: {rec.get('vs alone p50')}" for rec in r.records[1:])
                met = all(float(rec.get("vs alone p50") or 0) >= 0.95 for rec in r.records[1:])
            elif r:
                measured = f"{r.status}: {r.notes[0] if r.notes else ''}"
        elif kind == "backlog":
            r = rows.get("latency.claim_vs_backlog")
            if r and r.status == "ok":
                growth = r.extra.get("growth", {})
                first, last = r.records[0], r.records[-1]
                claim = last["ours claim p50 ms"] / first["ours claim p50 ms"]
                total = last["ours claim+ack p50 ms"] / first["ours claim+ack p50 ms"]
                measured = (
                    f"p50 at {last['pending']:,} / p50 at {first['pending']:,}: claim {claim:.2f}x "
                    f"({last['ours claim p50 ms']} vs {first['ours claim p50 ms']} ms), claim+ack {total:.2f}x; "
                    f"worst size / first: claim {growth.get('ours claim p50 ms')}x, "
                    f"claim+ack {growth.get('ours claim+ack p50 ms')}x"
                )
                met = claim <= 2 and total <= 2
            limits = _backlog_limits(rows)
        elif kind in ("soak", "soak_held", "soak_backlog"):
            bar = {"soak": rows_soak.CHURN_TARGETS, "soak_held": rows_soak.HELD_TARGETS,
                   "soak_backlog": rows_soak.BACKLOG_TARGETS}[kind]
            r = rows[TARGET_ROW[kind]]
            measured, met = _soak_target(r, bar)
            limits = _soak_limits(r, bar) if r.status == "ok" else ""
        elif kind == "registry":
            r = rows[TARGET_ROW[kind]]
            beating = r.records[-1] if r.status == "ok" and r.records else None
            if beating and beating.get("with/without p50") is not None:
                ratio = beating["with/without p50"]
                measured = f"with/without p50 {ratio:.3f} (rounds {beating['with/without min-max']})"
                met = ratio >= rows_ops.REGISTRY_TARGET
                limits = _registry_limits(r)
            else:
                measured = f"not run ({r.status}{': ' + r.notes[0][:100] if r.notes else ''})"
        elif kind == "groups":
            measured, met, limits = _groups_target(rows[TARGET_ROW[kind]])
        elif kind == "max_running":
            measured, met, limits = _max_running_target(rows[TARGET_ROW[kind]])
        elif kind == "hot_path":
            measured, met, limits = _hot_path_target(rows[TARGET_ROW[kind]])
        elif kind == "xmin":
            r = rows.get("hostile.held_xmin")
            if r and r.status == "ok":
                # Judged with the storage rotated (the design's deployment); unrotated beside it.
                rotated = _rec(r, side=rows_hostile.ROTATED, run="xmin held")
                bare = _rec(r, side="ours", run="xmin held")
                judged = rotated or bare
                if judged:
                    ratio = judged["held/clean"]
                    measured = f"held/clean {ratio:.2f}"
                    if rotated and bare:
                        measured = (f"held/clean {ratio:.2f} with alk.rotate_jobs() every "
                                    f"{rows_hostile.ROTATE_EVERY:g} s, {bare['held/clean']:.2f} unrotated")
                    met = ratio >= 0.8
            limits = _xmin_limits(rows)
        out.append({"target": label, "measured": measured, "met": met, "what limits us": "" if met else limits})
    return out


def write_json(path: Path, meta: dict[str, Any], results: list[RowResult]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"meta": meta, "targets": targets(results), "rows": [r.to_json() for r in results]}
    path.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "–"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value).replace("|", "\\|")


def table(columns: list[str], records: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for rec in records:
        lines.append("| " + " | ".join(_cell(rec.get(c)) for c in columns) + " |")
    return "\n".join(lines)


def _plans_block(result: RowResult) -> str:
    """The nested plans worth showing: stale-stats plans when stats made
    things worse; the largest backlog's plans when latency was not flat."""
    plans: list[str] = []
    # Stale statistics: when a claim's latency got worse (a plan did); a
    # throughput dip alone, from pgbench runs of a few seconds, leaves its
    # plans in the JSON only.
    slower_claim = any(rec.get("worse by >10%") for rec in result.records
                       if str(rec.get("metric", "")).endswith("p50 ms"))
    if result.key == "latency.stale_stats" and result.extra.get("degraded") and slower_claim:
        for scenario in ("stale", "fresh"):
            for plan in result.extra["plans"].get(scenario, []):
                plans.append(f"-- {scenario} statistics\n{plan}")
    if result.key == "latency.claim_vs_backlog":
        growth = result.extra.get("growth", {})
        if any(v and v > 2 for v in growth.values()):
            sizes = list(result.extra.get("plans", {}))
            for size in sizes[:1] + sizes[-1:]:
                for plan in result.extra["plans"][size]:
                    plans.append(f"-- {int(size):,} pending\n{plan}")
    if result.key == "latency.sweep_vs_dead" and (result.extra.get("growth") or 0) > 2:
        sizes = list(result.extra.get("plans", {}))
        for size in sizes[-1:]:
            for plan in result.extra["plans"][size]:
                plans.append(f"-- {int(size):,} dead rows\n{plan}")
    if not plans:
        return ""
    body = "\n\n".join(plans)
    summary = "<summary>EXPLAIN ANALYZE of the statements inside the functions</summary>"
    return f"<details>{summary}\n\n```\n{body}\n```\n\n</details>\n"


#: The longest note the markdown shows: one line. A row's longer notes (how
#: it measured, its settings, every round's figures) stay in the JSON; the
#: method is described once in bench/README.md.
NOTE_LIMIT = 200


def _section(key: str) -> str:
    prefix = key.split(".")[0]
    return SECTION.get(prefix, prefix)


def _version_span(versions: list[str]) -> str:
    if not versions:
        return "none"
    if len(versions) == 1:
        return f"`{versions[0]}`"
    return f"`{versions[0]}` .. `{versions[-1]}` ({len(versions)} scripts)"


def write_markdown(path: Path, meta: dict[str, Any], results: list[RowResult], plot: str | None) -> None:
    """The numbers of one run and a line of notes each; what the rows measure
    and what limits the unmet targets is prose in bench/README.md."""
    path.parent.mkdir(parents=True, exist_ok=True)
    out: list[str] = [
        "# Benchmarks",
        "",
        "Generated by `python -m bench`. What each row measures (by its key) and what limits each unmet target: "
        "[bench/README.md](../bench/README.md). Every number and note of the run: "
        "[img/benchmarks.json](img/benchmarks.json). Ratios hold within this one run on this one server; "
        "never compare absolute numbers across runs or machines.",
        "",
        "## This run",
        "",
        f"- date: {meta['date']}; mode: `{meta['mode']}`; wall time {meta['seconds']:.0f} s",
        f"- machine: {meta['machine']['cpu']}, {meta['machine']['cores']} cores, "
        f"{meta['machine']['memory_gib']} GiB, {meta['machine']['os']}, Python {meta['machine']['python']}",
        "- pyalk versions installed: " + _version_span(meta.get("pyalk_versions", [])),
        f"- server: {meta['server_version']} ({'embedded' if meta['embedded'] else 'given by --dsn'})",
        "- server settings: " + ", ".join(f"`{k}={v}`" for k, v in meta["server_settings"].items()),
        f"- load average (1/5/15 min) at start {meta.get('load_average_at_start')}, at end "
        f"{meta.get('load_average_at_end')}; ours and the floor alternate so a shift hits both",
        f"- measured sessions (pgbench and latency clients): `PGOPTIONS={meta['session_options']}`",
        "",
    ]
    if plot:
        out += [f"![benchmarks]({plot})", ""]
    out += [
        "## Targets (issues 7, 11, 15, 25, 26 and 27)",
        "",
        table(["target", "measured", "met", "what limits us"], targets(results)),
        "",
    ]
    out += [f"- {note}" for note in meta.get("run_notes", [])]
    if meta.get("run_notes"):
        out += [""]
    for group, heading in GROUPS.items():
        in_group = [r for r in results if _section(r.key) == group]
        if not in_group:
            continue
        out += [f"## {heading}", ""]
        for r in in_group:
            out += [f"### {r.title} (`{r.key}`, {r.seconds:.0f} s)", ""]
            if r.status != "ok":
                out += [f"**{r.status}**: " + ("; ".join(r.notes) if r.notes else ""), ""]
                continue
            out += [table(r.columns, r.records), ""]
            notes = [f"- {note}" for note in r.notes if len(note) <= NOTE_LIMIT]
            out += [*notes, ""] if notes else []
            block = _plans_block(r)
            if block:
                out += [block]
    path.write_text("\n".join(out).rstrip() + "\n", encoding="utf-8")


def load_json(path: Path) -> tuple[dict[str, Any], list[RowResult]]:
    """A saved run: its meta and its rows' results (what write_json wrote)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    return data["meta"], [RowResult(**r) for r in data["rows"]]


def render_saved(json_path: Path, md_path: Path) -> None:
    """Write the markdown of a saved run again, and the JSON's targets with it,
    from the run's own numbers: no row runs. The plot beside the JSON is
    drawn again from them when matplotlib is installed (a row spliced in
    shows there too), and linked when it exists."""
    meta, results = load_json(json_path)
    write_json(json_path, meta, results)
    png = json_path.with_suffix(".png")
    write_plot(png, results)
    plot = os.path.relpath(png, md_path.parent) if png.exists() else None
    write_markdown(md_path, meta, results, plot)


def write_plot(path: Path, results: list[RowResult]) -> bool:
    """A 2x3 figure: SQL ratios, claim latency vs backlog, wake and tail
    latency; end to end (log scale), held xmin, sweep cost. False when
    matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = _by_key(results)
    fig, axes = plt.subplots(2, 3, figsize=(19, 9))
    ax = axes[0][0]
    # The ours/floor rows (the durable row compares against its own copies).
    sql = [
        r
        for r in results
        if r.key.startswith("sql.") and r.status == "ok" and r.records and "ours/floor" in r.records[0]
    ]
    if sql:
        clients = sorted({rec["clients"] for r in sql for rec in r.records})
        width = 0.8 / max(1, len(clients))
        for i, c in enumerate(clients):
            values = [next((rec["ours/floor"] for rec in r.records if rec["clients"] == c), 0) or 0 for r in sql]
            ax.bar([x + i * width for x in range(len(sql))], values, width, label=f"{c} client{'s' if c > 1 else ''}")
        ax.axhline(0.9, color="red", linestyle="--", linewidth=1, label="target 0.9")
        ax.set_xticks([x + width * (len(clients) - 1) / 2 for x in range(len(sql))])
        ax.set_xticklabels([r.title for r in sql], rotation=15, fontsize=8)
        ax.set_ylabel("ours / floor (jobs/s)")
        ax.set_title("SQL level: ours vs bare-SQL floor")
        ax.legend(fontsize=8)
    ax = axes[0][1]
    backlog = rows.get("latency.claim_vs_backlog")
    if backlog and backlog.status == "ok":
        xs = [rec["pending"] for rec in backlog.records]
        for col, style in (
            ("ours claim p50 ms", "o-"),
            ("ours claim+ack p50 ms", "s-"),
            ("ours claim+ack p99 ms", "s:"),
            ("floor claim+ack p50 ms", "^-"),
        ):
            ax.plot(xs, [rec[col] for rec in backlog.records], style, label=col.replace(" ms", ""))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("pending jobs")
        ax.set_ylabel("ms")
        ax.set_title("claim latency vs backlog")
        ax.legend(fontsize=8)
    ax = axes[1][0]
    e2e = rows.get("e2e.process")
    if e2e and e2e.status == "ok":
        ok = [rec for rec in e2e.records if rec["process jobs/s"]]
        labels = [
            str(rec["system"])
            .replace(" (", "\n(")
            .replace("graphile-", "graphile-\n")
            .replace("procrastinate", "procras-\ntinate")
            + f"\nc={rec['concurrency']}"
            for rec in ok
        ]
        colors = ["tab:orange" if str(rec["system"]).startswith("pyalk") else "tab:blue" for rec in ok]
        ax.bar(range(len(ok)), [rec["process jobs/s"] for rec in ok], color=colors)
        ax.set_xticks(range(len(ok)))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("jobs/s (log scale)")
        ax.set_title("end to end: process N no-op jobs (pyalk orange)")
    ax = axes[0][2]
    wake, tail = rows.get("latency.wake"), rows.get("latency.stream_tail")
    series = []
    if wake and wake.status == "ok":
        series += [
            ("wake: pyalk worker", wake.extra["raw"]["wake"]),
            ("wake: LISTEN + alk.claim", wake.extra["raw"]["listen-claim"]),
            ("wake: bare LISTEN", wake.extra["raw"]["bare-queue"]),
        ]
    if tail and tail.status == "ok":
        series += [("tail: subscribe()", tail.extra["raw"]["tail"]), ("tail: bare LISTEN", tail.extra["raw"]["bare"])]
    for label, samples in series:
        values = sorted(samples["from_commit"])
        if values:
            ax.plot([100 * (i + 1) / len(values) for i in range(len(values))], values, label=label)
    if series:
        ax.axhline(1.0, color="red", linestyle="--", linewidth=1, label="wake target 1 ms")
        ax.set_yscale("symlog", linthresh=0.1)
        ax.set_xlabel("percentile")
        ax.set_ylabel("ms from commit return")
        ax.set_title("wake and stream tail latency")
        ax.legend(fontsize=8)
    ax = axes[1][2]
    sweep = rows.get("latency.sweep_vs_dead")
    if sweep and sweep.status == "ok":
        xs = [rec["dead rows"] for rec in sweep.records]
        ax.plot(xs, [rec["sweep p50 ms"] for rec in sweep.records], "o-", label="p50")
        ax.plot(xs, [rec["sweep p99 ms"] for rec in sweep.records], "s:", label="p99")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("dead rows inside retention")
        ax.set_ylabel("ms")
        ax.set_title("alk.sweep_expired cost vs dead rows")
        ax.legend(fontsize=8)
    ax = axes[1][1]
    xmin = rows.get("hostile.held_xmin")
    if xmin and xmin.status == "ok":
        labels = ["\n".join([*rec["side"].split(", "), rec["run"]]) for rec in xmin.records]
        ax.bar(range(len(labels)), [rec["jobs/s"] for rec in xmin.records],
               color=["tab:green", "tab:red"] * (len(labels) // 2))
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, fontsize=8)
        ax.set_ylabel("jobs/s (enqueue + claim + ack)")
        ax.set_title("held xmin horizon")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
