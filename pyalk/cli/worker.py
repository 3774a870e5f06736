"""``pyalk worker``: run a worker calling ``module:function`` (or a
:class:`pyalk.Tasks` registry) on every job of a queue (docs/worker.md)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from rich.console import Console
from rich.logging import RichHandler
from rich.progress import Progress, ProgressColumn, SpinnerColumn, Task, TextColumn, TimeElapsedColumn
from rich.text import Text

from pyalk import Alk, AsyncAlk, AsyncWorker, PermanentError, Worker, WorkerCounts, log
from pyalk.cli.common import (
    CliError,
    Commands,
    UsageError,
    database,
    database_options,
    default_of,
    is_async,
    literal_console,
    load,
    logging_options,
    non_negative_float,
    positive_float,
    positive_int,
)
from pyalk.cli.dashboard import add_worker_option, worker_observer
from pyalk.errors import server_busy
from pyalk.tasks import Task as TaskDefinition
from pyalk.tasks import Tasks


@contextmanager
def _worker_display(worker: Worker | AsyncWorker, args: argparse.Namespace) -> Iterator[None]:
    """Logs on stderr; on a terminal, a live line of counts under them."""
    errors = literal_console(stderr=True)
    if not errors.is_terminal or args.log_format == "json":
        log.configure(args.log_level, args.log_format)
        yield
        return
    class Counts(ProgressColumn):
        def render(self, task: Task) -> Text:
            c = worker.counts
            return Text(f"{c.acked} acked, {c.retried} retried, {c.failed} failed, {c.lost} lost, "
                        f"{worker.in_flight} running")

    handler = RichHandler(console=errors, show_path=False)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.configure(args.log_level, handler=handler)
    title = TextColumn(f"worker on {worker.queue.name!r}:", markup=False)
    with Progress(SpinnerColumn(), title, Counts(), TimeElapsedColumn(), console=errors, transient=True):
        yield


def worker_options(args: argparse.Namespace) -> dict[str, Any]:
    """The worker's options from the command line (``fail_on`` and the
    observer aside): what ``alk.worker`` is called with."""
    return {
        "concurrency": args.concurrency, "worker_id": args.worker_id, "batch_size": args.batch_size,
        "poll_interval": args.poll_interval, "grace_period": args.grace, "listen": not args.no_listen,
        "burst": args.burst,
    }


def cmd_worker(args: argparse.Namespace, console: Console) -> None:
    handler = _worker_handler(load(args.target, "the handler"), args)
    fail_on: list[type[BaseException]] = [PermanentError]
    for spec in args.fail_on:
        error_class = load(spec, "--fail-on")
        if not (isinstance(error_class, type) and issubclass(error_class, BaseException)):
            raise CliError(f"--fail-on {spec} is not an exception class")
        fail_on.append(error_class)
    dsn = database(args)
    try:
        _check_before_working(dsn, args.queue)
    except psycopg.OperationalError as error:
        if not server_busy(error):
            raise
        # Reachable but full (53300): like after a restart, the worker waits for a slot.
        print("warning: every connection slot of the server is taken (too many clients); the worker retries "
              "with back-off until one frees", file=sys.stderr, flush=True)
    options = {**worker_options(args), "fail_on": tuple(fail_on), **worker_observer(args, dsn)}
    counts: WorkerCounts
    if is_async(handler):
        async def run_async() -> WorkerCounts:
            async with AsyncAlk(dsn, max_connections=args.max_connections) as alk:
                worker = alk.worker(args.queue, handler, **options)
                with _worker_display(worker, args):
                    return await worker.run()

        counts = asyncio.run(run_async())
    else:
        with Alk(dsn, max_connections=args.max_connections) as alk:
            worker = alk.worker(args.queue, handler, **options)
            with _worker_display(worker, args):
                counts = worker.run()
    _report_worker(counts, args, console)


def _worker_handler(target: Any, args: argparse.Namespace) -> Any:
    """The function the worker calls: the target itself, or for a
    :class:`pyalk.Tasks` registry its dispatcher over the tasks of the queue
    (``--queue`` may be left out when the registry has one queue)."""
    if isinstance(target, TaskDefinition):
        raise CliError(f"{args.target} is one task: run its registry (the pyalk.Tasks it was registered on)")
    if isinstance(target, Tasks):
        queues = target.queues()
        if args.queue is None and len(queues) == 1:
            args.queue = queues[0]
        if args.queue is None:
            on = ", ".join(map(repr, queues)) or "no queue"
            raise UsageError(f"--queue is required: {args.target} has tasks on {on}")
        try:
            return target.handler(args.queue)
        except ValueError as error:
            raise CliError(f"{args.target}: {error}") from None
    if not callable(target):
        raise CliError(f"{args.target} is not callable")
    if args.queue is None:
        raise UsageError("--queue is required")
    return target


def _check_before_working(dsn: str, queue: str) -> None:
    """Fail in one line before the worker starts (and logs "worker started"):
    an unreachable server, a schema this pyalk cannot run on (the client's
    check at connect), or a queue name the SQL name rule refuses
    (``alk:outbox:billing`` is reserved)."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn, Alk(conn) as alk:
        # The same name rule alk.claim applies, through a read that claims nothing.
        alk.queue(queue).list_jobs(limit=1)


