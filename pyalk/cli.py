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
import shlex
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
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

from pyalk import (
    Alk,
    AsyncAlk,
    AsyncWorker,
    Job,
    PermanentError,
    QueueStats,
    Worker,
    WorkerCounts,
    demo,
    embedded,
    log,
)
from pyalk.cli_dashboard import add_commands, add_worker_option, worker_observer
from pyalk.cli_schedule import Shared, add_schedule_commands
from pyalk.errors import AlkError, server_busy
from pyalk.schema import extension, migrate
from pyalk.schema.install import install_script, versions
from pyalk.schema.router import router_install
from pyalk.tasks import Task as TaskDefinition
from pyalk.tasks import Tasks


def _dsn(args: argparse.Namespace, *, stop_at_exit: bool = False) -> str:
    if getattr(args, "embedded", False):
        return embedded.start(stop_at_exit=stop_at_exit)
    dsn = args.dsn or os.environ.get("PYALK_DSN")
    if not dsn:
        raise CliError("no database: pass --dsn, set PYALK_DSN, or use --embedded")
    return dsn


class CliError(Exception):
    """A user-facing failure: printed as one line."""


class UsageError(CliError):
    """A bad command line argument: one line and exit code 2, like argparse's."""


def literal_console(*, stderr: bool = False) -> Console:
    """A console that prints every string as it is: queue names, payloads and
    error texts are data, never rich markup (``[b]`` stays ``[b]``). Styles
    come only from :class:`Text` spans built here."""
    return Console(stderr=stderr, markup=False, highlight=False, emoji=False)


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
    console.print(f"pyalk schema: {before or 'not installed'} -> {after}", soft_wrap=True)


def cmd_sql(args: argparse.Namespace, console: Console) -> None:
    sys.stdout.write(router_install(args.router) if args.router else install_script(after=_known_version(args.after)))


def cmd_extension(args: argparse.Namespace, console: Console) -> None:
    for path in extension.write(Path(args.out)):
        console.print(str(path), highlight=False)


def _known_version(after: str | None) -> str | None:
    """``--after`` must name a version of the chain (pyalk.schema.install.versions())."""
    known = [version.number for version in versions()]
    if after is not None and after not in known:
        raise UsageError(f"--after {after!r} is not a pyalk version: known versions are {', '.join(known)}"
                         " (without --after: the install into a database without pyalk)")
    return after


def cmd_demo(args: argparse.Namespace, console: Console) -> None:
    dsn = args.dsn or os.environ.get("PYALK_DSN")
    if dsn:
        demo.run(dsn, jobs=args.jobs, workers=args.workers, console=console)
        return
    # A server that was already running (pyalk server start) stays running.
    keep = args.keep_server or embedded.info().running
    console.print("starting an embedded PostgreSQL ...")
    dsn = embedded.start(stop_at_exit=not keep)
    demo.run(dsn, jobs=args.jobs, workers=args.workers, console=console)
    server = embedded.info()
    if keep:
        _print_server(server, console, "the embedded PostgreSQL keeps running")
    else:
        embedded.stop(server.data_dir)
        console.print(f"the embedded PostgreSQL stopped; its data stays in {server.data_dir}", soft_wrap=True)
        console.print("  reuse it:  pyalk server start  (or pyalk demo --keep-server)", soft_wrap=True)
        console.print("  remove it: pyalk server stop --delete", soft_wrap=True)


# the embedded server ------------------------------------------------------------


def _print_server(server: Any, console: Console, headline: str) -> None:
    """Everything needed to reach, stop and remove the embedded server, as
    commands that work when pasted."""
    console.print(f"{headline}: data in {server.data_dir}, unix socket only (no TCP port)", soft_wrap=True)
    console.print(f"  dsn:    {server.conninfo}", soft_wrap=True)
    console.print(f"  psql:   {server.psql_command()}", soft_wrap=True)
    console.print(f"  pyalk:  export PYALK_DSN={shlex.quote(server.conninfo)}", soft_wrap=True)
    console.print("  stop:   pyalk server stop   (remove its data too: pyalk server stop --delete)", soft_wrap=True)


