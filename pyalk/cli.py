"""The ``pyalk`` command line (docs/cli.md). Errors are one clear line and
exit code 1."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import inspect
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import psycopg
from rich.console import Console, RenderableType
from rich.live import Live
from rich.logging import RichHandler
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from pyalk import Alk, AsyncAlk, AsyncWorker, PermanentError, Worker, WorkerCounts, demo, embedded, log, migrate
from pyalk.errors import AlkError
from pyalk.install import install_script
from pyalk.router import router_install


def _dsn(args: argparse.Namespace, *, stop_at_exit: bool = False) -> str:
    if getattr(args, "embedded", False):
        return embedded.start(stop_at_exit=stop_at_exit)
    dsn = args.dsn or os.environ.get("PYALK_DSN")
    if not dsn:
        raise CliError("no database: pass --dsn, set PYALK_DSN, or use --embedded")
    return dsn


class CliError(Exception):
    """A user-facing failure: printed as one line."""


def _database(args: argparse.Namespace) -> str:
    """The conninfo of the database to work on. An embedded server is
    started (or reused) and migrated: it is pyalk's own."""
    dsn = _dsn(args)
    if getattr(args, "embedded", False):
        migrate.upgrade(dsn)
    return dsn


@contextmanager
def _client(args: argparse.Namespace) -> Iterator[Alk]:
    """A client on one direct connection: a short command fails at once
    when the server is unreachable instead of waiting on a pool."""
    with psycopg.connect(_database(args), autocommit=True, connect_timeout=10) as conn:
        yield Alk(conn)


