"""``python -m bench``: run the benchmark rows on one server and write the
report (JSON, markdown, PNG)."""

from __future__ import annotations

import argparse
import datetime as dt
import fnmatch
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from bench import report
from bench.registry import MODES, Context, Progress, Row, RowResult
from bench.rows import load_rows
from bench.server import Server, connect_server

ROOT = Path(__file__).resolve().parent.parent


class RichProgress(Progress):
    """One rich progress bar per row, plus its notes as log lines."""

    def __init__(self, progress: Any) -> None:
        self._progress = progress
        self._task: Any = None

    def start(self, description: str, total: float | None = None) -> None:
        if self._task is not None:
            self._progress.update(self._task, completed=self._progress.tasks[self._task].total or 0)
        self._task = self._progress.add_task(description, total=total)

    def advance(self, amount: float = 1.0) -> None:
        if self._task is not None:
            self._progress.advance(self._task, amount)

    def note(self, message: str) -> None:
        self._progress.log(message)

    def finish(self) -> None:
        if self._task is not None:
            task = self._progress.tasks[self._task]
            self._progress.update(self._task, completed=task.total or task.completed)
            self._task = None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="seconds per row (a smoke run), not minutes")
    parser.add_argument("--dsn", help="a server to use (a role that may create databases); default: embedded")
    parser.add_argument(
        "--rows",
        nargs="*",
        default=None,
        metavar="PATTERN",
        help="rows to run, as glob patterns over their keys (e.g. 'sql.*' latency.stale_stats); default: all",
    )
    parser.add_argument("--list", action="store_true", help="list the rows and exit")
    parser.add_argument(
        "--out-dir", type=Path, help="where to write benchmarks.md (default: docs/, or bench/results/ with --quick)"
    )
    parser.add_argument("--img-dir", type=Path, help="where to write the PNG and JSON (default: <out-dir>/img)")
    parser.add_argument("--no-write", action="store_true", help="print the tables only")
    parser.add_argument(
        "--from-json",
        type=Path,
        metavar="JSON",
        help="run nothing: write benchmarks.md (into --out-dir, default docs/), the JSON's targets and (with "
        "matplotlib) the plot beside it again from a saved run's JSON (e.g. docs/img/benchmarks.json)",
    )
    parser.add_argument(
        "--synchronous-commit",
        choices=["on", "off"],
        default="off",
        help="synchronous_commit of the measured SQL sessions (default off: the WAL flush per commit is the "
        "same for ours and the floor and would hide the CPU cost the ratio is about)",
    )
    parser.add_argument(
        "--pyalk-upto",
        metavar="NNNN",
        help="install pyalk's versioned scripts only up to this number (default: the whole chain)",
    )
    parser.add_argument(
        "--node-modules",
        default=os.environ.get("ALK_BENCH_NODE_MODULES"),
        help="node_modules holding graphile-worker (env ALK_BENCH_NODE_MODULES)",
    )
    parser.add_argument(
        "--peers-python",
        default=os.environ.get("ALK_BENCH_PEERS_PYTHON"),
        help="the Python with procrastinate and pgqueuer installed (default: this one)",
    )
    return parser.parse_args(argv)


def select(rows: dict[str, Row], patterns: list[str] | None, quick: bool) -> list[Row]:
    chosen = []
    for key, r in rows.items():
        if patterns:
            if any(fnmatch.fnmatch(key, p) for p in patterns):
                chosen.append(r)
        elif r.in_quick or not quick:
            chosen.append(r)
    return chosen


def run_rows(ctx: Context, rows: list[Row], progress: Progress | None = None) -> list[RowResult]:
    """Run each row; a pending row (its mechanism missing) and a failing row
    are reported, and the run goes on."""
    results: list[RowResult] = []
    for r in rows:
        missing = r.missing(ctx)
        if missing:
            results.append(RowResult(r.key, r.title, "pending", about=r.about, notes=[missing]))
            continue
        started = time.perf_counter()
        try:
            result = r.fn(ctx)
            if not result.about:
                result.about = r.about
        except Exception as error:  # a broken row must not lose the others' numbers
            result = RowResult(
                r.key,
                r.title,
                "error",
                about=r.about,
                notes=[f"{type(error).__name__}: {error}"[:2000]],
                extra={"traceback": traceback.format_exc()},
            )
        result.seconds = time.perf_counter() - started
        if isinstance(progress, RichProgress):
            progress.finish()
        results.append(result)
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = load_rows()
    mode = MODES["quick" if args.quick else "full"]
    chosen = select(rows, args.rows, args.quick)
    if args.list:
        for r in rows.values():
            print(f"{r.key:28} {r.title}")
        return 0
    if args.from_json:
        md = (args.out_dir or ROOT / "docs") / "benchmarks.md"
        report.render_saved(args.from_json, md)
        print(f"wrote {md}, {args.from_json}")
        return 0
    if not chosen:
        print("no row matches", args.rows, file=sys.stderr)
        return 2

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    console = Console()
    started = time.perf_counter()
    server: Server = connect_server(args.dsn)
    server.pyalk_upto = args.pyalk_upto
    try:
        ctx = Context(
            server=server,
            mode=mode,
            session_options=f"-c synchronous_commit={args.synchronous_commit}",
            peers_dir=args.node_modules,
            peers_python=args.peers_python,
        )
        meta: dict[str, Any] = {
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "mode": mode.name,
            "session_options": ctx.session_options,
            **server.describe(),
        }
        console.print(f"[bold]pyalk bench[/] ({mode.name}) on {meta['server_version'].split(' on ')[0]}")
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        ) as bars:
            progress = RichProgress(bars)
            ctx.progress = progress
            results = run_rows(ctx, chosen, progress)
        meta["seconds"] = time.perf_counter() - started
        if hasattr(os, "getloadavg"):
            meta["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        server.close()

    for r in results:
        t = Table(title=f"{r.key}: {r.title} [{r.status}]")
        if r.status == "ok":
            for c in r.columns:
                t.add_column(c)
            for rec in r.records:
                t.add_row(*(report._cell(rec.get(c)) for c in r.columns))
            console.print(t)
        else:
            console.print(f"[yellow]{r.key}: {r.status}[/] " + "; ".join(r.notes))
    tt = Table(title="targets")
    for c in ("target", "measured", "met"):
        tt.add_column(c)
    for rec in report.targets(results):
        tt.add_row(rec["target"], rec["measured"], report._cell(rec["met"]))
    console.print(tt)

    if not args.no_write:
        out_dir = args.out_dir or (ROOT / "bench" / "results" if args.quick else ROOT / "docs")
        img_dir = args.img_dir or out_dir / "img"
        png = img_dir / "benchmarks.png"
        plotted = report.write_plot(png, results)
        report.write_json(img_dir / "benchmarks.json", meta, results)
        rel_png = os.path.relpath(png, out_dir) if plotted else None
        report.write_markdown(out_dir / "benchmarks.md", meta, results, rel_png)
        written = [out_dir / "benchmarks.md", img_dir / "benchmarks.json"] + ([png] if plotted else [])
        console.print("wrote " + ", ".join(str(p) for p in written))
    return 1 if any(r.status == "error" for r in results) else 0