def cmd_server(args: argparse.Namespace, console: Console) -> int | None:
    """``pyalk server start|stop|status|url``: the embedded PostgreSQL that
    ``--embedded`` and the demo use (``PYALK_EMBEDDED_DIR`` chooses its data)."""
    if args.delete and args.action != "stop":
        raise UsageError("--delete goes with pyalk server stop")
    if args.action == "start":
        migrate.upgrade(embedded.start(stop_at_exit=False))
        _print_server(embedded.info(), console, "the embedded PostgreSQL is running")
        return None
    if args.action == "stop":
        data_dir = embedded.default_data_dir()
        was_running = embedded.stop(delete=args.delete)
        done = "stopped" if was_running else "was not running"
        console.print(f"the embedded PostgreSQL {done}"
                      + (f"; removed {data_dir}" if args.delete else f"; its data stays in {data_dir}"),
                      soft_wrap=True)
        return None
    server = embedded.info()
    if args.action == "url":
        if not server.running:
            raise CliError(f"the embedded PostgreSQL is not running (data in {server.data_dir}): pyalk server start")
        sys.stdout.write(f"{server.conninfo}\n")
        return None
    if not server.running:
        console.print(f"the embedded PostgreSQL is not running: data in {server.data_dir}"
                      f"{'' if server.data_dir.exists() else ' (none yet)'}; start it with: pyalk server start",
                      soft_wrap=True)
        return 3  # as pg_ctl status: not running
    _print_server(server, console, "the embedded PostgreSQL is running")
    return None


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
            console.print(str(job_id))
            return
        # JSON Lines on stdin: one job per non-blank line, enqueued in batches.
        payloads = [_json_argument(line, f"line {number} of stdin")
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
        console.print(f"enqueued {_plural(len(ids), 'job')} into {args.queue!r}{span}", soft_wrap=True)


def _plural(count: int, noun: str) -> str:
    """``1 job``, ``2 jobs``, ``0 jobs``."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def _stats_table(alk: Alk, queue: str | None) -> RenderableType:
    stats = alk.stats(queue)
    now = int(alk.executor.value("SELECT alk.now()"))
    return _render_stats(stats, now)


def _render_stats(stats: Sequence[QueueStats], now: int) -> RenderableType:
    """The status table. Cells are Text, so a queue named ``x[/]`` is shown
    as it is; no cell wraps, so a row is one line in a pipe."""
    if not stats:
        return Text("no jobs in any queue")
    table = Table(title=f"pyalk queues at {_stamp(now)} UTC", title_justify="left")
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
            Text(_ago(row.oldest_ready_age_s)),
            Text("-" if row.next_run_at is None else "in " + _ago(row.next_run_at - now)),
        )
    return table


def _print_json(document: Any) -> None:
    """One JSON document on stdout: data only, for scripts."""
    sys.stdout.write(json.dumps(document, ensure_ascii=False) + "\n")


def cmd_status(args: argparse.Namespace, console: Console) -> None:
    if args.json and args.watch:
        raise UsageError("--json prints one document: it does not combine with --watch")
    with _client(args) as alk:
        if args.json:
            _print_json([dataclasses.asdict(row) for row in alk.stats(args.queue)])
            return
        if not args.watch:
            console.print(_stats_table(alk, args.queue))
            return
        # Ctrl-C ends the watch through main: exit code 130, as documented.
        refreshes = 0
        with Live(_stats_table(alk, args.queue), console=console, auto_refresh=False) as live:
            while args.count is None or refreshes < args.count:
                refreshes += 1
                if refreshes > 1:
                    time.sleep(args.interval)  # the refresh period of the display
                live.update(_stats_table(alk, args.queue), refresh=True)


def cmd_jobs(args: argparse.Namespace, console: Console) -> None:
    with _client(args) as alk:
        jobs = alk.queue(args.queue).list_jobs(args.state, limit=args.limit, after_id=args.after_id)
    if args.json:
        _print_json([dataclasses.asdict(job) for job in jobs])
        return
    if not jobs:
        console.print(f"no {args.state + ' ' if args.state else ''}jobs in {args.queue!r}", soft_wrap=True)
        return
    console.print(_jobs_table(jobs, Text(f"{args.state or 'all'} jobs of {args.queue!r}"), console.width))
    if len(jobs) == args.limit:
        console.print(f"more may follow: --after-id {jobs[-1].id}")


def _jobs_table(jobs: Sequence[Job], title: Text, width: int) -> Table:
    """One line per job in ``width`` columns: cells never wrap (a payload is
    never broken mid-word); the last error and the payload share what the
    other columns leave and end in an ellipsis when they do not fit
    (``--json`` has them whole). A narrow console loses the worker column."""
    headers = ["id", "state", "attempts", "run at (UTC)", "worker", "last error", "payload"]
    rows = [[
        str(job.id), job.state, f"{job.attempts}/{job.max_attempts}",
        _stamp(job.died_at if job.state == "dead" else job.run_at), job.worker_id or "-",
        _one_line(job.last_error or "-"), json.dumps(job.payload, ensure_ascii=False),
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


def _one_line(text: str) -> str:
    """A multi-line error (a traceback's last lines) as one table line."""
    return " ".join(text.split())


def cmd_requeue_dead(args: argparse.Namespace, console: Console) -> None:
    with _client(args) as alk, console.status(Text(f"requeueing dead jobs of {args.queue!r}")):
        moved = alk.queue(args.queue).requeue_dead(args.ids)
    console.print(f"requeued {_plural(moved, 'dead job')} of {args.queue!r}", soft_wrap=True)


# worker --------------------------------------------------------------------------


def _is_async(handler: Any) -> bool:
    call = getattr(handler, "__call__", None)  # noqa: B004 - an async __call__ counts
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)


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


def cmd_worker(args: argparse.Namespace, console: Console) -> None:
    handler = _worker_handler(_import(args.target, "the handler"), args)
    fail_on: list[type[BaseException]] = [PermanentError]
    for spec in args.fail_on:
        error_class = _import(spec, "--fail-on")
        if not (isinstance(error_class, type) and issubclass(error_class, BaseException)):
            raise CliError(f"--fail-on {spec} is not an exception class")
        fail_on.append(error_class)
    dsn = _database(args)
    try:
        _check_before_working(dsn, args.queue)
    except psycopg.OperationalError as error:
        if not server_busy(error):
            raise
        # Reachable but full (53300): like after a restart, the worker waits for a slot.
        print("warning: every connection slot of the server is taken (too many clients); the worker retries "
              "with back-off until one frees", file=sys.stderr, flush=True)
    options: dict[str, Any] = {
        "concurrency": args.concurrency, "worker_id": args.worker_id, "fail_on": tuple(fail_on),
        "batch_size": args.batch_size, "poll_interval": args.poll_interval, "grace_period": args.grace,
        "listen": not args.no_listen, "burst": args.burst,
    }
    options.update(worker_observer(args, dsn))
    counts: WorkerCounts
    if _is_async(handler):
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

    server = commands.add_parser("server", help="start, stop or show the embedded PostgreSQL (--embedded, demo)")
    server.add_argument("action", choices=("start", "stop", "status", "url"),
                        help="start (and migrate) | stop | status (exit 3: not running) | url (print its DSN)")
    server.add_argument("--delete", action="store_true", help="with stop: remove its data directory too")
    server.set_defaults(run=cmd_server)

    worker = commands.add_parser("worker", help="run a worker: call module:function on every job of a queue")
    worker.add_argument("target", metavar="module:function",
                        help="the handler (an async def runs on asyncio, a plain function on a thread pool),"
                             " or a pyalk.Tasks registry")
    worker.add_argument("--queue", "-q", help="the queue to work (required, unless a registry has only one)")
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
    add_worker_option(worker)
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
    status.add_argument("--json", action="store_true", help="one JSON array of alk.queue_stats rows, for scripts")
    database_options(status)
    status.set_defaults(run=cmd_status)

    jobs = commands.add_parser("jobs", help="list the jobs of a queue (alk.list_jobs)")
    jobs.add_argument("queue")
    jobs.add_argument("--state", choices=("pending", "processing", "dead"))
    jobs.add_argument("--limit", type=_positive_int, default=20)
    jobs.add_argument("--after-id", type=int, help="page on: the last id of the previous page")
    jobs.add_argument("--json", action="store_true", help="one JSON array of whole rows, for scripts")
    database_options(jobs)
    jobs.set_defaults(run=cmd_jobs)

    requeue = commands.add_parser("requeue-dead", help="send dead jobs back to pending (alk.requeue_dead)")
    requeue.add_argument("queue")
    requeue.add_argument("--id", dest="ids", type=int, action="append", metavar="JOB_ID",
                         help="only this job (repeatable); default: every dead job of the queue")
    database_options(requeue)
    requeue.set_defaults(run=cmd_requeue_dead)

    shared = Shared(error=CliError, client=_client, database=_database, load=_import,
                    json_argument=_json_argument, stamp=_stamp, is_async=_is_async)
    add_schedule_commands(commands, database_options, shared)  # schedule, scheduler, relay
    add_commands(commands, database_options, _with_database)  # dashboard, metrics
    return root


def _with_database(command: Callable[[argparse.Namespace, str], None]) -> Callable[[argparse.Namespace, Console], None]:
    return lambda args, console: command(args, _database(args))


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    console = literal_console(stderr=args.command == "sql")
    errors = literal_console(stderr=True)
    run: Callable[[argparse.Namespace, Console], int | None] = args.run
    try:
        code = run(args, console)
    except UsageError as error:
        errors.print(Text.assemble(("error:", "red"), f" {error}"), soft_wrap=True)
        return 2
    except (CliError, AlkError, RuntimeError) as error:
        errors.print(Text.assemble(("error:", "red"), f" {error}"), soft_wrap=True)
        return 1
    except psycopg.Error as error:
        lines = str(error).strip().splitlines()
        message = lines[0] if lines else type(error).__name__
        if error.sqlstate in ("42883", "3F000"):  # undefined function, no such schema
            message += " (is pyalk installed in this database? run: pyalk migrate)"
        errors.print(Text.assemble(("database error:", "red"), f" {message}"), soft_wrap=True)
        return 1
    except KeyboardInterrupt:
        return 130
    return code or 0


if __name__ == "__main__":
    sys.exit(main())