def _report_worker(counts: WorkerCounts, args: argparse.Namespace, console: Console) -> None:
    """The summary on exit on stdout; with ``--log-format json`` stdout stays
    empty: the worker's own "worker stopped" record carries the counts."""
    if args.log_format == "json":
        return
    console.print(f"worker stopped: {counts.acked} acked, {counts.retried} retried, {counts.failed} failed, "
                  f"{counts.lost} lost, {counts.abandoned} left to lease expiry", soft_wrap=True)


def register(commands: Commands) -> None:
    worker = commands.add_parser("worker", help="run a worker: call module:function on every job of a queue")
    worker.add_argument("target", metavar="module:function",
                        help="the handler (an async def runs on asyncio, a plain function on a thread pool),"
                             " or a pyalk.Tasks registry")
    worker.add_argument("--queue", "-q", help="the queue to work (required, unless a registry has only one)")
    worker.add_argument("--concurrency", "-c", type=positive_int, default=default_of(Worker, "concurrency"),
                        help="handlers at once (default: %(default)s)")
    worker.add_argument("--worker-id", help="the claims' worker id (default: host:pid:random)")
    worker.add_argument("--fail-on", action="append", default=[], metavar="module:Exception",
                        help="fail the job for good on this exception (repeatable; pyalk.PermanentError always)")
    # None leaves it to the worker: its prefetch target, or the concurrency when larger.
    worker.add_argument("--batch-size", type=positive_int,
                        help=f"most jobs per claim (default: {default_of(Worker, 'prefetch')}, or --concurrency "
                             "when larger)")
    worker.add_argument("--poll-interval", type=positive_float, default=default_of(Worker, "poll_interval"),
                        help="fallback poll in seconds when no NOTIFY comes (default: %(default)s)")
    worker.add_argument("--grace", type=non_negative_float, default=default_of(Worker, "grace_period"),
                        help="seconds running handlers get to finish on SIGINT/SIGTERM (default: %(default)s)")
    worker.add_argument("--no-listen", action="store_true", help="poll only: no LISTEN connection (poolers)")
    worker.add_argument("--burst", action="store_true", help="exit once nothing is claimable and nothing runs")
    worker.add_argument("--max-connections", type=positive_int, default=4,
                        help="size of the worker's connection pool, plus one LISTEN connection "
                             "(default: %(default)s)")
    logging_options(worker)
    add_worker_option(worker)
    database_options(worker)
    worker.set_defaults(run=cmd_worker)
