"""The queue commands: ``pyalk enqueue``, ``pyalk status`` (alk.queue_stats),
``pyalk jobs`` (alk.list_jobs) and ``pyalk requeue-dead``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence

from rich.console import Console, RenderableType
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from pyalk import Alk, Job, QueueStats
from pyalk.cli.common import (
    Commands,
    UsageError,
    ago,
    client,
    database_options,
    json_argument,
    literal_console,
    one_line,
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


def stats_table(alk: Alk, queue: str | None) -> RenderableType:
    stats = alk.stats(queue)
    now = int(alk.executor.value("SELECT alk.now()"))
    return render_stats(stats, now)


def render_stats(stats: Sequence[QueueStats], now: int) -> RenderableType:
    """The status table. Cells are Text, so a queue named ``x[/]`` is shown
    as it is; no cell wraps, so a row is one line in a pipe."""
    if not stats:
        return Text("no jobs in any queue")
    table = Table(title=f"pyalk queues at {stamp(now)} UTC", title_justify="left")
    for name, justify in (("queue", "left"), ("ready", "right"), ("scheduled", "right"), ("running", "right"),
                          ("lapsed", "right"), ("dead", "right"), ("oldest ready", "right"),
                          ("next due", "right")):
        table.add_column(name, justify=justify, no_wrap=True, overflow="ellipsis")  # type: ignore[arg-type]
    for row in stats:
        table.add_row(
            Text(row.queue),
            Text(f"{row.ready:,}"),
            Text(f"{row.scheduled:,}"),
            Text(f"{row.processing - row.lapsed:,}"),
            Text(f"{row.lapsed:,}", style="yellow" if row.lapsed else ""),
            Text(f"{row.dead:,}", style="red" if row.dead else ""),
            Text(ago(row.oldest_ready_age_s)),
            Text("-" if row.next_run_at is None else "in " + ago(row.next_run_at - now)),
        )
    return table


def cmd_status(args: argparse.Namespace, console: Console) -> None:
    if args.json and args.watch:
        raise UsageError("--json prints one document: it does not combine with --watch")
    with client(args) as alk:
        if args.json:
            print_json([dataclasses.asdict(row) for row in alk.stats(args.queue)])
            return
        if not args.watch:
            console.print(stats_table(alk, args.queue))
            return
        # Ctrl-C ends the watch through main: exit code 130, as documented.
        refreshes = 0
        with Live(stats_table(alk, args.queue), console=console, auto_refresh=False) as live:
            while args.count is None or refreshes < args.count:
                refreshes += 1
                if refreshes > 1:
                    time.sleep(args.interval)  # the refresh period of the display
                live.update(stats_table(alk, args.queue), refresh=True)


def cmd_jobs(args: argparse.Namespace, console: Console) -> None:
    with client(args) as alk:
        jobs = alk.queue(args.queue).list_jobs(args.state, limit=args.limit, after_id=args.after_id)
    if args.json:
        print_json([dataclasses.asdict(job) for job in jobs])
        return
    if not jobs:
        console.print(f"no {args.state + ' ' if args.state else ''}jobs in {args.queue!r}", soft_wrap=True)
        return
    console.print(jobs_table(jobs, Text(f"{args.state or 'all'} jobs of {args.queue!r}"), console.width))
    if len(jobs) == args.limit:
        console.print(f"more may follow: --after-id {jobs[-1].id}")


def jobs_table(jobs: Sequence[Job], title: Text, width: int) -> Table:
    """One line per job in ``width`` columns: cells never wrap (a payload is
    never broken mid-word); the last error and the payload share what the
    other columns leave and end in an ellipsis when they do not fit
    (``--json`` has them whole). A narrow console loses the worker column."""
    headers = ["id", "state", "attempts", "run at (UTC)", "worker", "last error", "payload"]
    rows = [[
        str(job.id), job.state, f"{job.attempts}/{job.max_attempts}",
        stamp(job.died_at if job.state == "dead" else job.run_at), job.worker_id or "-",
        one_line(job.last_error or "-"), json.dumps(job.payload, ensure_ascii=False),
    ] for job in jobs]
    natural = [max(len(header), *(len(row[i]) for row in rows)) for i, header in enumerate(headers)]
    # Rich's own shrinking collapses no-wrap columns to nothing: share by hand.
    left = width - sum(natural[:-2]) - (3 * len(headers) + 1)
    if left < 2 * 12:
        left += natural[4] + 3
        del headers[4], natural[4]
        for row in rows:
            del row[4]
    shortest = 8
    error_width = max(shortest, min(natural[-2], left // 2))
    payload_width = max(shortest, min(natural[-1], left - error_width))
    error_width = max(shortest, min(natural[-2], left - payload_width))
    table = Table(title=title, title_justify="left")
    for header, column_width in zip(headers, [*natural[:-2], error_width, payload_width], strict=True):
        table.add_column(header, no_wrap=True, overflow="ellipsis", width=column_width)
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    return table


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

    jobs = commands.add_parser("jobs", help="list the jobs of a queue (alk.list_jobs)")
    jobs.add_argument("queue")
    jobs.add_argument("--state", choices=("pending", "processing", "dead"))
    jobs.add_argument("--limit", type=positive_int, default=20, help="most jobs listed (default: %(default)s)")
    jobs.add_argument("--after-id", type=int, help="page on: the last id of the previous page")
    jobs.add_argument("--json", action="store_true", help="one JSON array of whole rows, for scripts")
    database_options(jobs)
    jobs.set_defaults(run=cmd_jobs)

    requeue = commands.add_parser("requeue-dead", help="send dead jobs back to pending (alk.requeue_dead)")
    requeue.add_argument("queue")
    requeue.add_argument("--id", dest="ids", type=int, action="append", metavar="JOB_ID",
                         help="only this job (repeatable; default: every dead job of the queue)")
    database_options(requeue)
    requeue.set_defaults(run=cmd_requeue_dead)
