"""The job commands: ``pyalk jobs`` (alk.list_jobs: every state, completed
jobs with their results) and ``pyalk job`` (one job whole, or its outcome
awaited: alk.get_job, alk.outcome_channel). Payloads, results and errors are
data: printed as Text, never read as rich markup."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from pyalk import Job, JobCancelled, JobDied, JobNotFound, NoResultKept, WaitTimeout
from pyalk.cli.common import (
    CliError,
    Commands,
    client,
    database_options,
    non_negative_float,
    one_line,
    positive_int,
    print_json,
    say,
    stamp,
)
from pyalk.cli.queue import header_width, heading, natural_widths, table_width

STATES = ("pending", "processing", "dead", "completed")


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


#: The jobs table's headers; a narrow console stacks them at their line breaks.
JOBS_HEADERS = ("id", "state", "attempts", "at\n(UTC)", "worker", "error or\nresult", "payload")
#: Room the outcome and the payload want between them before a narrower layout is tried.
ROOMY = 2 * 12


def when(job: Job) -> int | None:
    """The time a job's row is about: died, completed, else due."""
    if job.state == "dead":
        return job.died_at
    if job.state == "completed":
        return job.completed_at
    return job.run_at


def outcome(job: Job) -> str:
    """A completed job's result as JSON, any other's last error (or -)."""
    if job.state == "completed":
        return json.dumps(job.result, ensure_ascii=False)
    return one_line(job.last_error or "-")


def jobs_table(jobs: Sequence[Job], title: Text, width: int) -> Table:
    """One line per job in ``width`` columns: cells never wrap (a payload is
    never broken mid-word); the outcome (last error, or a completed job's
    result) and the payload share what the other columns leave and end in
    an ellipsis when they do not fit (``--json`` and ``pyalk job`` have them
    whole). Headers are never cut: a narrow console first stacks them, then
    loses the worker column."""
    cells = [[
        str(job.id), job.state, f"{job.attempts}/{job.max_attempts}", stamp(when(job)), job.worker_id or "-",
        outcome(job), json.dumps(job.payload, ensure_ascii=False),
    ] for job in jobs]
    worker = JOBS_HEADERS.index("worker")
    layouts = []
    for stacked, with_worker in ((False, True), (True, True), (False, False), (True, False)):
        kept = [i for i in range(len(JOBS_HEADERS)) if with_worker or i != worker]
        headers = [heading(JOBS_HEADERS[i], stacked) for i in kept]
        rows = [[row[i] for i in kept] for row in cells]
        widths = natural_widths(headers, rows)
        left = width - table_width(widths[:-2], extra_columns=2)
        least = header_width(headers[-2]), header_width(headers[-1])
        layouts.append((headers, rows, widths, left, least))
    # The first layout where the outcome and the payload have room, else
    # the first where their headers fit, else the narrowest.
    headers, rows, widths, left, (outcome_least, payload_least) = next(
        (layout for layout in layouts if layout[3] >= min(ROOMY, layout[2][-2] + layout[2][-1])),
        next((layout for layout in layouts if layout[3] >= sum(layout[4])), layouts[-1]))
    # Rich's own shrinking cuts headers and collapses no-wrap columns: share by hand.
    outcome_width = max(outcome_least, min(widths[-2], left // 2))
    payload_width = max(payload_least, min(widths[-1], left - outcome_width))
    widths[-2:] = [max(outcome_least, min(widths[-2], left - payload_width)), payload_width]
    table = Table(title=title, title_justify="left")
    for header, column_width in zip(headers, widths, strict=True):
        table.add_column(header, no_wrap=True, overflow="ellipsis", width=column_width)
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    return table


def cmd_job(args: argparse.Namespace, console: Console) -> None:
    """One job's whole row; with ``--wait``, once it has an outcome."""
    with client(args) as alk:
        queue = alk.queue(args.queue)
        if args.wait:
            try:
                queue.wait_for_result(args.job_id, timeout=args.timeout)
            except JobDied:
                pass  # shown below, exit code 1
            except (JobCancelled, JobNotFound, NoResultKept, WaitTimeout) as error:
                raise CliError(str(error)) from None
        job = queue.get_job(args.job_id)
    if job is None:
        raise CliError(f"no job {args.job_id} in queue {args.queue!r}")
    if args.json:
        print_json(dataclasses.asdict(job))
    else:
        for field in dataclasses.fields(job):
            value = getattr(job, field.name)
            if field.name in ("payload", "result", "headers"):
                value = json.dumps(value, ensure_ascii=False)
            elif field.name.endswith("_at") and value is not None:
                value = f"{value} ({stamp(value)} UTC)"
            say(console, f"{field.name}: {'-' if value is None else value}")
    if args.wait and job.state == "dead":
        raise CliError(f"job {job.id} of queue {args.queue!r} is dead: {one_line(job.last_error or 'failed')}")


def register(commands: Commands) -> None:
    jobs = commands.add_parser("jobs", help="list the jobs of a queue (alk.list_jobs)")
    jobs.add_argument("queue")
    jobs.add_argument("--state", choices=STATES)
    jobs.add_argument("--limit", type=positive_int, default=20, help="most jobs listed (default: %(default)s)")
    jobs.add_argument("--after-id", type=int, help="page on: the last id of the previous page")
    jobs.add_argument("--json", action="store_true", help="one JSON array of whole rows, for scripts")
    database_options(jobs)
    jobs.set_defaults(run=cmd_jobs)

    job = commands.add_parser("job", help="one job whole: payload, result, headers (alk.get_job)")
    job.add_argument("queue")
    job.add_argument("job_id", type=int, metavar="JOB_ID")
    job.add_argument("--wait", action="store_true",
                     help="first wait for its outcome (the queue must keep completed jobs); exit 1 when it died")
    job.add_argument("--timeout", type=non_negative_float, help="with --wait: give up after these seconds")
    job.add_argument("--json", action="store_true", help="the row as one JSON object, for scripts")
    database_options(job)
    job.set_defaults(run=cmd_job)