def _import(spec: str, what: str) -> Any:
    """``package.module:name`` (or ``module:Class.attr``), imported from the
    current directory too, as ``python -m`` would."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise CliError(f"{what} must look like module:name, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found: Any = importlib.import_module(module_name)
    except Exception as error:
        raise CliError(f"cannot import {module_name!r}: {type(error).__name__}: {error}") from error
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise CliError(f"{module_name!r} has no attribute {attribute!r}") from None
    return found


def _ago(seconds: int | None) -> str:
    """A duration for people: 45s, 3m12s, 2h05m, 3d04h."""
    if seconds is None:
        return "-"
    sign, seconds = ("-", -seconds) if seconds < 0 else ("", seconds)
    if seconds < 60:
        return f"{sign}{seconds}s"
    if seconds < 3600:
        return f"{sign}{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{sign}{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{sign}{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def _stamp(at: int | None) -> str:
    if at is None:
        return "-"
    try:
        return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):
        return str(at)


def cmd_migrate(args: argparse.Namespace, console: Console) -> None:
    dsn = _dsn(args)
    before = migrate.current(dsn)
    migrate.upgrade(dsn)
    after = migrate.current(dsn)
    console.print(f"pyalk schema: {before or 'not installed'} -> {after}")


def cmd_sql(args: argparse.Namespace, console: Console) -> None:
    sys.stdout.write(router_install(args.router) if args.router else install_script(after=args.after))


def cmd_extension(args: argparse.Namespace, console: Console) -> None:
    from pathlib import Path

    from pyalk.extension import write

    for path in write(Path(args.out)):
        console.print(str(path), highlight=False)


def cmd_demo(args: argparse.Namespace, console: Console) -> None:
    dsn = args.dsn or os.environ.get("PYALK_DSN")
    if not dsn:
        console.print("starting an embedded PostgreSQL ...")
        dsn = embedded.start(stop_at_exit=not args.keep_server)
    demo.run(dsn, jobs=args.jobs, workers=args.workers, console=console)


# queue commands --------------------------------------------------------------


def _json_argument(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise CliError(f"{what} is not JSON: {error}") from None


def cmd_enqueue(args: argparse.Namespace, console: Console) -> None:
    options = {"delay": args.delay, "run_at": args.run_at, "priority": args.priority,
               "max_attempts": args.max_attempts, "expires": args.expires}
    with _client(args) as alk:
        queue = alk.queue(args.queue)
        if args.payload != "-":
            job_id = queue.enqueue(_json_argument(args.payload, "the payload"), **options)
            console.print(job_id)
            return
        # JSON Lines on stdin: one job per non-blank line, enqueued in batches.
        payloads = [_json_argument(line, f"line {number} of stdin")
                    for number, line in enumerate(sys.stdin, start=1) if line.strip()]
        ids: list[int] = []
        columns = (TextColumn(f"enqueue into {args.queue!r}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
            task = progress.add_task("enqueue", total=len(payloads))
            for start in range(0, len(payloads), args.batch):
                ids += queue.enqueue_batch(payloads[start:start + args.batch], **options)
                progress.advance(task, len(payloads[start:start + args.batch]))
        span = f" (ids {ids[0]}..{ids[-1]})" if ids else ""
        console.print(f"enqueued {len(ids)} jobs into {args.queue!r}{span}")


def _stats_table(alk: Alk, queue: str | None) -> RenderableType:
    stats = alk.stats(queue)
    now = int(alk.executor.value("SELECT alk.now()"))
    if not stats:
        return Text("no jobs in any queue")
    table = Table(title=f"pyalk queues at {_stamp(now)} UTC", title_justify="left")
    for name, justify in (("queue", "left"), ("ready", "right"), ("scheduled", "right"), ("running", "right"),
                          ("lapsed", "right"), ("dead", "right"), ("oldest ready", "right"),
                          ("next due", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for row in stats:
        table.add_row(
            row.queue,
            f"{row.ready:,}",
            f"{row.scheduled:,}",
            f"{row.processing - row.lapsed:,}",
            f"[yellow]{row.lapsed:,}[/yellow]" if row.lapsed else "0",
            f"[red]{row.dead:,}[/red]" if row.dead else "0",
            _ago(row.oldest_ready_age_s),
            "-" if row.next_run_at is None else "in " + _ago(row.next_run_at - now),
        )
    return table


def cmd_status(args: argparse.Namespace, console: Console) -> None:
    with _client(args) as alk:
        if not args.watch:
            console.print(_stats_table(alk, args.queue))
            return
        refreshes = 0
        try:
            with Live(_stats_table(alk, args.queue), console=console, auto_refresh=False) as live:
                while args.count is None or refreshes < args.count:
                    refreshes += 1
                    if refreshes > 1:
                        time.sleep(args.interval)  # the refresh period of the display
                    live.update(_stats_table(alk, args.queue), refresh=True)
        except KeyboardInterrupt:
            pass


def cmd_jobs(args: argparse.Namespace, console: Console) -> None:
    with _client(args) as alk:
        jobs = alk.queue(args.queue).list_jobs(args.state, limit=args.limit, after_id=args.after_id)
    if args.json:
        for job in jobs:
            sys.stdout.write(json.dumps(dataclasses.asdict(job)) + "\n")
        return
    if not jobs:
        console.print(f"no {args.state + ' ' if args.state else ''}jobs in {args.queue!r}")
        return
    table = Table(title=f"{args.state or 'all'} jobs of {args.queue!r}", title_justify="left")
    for name in ("id", "state", "attempts", "run at (UTC)"):
        table.add_column(name, no_wrap=True)
    for name in ("worker", "last error", "payload"):
        table.add_column(name, overflow="fold")
    for job in jobs:
        payload = json.dumps(job.payload)
        table.add_row(
            str(job.id), job.state, f"{job.attempts}/{job.max_attempts}",
            _stamp(job.died_at if job.state == "dead" else job.run_at),
            job.worker_id or "-", job.last_error or "-",
            payload if len(payload) <= 60 else payload[:57] + "...",
        )
    console.print(table)
    if len(jobs) == args.limit:
        console.print(f"more may follow: --after-id {jobs[-1].id}")


def cmd_requeue_dead(args: argparse.Namespace, console: Console) -> None:
    with _client(args) as alk, console.status(f"requeueing dead jobs of {args.queue!r}"):
        moved = alk.queue(args.queue).requeue_dead(args.ids)
    console.print(f"requeued {moved} dead job{'s' if moved != 1 else ''} of {args.queue!r}")


# worker --------------------------------------------------------------------------


def _is_async(handler: Any) -> bool:
    call = getattr(handler, "__call__", None)  # noqa: B004 - an async __call__ counts
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)


@contextmanager
def _worker_display(worker: Worker | AsyncWorker, args: argparse.Namespace) -> Iterator[None]:
    """Logs on stderr; on a terminal, a live line of counts under them."""
    errors = Console(stderr=True)
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
    with Progress(SpinnerColumn(), TextColumn(f"worker on {worker.queue.name!r}:"), Counts(), TimeElapsedColumn(),
                  console=errors, transient=True):
        yield


def cmd_worker(args: argparse.Namespace, console: Console) -> None:
    handler = _import(args.target, "the handler")
    if not callable(handler):
        raise CliError(f"{args.target} is not callable")
    fail_on: list[type[BaseException]] = [PermanentError]
    for spec in args.fail_on:
        error_class = _import(spec, "--fail-on")
        if not (isinstance(error_class, type) and issubclass(error_class, BaseException)):
            raise CliError(f"--fail-on {spec} is not an exception class")
        fail_on.append(error_class)
    dsn = _database(args)
    with psycopg.connect(dsn, connect_timeout=10):  # fail now, in one line, when it is unreachable
        pass
    options: dict[str, Any] = {
        "concurrency": args.concurrency, "worker_id": args.worker_id, "fail_on": tuple(fail_on),
        "batch_size": args.batch_size, "poll_interval": args.poll_interval, "grace_period": args.grace,
        "listen": not args.no_listen, "burst": args.burst,
    }
    counts: WorkerCounts
    if _is_async(handler):
        async def run_async() -> WorkerCounts:
            async with AsyncAlk(dsn, max_connections=args.max_connections) as alk:
                worker = AsyncWorker(alk, args.queue, handler, **options)
                with _worker_display(worker, args):
                    return await worker.run()

        counts = asyncio.run(run_async())
    else:
        with Alk(dsn, max_connections=args.max_connections) as alk:
            worker = Worker(alk, args.queue, handler, **options)
            with _worker_display(worker, args):
                counts = worker.run()
    console.print(f"worker stopped: {counts.acked} acked, {counts.retried} retried, {counts.failed} failed, "
                  f"{counts.lost} lost, {counts.abandoned} left to lease expiry")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="pyalk", description="Job queues and more, inside PostgreSQL.")
    commands = root.add_subparsers(dest="command", required=True)

    def database_options(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--dsn", help="libpq conninfo or URI (default: $PYALK_DSN)")
        sub.add_argument("--embedded", action="store_true", help="start or reuse an embedded PostgreSQL")

    migrate = commands.add_parser("migrate", help="apply every pending migration (Alembic)")
    database_options(migrate)
    migrate.set_defaults(run=cmd_migrate)

    sql = commands.add_parser("sql", help="print the install script for psql")
    sql.add_argument("--after", help="the installed version: print only the upgrade from it")
    sql.add_argument("--router", action="append", metavar="PARTITION",
                     help="print the PL/Proxy router install instead; repeat per partition conninfo, p0 first")
    sql.set_defaults(run=cmd_sql)

    extension = commands.add_parser("extension", help="write CREATE EXTENSION alk's control file and scripts")
    extension.add_argument("--out", required=True, help="the folder to write into (the server's share/extension)")
    extension.set_defaults(run=cmd_extension)

    demo = commands.add_parser("demo", help="run a demo on an embedded PostgreSQL (or --dsn)")
    demo.add_argument("--dsn", help="use this database instead of an embedded server")
    demo.add_argument("--jobs", type=int, default=5000)
    demo.add_argument("--workers", type=int, default=4)
    demo.add_argument("--keep-server", action="store_true", help="leave the embedded server running")
    demo.set_defaults(run=cmd_demo)

    worker = commands.add_parser("worker", help="run a worker: call module:function on every job of a queue")
    worker.add_argument("target", metavar="module:function",
                        help="the handler; an async def runs on asyncio, a plain function on a thread pool")
    worker.add_argument("--queue", "-q", required=True)
    worker.add_argument("--concurrency", "-c", type=_positive_int, default=10, help="handlers at once (10)")
    worker.add_argument("--worker-id", help="default: host:pid:random")
    worker.add_argument("--fail-on", action="append", default=[], metavar="module:Exception",
                        help="fail the job for good on this exception (repeatable; pyalk.PermanentError always)")
    worker.add_argument("--batch-size", type=_positive_int, help="most jobs per claim (default: concurrency)")
    worker.add_argument("--poll-interval", type=_positive_float, default=5.0,
                        help="fallback poll in seconds when no NOTIFY comes (5)")
    worker.add_argument("--grace", type=_non_negative_float, default=30.0,
                        help="seconds running handlers get to finish on SIGINT/SIGTERM (30)")
    worker.add_argument("--no-listen", action="store_true", help="poll only: no LISTEN connection (poolers)")
    worker.add_argument("--burst", action="store_true", help="exit once nothing is claimable and nothing runs")
    worker.add_argument("--max-connections", type=_positive_int, default=4,
                        help="size of the worker's connection pool (4), plus one LISTEN connection")
    worker.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    worker.add_argument("--log-format", default="text", choices=("text", "json"))
    database_options(worker)
    worker.set_defaults(run=cmd_worker)

    enqueue = commands.add_parser("enqueue", help="enqueue a job (or JSON Lines from stdin with -)")
    enqueue.add_argument("queue")
    enqueue.add_argument("payload", metavar="JSON", help="the payload as JSON, or - for JSON Lines on stdin")
    enqueue.add_argument("--delay", type=int, help="seconds from now")
    enqueue.add_argument("--run-at", type=int, help="unix seconds (--delay wins)")
    enqueue.add_argument("--priority", type=int)
    enqueue.add_argument("--max-attempts", type=int)
    enqueue.add_argument("--expires", type=int, help="TTL in seconds from now")
    enqueue.add_argument("--batch", type=_positive_int, default=500, help="jobs per round trip with - (500)")
    database_options(enqueue)
    enqueue.set_defaults(run=cmd_enqueue)

    status = commands.add_parser("status", help="a table of alk.queue_stats()")
    status.add_argument("queue", nargs="?", help="only this queue")
    status.add_argument("--watch", "-w", action="store_true", help="refresh until Ctrl-C")
    status.add_argument("--interval", type=_positive_float, default=2.0, help="seconds between refreshes (2)")
    status.add_argument("--count", type=_positive_int, help="with --watch: stop after this many refreshes")
    database_options(status)
    status.set_defaults(run=cmd_status)

    jobs = commands.add_parser("jobs", help="list the jobs of a queue (alk.list_jobs)")
    jobs.add_argument("queue")
    jobs.add_argument("--state", choices=("pending", "processing", "dead"))
    jobs.add_argument("--limit", type=_positive_int, default=20)
    jobs.add_argument("--after-id", type=int, help="page on: the last id of the previous page")
    jobs.add_argument("--json", action="store_true", help="one JSON object per line, whole rows")
    database_options(jobs)
    jobs.set_defaults(run=cmd_jobs)

    requeue = commands.add_parser("requeue-dead", help="send dead jobs back to pending (alk.requeue_dead)")
    requeue.add_argument("queue")
    requeue.add_argument("--id", dest="ids", type=int, action="append", metavar="JOB_ID",
                         help="only this job (repeatable); default: every dead job of the queue")
    database_options(requeue)
    requeue.set_defaults(run=cmd_requeue_dead)
    return root


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    console = Console(stderr=args.command == "sql")
    errors = Console(stderr=True, highlight=False)
    run: Callable[[argparse.Namespace, Console], None] = args.run
    try:
        run(args, console)
    except (CliError, AlkError, RuntimeError) as error:
        errors.print(f"[red]error:[/red] {error}", soft_wrap=True)
        return 1
    except psycopg.Error as error:
        lines = str(error).strip().splitlines()
        message = lines[0] if lines else type(error).__name__
        if error.sqlstate in ("42883", "3F000"):  # undefined function, no such schema
            message += " (is pyalk installed in this database? run: pyalk migrate)"
        errors.print(f"[red]database error:[/red] {message}", soft_wrap=True)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
