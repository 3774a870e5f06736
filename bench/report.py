"""Write a run's results: JSON (everything), markdown (tables, notes, plans
that matter) and a PNG plot (when matplotlib is installed)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from bench.registry import GROUPS, RowResult

TARGETS = [
    ("SQL path >= 90% of the floor at batch 1 and batch 100", "sql"),
    ("end to end >= 3x the best peer at equal concurrency", "e2e"),
    ("wake latency p50 <= 1 ms", "wake"),
    ("claim latency at every backlog up to the largest within 2x of 10^3", "backlog"),
    ("held-xmin throughput within 20% of the clean run", "xmin"),
]


def _by_key(results: list[RowResult]) -> dict[str, RowResult]:
    return {r.key: r for r in results}


def targets(results: list[RowResult]) -> list[dict[str, Any]]:
    """The issue's targets, each with what this run measured and whether it
    was met (None: not measured in this run)."""
    rows = _by_key(results)
    out: list[dict[str, Any]] = []
    for label, kind in TARGETS:
        measured = "not measured"
        met: bool | None = None
        if kind == "sql":
            ratios = []
            for key in ("sql.enqueue_1", "sql.enqueue_batch_100", "sql.claim_1_ack", "sql.claim_100_ack_batch"):
                r = rows.get(key)
                if r and r.status == "ok":
                    worst = min(rec["ours/floor"] for rec in r.records if rec["ours/floor"] is not None)
                    ratios.append(f"{r.title} {worst:.2f}")
                    met = (worst >= 0.9) if met is None else (met and worst >= 0.9)
            if ratios:
                measured = "worst ours/floor over client counts: " + ", ".join(ratios)
        elif kind == "e2e":
            r = rows.get("e2e.process")
            if r and r.status == "ok":
                ours = [rec for rec in r.records if rec["system"] == "pyalk" and rec["vs best peer"] is not None]
                if ours:
                    measured = ", ".join(f"c={rec['concurrency']}: {rec['vs best peer']:.2f}x" for rec in ours)
                    met = all(rec["vs best peer"] >= 3 for rec in ours)
                else:
                    measured = "pending: pyalk's worker does not exist yet"
        elif kind == "wake":
            r = rows.get("latency.wake")
            if r and r.status == "ok" and r.records:
                p50 = r.records[0].get("p50 ms")
                measured = f"p50 {p50} ms"
                met = p50 is not None and p50 <= 1
            elif r:
                measured = f"pending: {r.notes[0] if r.notes else r.status}"
        elif kind == "backlog":
            r = rows.get("latency.claim_vs_backlog")
            if r and r.status == "ok":
                growth = r.extra.get("growth", {})
                g = growth.get("ours claim+ack p50 ms")
                gc = growth.get("ours claim p50 ms")
                first, last = r.records[0]["pending"], r.records[-1]["pending"]
                measured = f"worst p50 over 10^3..{last:,} / p50 at {first:,}: claim {gc}x, claim+ack {g}x"
                met = g is not None and g <= 2 and (gc is None or gc <= 2)
        elif kind == "xmin":
            r = rows.get("hostile.held_xmin")
            if r and r.status == "ok":
                held = [rec for rec in r.records if rec["side"] == "ours" and rec["run"] == "xmin held"]
                if held:
                    ratio = held[0]["held/clean"]
                    measured = f"held/clean {ratio:.2f}"
                    met = ratio >= 0.8
        out.append({"target": label, "measured": measured, "met": met})
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
    if result.key == "latency.stale_stats" and result.extra.get("degraded"):
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


def write_markdown(path: Path, meta: dict[str, Any], results: list[RowResult], plot: str | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    out: list[str] = [
        "# Benchmarks",
        "",
        "Generated by `python -m bench` (see [bench/README.md](../bench/README.md) for how to run it and what "
        "each row means). Ratios are within this one run on this one server; never compare absolute numbers "
        "across runs or machines.",
        "",
        "## This run",
        "",
        f"- date: {meta['date']}; mode: `{meta['mode']}`; wall time {meta['seconds']:.0f} s",
        f"- machine: {meta['machine']['cpu']}, {meta['machine']['cores']} cores, "
        f"{meta['machine']['memory_gib']} GiB, {meta['machine']['os']}, Python {meta['machine']['python']}",
        "- pyalk versions installed: " + ", ".join(f"`{v}`" for v in meta.get("pyalk_versions", [])),
        f"- server: {meta['server_version']} ({'embedded' if meta['embedded'] else 'given by --dsn'})",
        "- server settings: " + ", ".join(f"`{k}={v}`" for k, v in meta["server_settings"].items()),
        f"- load average (1/5/15 min) at start {meta.get('load_average_at_start')}, at end "
        f"{meta.get('load_average_at_end')}: anything else running on the machine shifts the numbers; ours and "
        "the floor alternate so a shift hits both",
        f"- measured sessions (pgbench and latency clients): `PGOPTIONS={meta['session_options']}`",
        "",
    ]
    if plot:
        out += [f"![benchmarks]({plot})", ""]
    out += ["## Targets (issue 7)", "", table(["target", "measured", "met"], targets(results)), ""]
    for group, heading in GROUPS.items():
        in_group = [r for r in results if r.key.split(".")[0] == group]
        if not in_group:
            continue
        out += [f"## {heading}", ""]
        for r in in_group:
            out += [f"### {r.title}", ""]
            if r.about:
                out += [r.about, ""]
            if r.status != "ok":
                out += [f"**{r.status}**: " + ("; ".join(r.notes) if r.notes else ""), ""]
                continue
            out += [table(r.columns, r.records), ""]
            out += [f"- {note}" for note in r.notes]
            out += [f"- ran {r.seconds:.0f} s", ""]
            block = _plans_block(r)
            if block:
                out += [block]
    path.write_text("\n".join(out).rstrip() + "\n", encoding="utf-8")


def write_plot(path: Path, results: list[RowResult]) -> bool:
    """A 2x2 figure: SQL ratios, claim latency vs backlog, end to end, held
    xmin. False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = _by_key(results)
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    ax = axes[0][0]
    sql = [r for r in results if r.key.startswith("sql.") and r.status == "ok"]
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
        labels = [f"{rec['system']}\nc={rec['concurrency']}" for rec in ok]
        ax.bar(range(len(ok)), [rec["process jobs/s"] for rec in ok], color="tab:blue")
        ax.set_xticks(range(len(ok)))
        ax.set_xticklabels(labels, fontsize=8)
        ax.set_ylabel("jobs/s")
        ax.set_title("end to end: process N no-op jobs")
    ax = axes[1][1]
    xmin = rows.get("hostile.held_xmin")
    if xmin and xmin.status == "ok":
        labels = [f"{rec['side']}\n{rec['run']}" for rec in xmin.records]
        ax.bar(range(len(labels)), [rec["jobs/s"] for rec in xmin.records], color=["tab:green", "tab:red"] * 2)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, fontsize=8)
        ax.set_ylabel("jobs/s (enqueue + claim + ack)")
        ax.set_title("held xmin horizon")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
