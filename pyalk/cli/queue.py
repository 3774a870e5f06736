"""The queue commands: ``pyalk enqueue``, ``pyalk status`` (alk.queue_stats)
and ``pyalk requeue-dead``; the jobs themselves are pyalk/cli/jobs.py's."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Sequence

from rich.cells import cell_len
from rich.console import Console, RenderableType
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from pyalk import Alk, QueueStats
from pyalk.cli.common import (
    Commands,
    UsageError,
    ago,
    client,
    database_options,
    json_argument,
    literal_console,
    plural,
    positive_float,
    positive_int,
    print_json,
    stamp,
)


def cmd_enqueue(args: argparse.Namespace, console: Console) -> None:
    options = {"delay": args.delay, "run_at": args.run_at, "priority": args.priority,
               "max_attempts": args.max_attempts, "expires": args.expires}
    with client(args) as alk:
        queue = alk.queue(args.queue)
        if args.payload != "-":
            job_id = queue.enqueue(json_argument(args.payload, "the payload"), **options)
            console.print(str(job_id))
            return
        # JSON Lines on stdin: one job per non-blank line, enqueued in batches.
        payloads = [json_argument(line, f"line {number} of stdin")
                    for number, line in enumerate(sys.stdin, start=1) if line.strip()]
        ids: list[int] = []
        columns = (TextColumn(f"enqueue into {args.queue!r}", markup=False), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn())
        with Progress(*columns, console=literal_console(stderr=True), transient=True) as progress:
            task = progress.add_task("enqueue", total=len(payloads))
            for start in range(0, len(payloads), args.batch):
                ids += queue.enqueue_batch(payloads[start:start + args.batch], **options)
                progress.advance(task, len(payloads[start:start + args.batch]))
        span = f" (ids {ids[0]}..{ids[-1]})" if ids else ""
        console.print(f"enqueued {plural(len(ids), 'job')} into {args.queue!r}{span}", soft_wrap=True)


def stats_table(alk: Alk, queue: str | None, width: int) -> RenderableType:
    stats = alk.stats(queue)
    now = int(alk.executor.value("SELECT alk.now()"))
    return render_stats(stats, now, width)


#: The status table's headers; a narrow console stacks them at their line breaks.
STATS_HEADERS = ("queue", "ready", "scheduled", "running", "lapsed", "dead", "oldest\nready", "next\ndue")


def render_stats(stats: Sequence[QueueStats], now: int, width: int) -> RenderableType:
    """The status table in ``width`` columns. Cells are Text, so a queue
    named ``x[/]`` is shown as it is; no cell wraps, so a row is one line in
    a pipe. Counts and headers are never cut: when the table is too wide
    the headers stack, and then the queue column takes what is left (a
    name that does not fit is cut in the middle; ``--json`` has it whole)."""
    if not stats:
        return Text("no jobs in any queue")
    rows = [[
        Text(row.queue),
        Text(f"{row.ready:,}"),
        Text(f"{row.scheduled:,}"),
        Text(f"{row.processing - row.lapsed:,}"),
        Text(f"{row.lapsed:,}", style="yellow" if row.lapsed else ""),
        Text(f"{row.dead:,}", style="red" if row.dead else ""),
        Text(ago(row.oldest_ready_age_s)),
        Text("-" if row.next_run_at is None else "in " + ago(row.next_run_at - now)),
    ] for row in stats]
    headers, widths = fit_headers(STATS_HEADERS, [[cell.plain for cell in row] for row in rows], width)
    widths[0] = max(header_width(headers[0]), min(widths[0], width - table_width(widths[1:], extra_columns=1)))
    for cells in rows:
        cells[0] = Text(middle_cut(cells[0].plain, widths[0]))
    table = Table(title=f"pyalk queues at {stamp(now)} UTC", title_justify="left")
    for header, column_width in zip(headers, widths, strict=True):
        table.add_column(header, justify="left" if header == "queue" else "right", no_wrap=True,
                         overflow="ellipsis", width=column_width)
    for cells in rows:
        table.add_row(*cells)
    return table


def middle_cut(name: str, width: int) -> str:
    """``name`` in ``width`` characters, cut in the middle when it does not
    fit: queue names share prefixes (``alk:outbox:``) and differ at the end."""
    if cell_len(name) <= width:
        return name
    head = (width - 1) // 2
    return name[:head] + "…" + name[len(name) - (width - 1 - head):]


def fit_headers(headers: Sequence[str], rows: Sequence[Sequence[str]], width: int) -> tuple[list[str], list[int]]:
    """The headers as one line each when the table fits ``width`` that way,
    else stacked at their line breaks; and each column's natural width (its
    widest cell or header line)."""
    for stacked in (False, True):
        shown = [heading(header, stacked) for header in headers]
        widths = natural_widths(shown, rows)
        if table_width(widths) <= width:
            break
    return shown, widths


def heading(header: str, stacked: bool) -> str:
    """A header stacked at its line breaks, or as one line."""
    return header if stacked else header.replace("\n", " ")


def natural_widths(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[int]:
    """Each column's widest cell or header line."""
    return [max([header_width(header), *(cell_len(row[i]) for row in rows)]) for i, header in enumerate(headers)]


