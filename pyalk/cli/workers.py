"""The workers commands: ``pyalk workers`` lists the registry of workers
(alk.workers(), as a table or ``--json``) and ``pyalk workers stop ID`` asks
one to stop (alk.request_stop)."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence

from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

from pyalk import WorkerInfo
from pyalk.cli.common import CliError, Commands, ago, client, database_options, print_json, say, stamp

#: The table's columns, the most needed first: a narrow terminal loses them
#: from the end (the worker and queue columns are kept, cut with an ellipsis).
HEADERS = ("worker", "queue", "state", "jobs", "beat", "up", "pid", "host", "version")
#: Columns every width keeps.
KEPT = 6
#: The width a long worker id or queue is cut to before a column is left out.
SHORT = 24


def state(worker: WorkerInfo) -> tuple[str, str]:
    """What the row says of the worker, and its style."""
    if worker.gone:
        return "gone", "red"
    if worker.stopping:
        return "stopping", "yellow"
    return "working", ""


def render_workers(workers: Sequence[WorkerInfo], now: int, width: int) -> RenderableType:
    """One line per worker in ``width`` columns: ``jobs`` is what it held at
    its last beat over its concurrency, ``beat`` how long ago that was, ``up``
    how long it has run. Cells never wrap; the columns that do not fit are
    left out, from the end, and a long worker id or queue ends in an ellipsis
    (``--json`` has every field whole)."""
    if not workers:
        return Text("no workers registered")
    rows = [[
        worker.worker_id, worker.queue, state(worker)[0], f"{worker.running}/{worker.concurrency}",
        ago(now - worker.last_seen_at), ago(now - worker.started_at), "-" if worker.pid is None else str(worker.pid),
        worker.host or "-", worker.version or "-",
    ] for worker in workers]
    natural = [max(len(header), *(len(row[i]) for row in rows)) for i, header in enumerate(HEADERS)]
    # Columns are chosen with the worker id and the queue at most SHORT wide;
    # what room is left then goes back to them.
    widths = [min(n, SHORT) if i < 2 else n for i, n in enumerate(natural)]
    count = len(HEADERS)
    while count > KEPT and sum(widths[:count]) + 3 * count + 1 > width:
        count -= 1
    widths = widths[:count]
    room = width - (sum(widths) + 3 * count + 1)
    for index in (0, 1):
        grown = min(natural[index], widths[index] + max(room, 0))
        room -= grown - widths[index]
        widths[index] = grown
    # Narrower still: the worker id and the queue give way, alike.
    while room < 0 and max(widths[0], widths[1]) > 8:
        widths[0 if widths[0] >= widths[1] else 1] -= 1
        room += 1
    table = Table(title=f"pyalk workers at {stamp(now)} UTC", title_justify="left")
    for index in range(count):
        justify = "right" if HEADERS[index] in ("jobs", "beat", "up", "pid") else "left"
        table.add_column(HEADERS[index], justify=justify, no_wrap=True, overflow="ellipsis",  # type: ignore[arg-type]
                         width=widths[index])
    for worker, row in zip(workers, rows, strict=True):
        cells = [Text(cell) for cell in row[:count]]
        cells[2].stylize(state(worker)[1])
        table.add_row(*cells)
    return table


def cmd_workers(args: argparse.Namespace, console: Console) -> None:
    with client(args) as alk:
        workers = alk.workers()
        if args.json:
            print_json([dataclasses.asdict(worker) for worker in workers])
            return
        now = int(alk.executor.value("SELECT alk.now()"))
    console.print(render_workers(workers, now, console.width))


def cmd_workers_stop(args: argparse.Namespace, console: Console) -> None:
    with client(args) as alk:
        asked = alk.request_stop(args.worker_id, args.queue)
    if not asked:
        where = f" for queue {args.queue!r}" if args.queue else ""
        raise CliError(f"no worker {args.worker_id!r} is registered{where} (pyalk workers lists them)")
    say(console, f"asked worker {args.worker_id!r} to stop: it drains within its grace period and exits")


def register(commands: Commands) -> None:
    workers = commands.add_parser("workers", help="list the running workers (alk.workers); stop one")
    workers.add_argument("--json", action="store_true", help="one JSON array of alk.workers rows, for scripts")
    database_options(workers)
    workers.set_defaults(run=cmd_workers)
    actions = workers.add_subparsers(dest="action", metavar="{stop}")

    stop = actions.add_parser("stop", help="ask a worker to stop as on SIGTERM (alk.request_stop)")
    stop.add_argument("worker_id", metavar="ID", help="the worker's id, as pyalk workers lists it")
    stop.add_argument("--queue", help="its queue: routing through a sharded router (optional)")
    database_options(stop, nested=True)
    stop.set_defaults(run=cmd_workers_stop)