def header_width(header: str) -> int:
    return max(cell_len(line) for line in header.splitlines())


def table_width(widths: Sequence[int], *, extra_columns: int = 0) -> int:
    """The width of a table (default box, one space of padding either side)
    whose columns have these content widths, and ``extra_columns`` more of
    width 0."""
    return sum(widths) + 3 * (len(widths) + extra_columns) + 1


def cmd_status(args: argparse.Namespace, console: Console) -> None:
    if args.json and args.watch:
        raise UsageError("--json prints one document: it does not combine with --watch")
    with client(args) as alk:
        if args.json:
            print_json([dataclasses.asdict(row) for row in alk.stats(args.queue)])
            return
        if not args.watch:
            console.print(stats_table(alk, args.queue, console.width))
            return
        # Ctrl-C ends the watch through main: exit code 130, as documented.
        refreshes = 0
        with Live(stats_table(alk, args.queue, console.width), console=console, auto_refresh=False) as live:
            while args.count is None or refreshes < args.count:
                refreshes += 1
                if refreshes > 1:
                    time.sleep(args.interval)  # the refresh period of the display
                live.update(stats_table(alk, args.queue, console.width), refresh=True)


def cmd_requeue_dead(args: argparse.Namespace, console: Console) -> None:
    with client(args) as alk, console.status(Text(f"requeueing dead jobs of {args.queue!r}")):
        moved = alk.queue(args.queue).requeue_dead(args.ids)
    console.print(f"requeued {plural(moved, 'dead job')} of {args.queue!r}", soft_wrap=True)


def register(commands: Commands) -> None:
    enqueue = commands.add_parser("enqueue", help="enqueue a job (or JSON Lines from stdin with -)")
    enqueue.add_argument("queue")
    enqueue.add_argument("payload", metavar="JSON", help="the payload as JSON, or - for JSON Lines on stdin")
    enqueue.add_argument("--delay", type=int, help="seconds from now")
    enqueue.add_argument("--run-at", type=int, help="unix seconds (--delay wins)")
    enqueue.add_argument("--priority", type=int)
    enqueue.add_argument("--max-attempts", type=int)
    enqueue.add_argument("--expires", type=int, help="TTL in seconds from now")
    enqueue.add_argument("--batch", type=positive_int, default=500,
                         help="jobs per round trip with - (default: %(default)s)")
    database_options(enqueue)
    enqueue.set_defaults(run=cmd_enqueue)

    status = commands.add_parser("status", help="a table of alk.queue_stats()")
    status.add_argument("queue", nargs="?", help="only this queue")
    status.add_argument("--watch", "-w", action="store_true", help="refresh until Ctrl-C")
    status.add_argument("--interval", type=positive_float, default=2.0,
                        help="seconds between refreshes (default: %(default)s)")
    status.add_argument("--count", type=positive_int, help="with --watch: stop after this many refreshes")
    status.add_argument("--json", action="store_true", help="one JSON array of alk.queue_stats rows, for scripts")
    database_options(status)
    status.set_defaults(run=cmd_status)

    requeue = commands.add_parser("requeue-dead", help="send dead jobs back to pending (alk.requeue_dead)")
    requeue.add_argument("queue")
    requeue.add_argument("--id", dest="ids", type=int, action="append", metavar="JOB_ID",
                         help="only this job (repeatable; default: every dead job of the queue)")
    database_options(requeue)
    requeue.set_defaults(run=cmd_requeue_dead)
