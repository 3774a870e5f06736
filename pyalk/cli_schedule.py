"""The long-running and scheduling commands of ``pyalk`` (docs/cli.md):
``pyalk schedule add|list|remove|next`` (the bindings of docs/schedule.md),
``pyalk scheduler`` (the leader loop, ``run_schedules``) and ``pyalk relay``
(an outbox relay calling ``module:function`` on every message).

:func:`add_schedule_commands` adds them to the parser of :mod:`pyalk.cli`, which hands
over the helpers it owns (connections, imports, its error class) as a
:class:`Shared`: pyalk.cli imports this module, never the reverse. Every
value from the database or the user is printed literally (never as console
markup).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from pyalk import Alk, AsyncAlk, AsyncJobHandle, AsyncStopToken, JobHandle, StopToken, log
from pyalk.errors import TRANSIENT_ERRORS

logger = logging.getLogger("pyalk.relay")

DatabaseOptions = Callable[[argparse.ArgumentParser], None]


@dataclasses.dataclass(frozen=True)
class Shared:
    """The helpers of :mod:`pyalk.cli` these commands use (each command finds
    it as ``args.shared``)."""

    #: The CLI's one-line user error (exit code 1).
    error: type[Exception]
    #: A client on one direct connection to ``--dsn`` / ``--embedded``.
    client: Callable[[argparse.Namespace], AbstractContextManager[Alk]]
    #: The conninfo of ``--dsn`` / ``--embedded`` (an embedded server migrated).
    database: Callable[[argparse.Namespace], str]
    #: Import ``module:name`` (``what`` names it in errors).
    load: Callable[[str, str], Any]
    json_argument: Callable[[str, str], Any]
    #: Unix seconds as ``YYYY-MM-DD HH:MM:SS`` (UTC).
    stamp: Callable[[int | None], str]
    #: Whether a callable is an ``async def`` (or has an async ``__call__``).
    is_async: Callable[[Any], bool]


def _say(console: Console, text: str) -> None:
    console.print(text, markup=False, highlight=False, soft_wrap=True)


def _next_text(shared: Shared, at: int | None) -> str:
    return "never" if at is None else f"{shared.stamp(at)} UTC ({at})"


# pyalk schedule ... ------------------------------------------------------------------


def cmd_schedule_add(args: argparse.Namespace, console: Console) -> None:
    shared: Shared = args.shared
    payload = None if args.payload is None else shared.json_argument(args.payload, "--payload")
    with shared.client(args) as alk:
        next_fire_at = alk.schedules.add(args.name, args.spec, args.queue, priority=args.priority,
                                         max_attempts=args.max_attempts, expires=args.expires,
                                         payload=payload, tz=args.tz)
    _say(console, f"schedule {args.name!r} into {args.queue!r}: next fire {_next_text(shared, next_fire_at)}")


def cmd_schedule_list(args: argparse.Namespace, console: Console) -> None:
    shared: Shared = args.shared
    with shared.client(args) as alk:
        schedules = alk.schedules.list()
    if args.json:
        for schedule in schedules:
            sys.stdout.write(json.dumps(dataclasses.asdict(schedule)) + "\n")
        return
    if not schedules:
        _say(console, "no schedules")
        return
    table = Table(title="pyalk schedules", title_justify="left")
    for name in ("name", "spec", "tz", "queue", "next fire (UTC)"):
        table.add_column(name, overflow="fold")
    for schedule in schedules:
        table.add_row(Text(schedule.name), Text(schedule.spec), Text(schedule.tz), Text(schedule.queue),
                      Text("never" if schedule.next_fire_at is None else shared.stamp(schedule.next_fire_at)))
    console.print(table)


def cmd_schedule_remove(args: argparse.Namespace, console: Console) -> None:
    shared: Shared = args.shared
    with shared.client(args) as alk:
        if not alk.schedules.remove(args.name):
            raise shared.error(f"no schedule named {args.name!r}")
    _say(console, f"removed schedule {args.name!r}")


def cmd_schedule_next(args: argparse.Namespace, console: Console) -> None:
    shared: Shared = args.shared
    with shared.client(args) as alk:
        after = args.after if args.after is not None else int(alk.executor.value("SELECT alk.now()"))
        for _ in range(args.count):
            at = alk.schedules.cron_next(args.spec, after, args.tz)
            if at is None:
                _say(console, "never (no further fire up to 9999-12-31)")
                return
            _say(console, f"{at}  {shared.stamp(at)} UTC")
            after = at


# pyalk scheduler / pyalk relay: stop on SIGINT and SIGTERM ------------------------------


@contextmanager
def _stopping_on_signals(cancel: Callable[[], None]) -> Iterator[None]:
    """SIGINT and SIGTERM cancel the loop's stop token (the loop then returns
    cleanly); the previous handlers come back afterwards."""
    previous = {number: signal.signal(number, lambda *_: cancel()) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def cmd_scheduler(args: argparse.Namespace, console: Console) -> None:
    shared: Shared = args.shared
    log.configure(args.log_level, args.log_format)
    dsn = shared.database(args)
    stop = StopToken()
    with Alk(dsn) as alk, _stopping_on_signals(stop.cancel):
        alk.run_schedules(stop, owner=args.owner, lease_ttl=args.lease_ttl, poll_interval=args.poll_interval)
    Console(stderr=True).print("scheduler stopped", markup=False, highlight=False)


@dataclasses.dataclass
class _Tally:
    delivered: int = 0
    failed: int = 0


def _not_delivered(outbox: str, message: JobHandle | AsyncJobHandle, error: Exception) -> None:
    # A retry keeps no error text on the row (only a dead message does): say it here.
    logger.warning("relay %r: message %s (attempt %s of %s) not delivered, retried later: %s: %s", outbox,
                   message.id, message.job.attempts, message.job.max_attempts, type(error).__name__, error,
                   extra={"job_id": message.id})


def _relay_loop(alk: Alk, args: argparse.Namespace, delivery: Callable[[JobHandle], Any], stop: StopToken,
                tally: _Tally) -> None:
    outbox = alk.outbox(args.outbox)
    worker_id = args.worker_id or f"relay:{args.outbox}"
    failures = 0

    def counted(message: JobHandle) -> None:
        try:
            delivery(message)
        except Exception as error:
            tally.failed += 1
            _not_delivered(args.outbox, message, error)
            raise
        tally.delivered += 1

    while not stop.is_cancelled():
        try:
            if outbox.run_once(worker_id, counted):
                failures = 0
                continue
        except TRANSIENT_ERRORS as error:
            failures += 1
            pause = min(0.1 * 2 ** min(failures - 1, 10), args.poll_interval)
            logger.warning("relay %r: database unavailable (%s); trying again in %.1fs", args.outbox,
                           str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__, pause)
            stop.wait(pause)
            continue
        if args.burst:
            return
        stop.wait(args.poll_interval)  # nothing due: look again then (a stop wakes it at once)


async def _relay_loop_async(alk: AsyncAlk, args: argparse.Namespace, delivery: Callable[[AsyncJobHandle], Any],
                            stop: AsyncStopToken, tally: _Tally) -> None:
    outbox = alk.outbox(args.outbox)
    worker_id = args.worker_id or f"relay:{args.outbox}"
    failures = 0

    async def counted(message: AsyncJobHandle) -> None:
        try:
            await delivery(message)
        except Exception as error:
            tally.failed += 1
            _not_delivered(args.outbox, message, error)
            raise
        tally.delivered += 1

    while not stop.is_cancelled():
        try:
            if await outbox.run_once(worker_id, counted):
                failures = 0
                continue
        except TRANSIENT_ERRORS as error:
            failures += 1
            pause = min(0.1 * 2 ** min(failures - 1, 10), args.poll_interval)
            logger.warning("relay %r: database unavailable (%s); trying again in %.1fs", args.outbox,
                           str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__, pause)
            await stop.wait(pause)
            continue
        if args.burst:
            return
        await stop.wait(args.poll_interval)


def cmd_relay(args: argparse.Namespace, console: Console) -> None:
    shared: Shared = args.shared
    delivery = shared.load(args.target, "the delivery function")
    if not callable(delivery):
        raise shared.error(f"{args.target} is not callable")
    log.configure(args.log_level, args.log_format)
    dsn = shared.database(args)
    tally = _Tally()
    if shared.is_async(delivery):
        async def run_async() -> None:
            stop = AsyncStopToken()
            async with AsyncAlk(dsn) as alk:
                with _stopping_on_signals(stop.cancel):
                    await _relay_loop_async(alk, args, delivery, stop, tally)

        asyncio.run(run_async())
    else:
        stop = StopToken()
        with Alk(dsn) as alk, _stopping_on_signals(stop.cancel):
            _relay_loop(alk, args, delivery, stop, tally)
    Console(stderr=True).print(f"relay of {args.outbox!r} stopped: {tally.delivered} delivered, {tally.failed} failed",
                               markup=False, highlight=False)


# the parser -------------------------------------------------------------------------------


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _logging_options(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    sub.add_argument("--log-format", default="text", choices=("text", "json"))


def add_schedule_commands(commands: Any, database_options: DatabaseOptions, shared: Shared) -> None:
    """Add ``schedule``, ``scheduler`` and ``relay`` to ``commands`` (the
    subparsers of :func:`pyalk.cli.parser`)."""
    schedule = commands.add_parser("schedule", help="add, list, remove schedules; show a spec's next fires")
    actions = schedule.add_subparsers(dest="action", required=True)

    add = actions.add_parser("add", help="register or replace a schedule (alk.schedule)")
    add.add_argument("name")
    add.add_argument("spec", help="a cron spec: '0 2 * * *', '@daily', '@every 30s'")
    add.add_argument("queue", help="the queue every fire enqueues a job into")
    add.add_argument("--tz", help="IANA time zone of the spec (default UTC)")
    add.add_argument("--payload", metavar="JSON", help="the JSON value the fired jobs carry")
    add.add_argument("--priority", type=int)
    add.add_argument("--max-attempts", type=int)
    add.add_argument("--expires", type=int, help="TTL in seconds of every fired job")
    database_options(add)
    add.set_defaults(run=cmd_schedule_add, shared=shared)

    listing = actions.add_parser("list", help="every schedule, by name (alk.list_schedules)")
    listing.add_argument("--json", action="store_true", help="one JSON object per line")
    database_options(listing)
    listing.set_defaults(run=cmd_schedule_list, shared=shared)

    remove = actions.add_parser("remove", help="delete a schedule (alk.unschedule)")
    remove.add_argument("name")
    database_options(remove)
    remove.set_defaults(run=cmd_schedule_remove, shared=shared)

    upcoming = actions.add_parser("next", help="the next fire times of a spec (alk.cron_next)")
    upcoming.add_argument("spec")
    upcoming.add_argument("--tz", help="IANA time zone of the spec (default UTC)")
    upcoming.add_argument("--count", "-n", type=_positive_int, default=5, help="how many (5)")
    upcoming.add_argument("--after", type=int, metavar="UNIX_SECONDS", help="start after this time (default: now)")
    database_options(upcoming)
    upcoming.set_defaults(run=cmd_schedule_next, shared=shared)

    scheduler = commands.add_parser("scheduler", help="run the scheduler's leader loop (fires due schedules)")
    scheduler.add_argument("--owner", help="this contender's name (default: host:pid:random)")
    scheduler.add_argument("--lease-ttl", type=_positive_int, default=30,
                           help="seconds of the leader lease, renewed every third (30)")
    scheduler.add_argument("--poll-interval", type=_positive_float, default=5.0,
                           help="longest sleep in seconds: standby retries, new schedules noticed (5)")
    _logging_options(scheduler)
    database_options(scheduler)
    scheduler.set_defaults(run=cmd_scheduler, shared=shared)

    relay = commands.add_parser("relay", help="deliver an outbox: call module:function on every message")
    relay.add_argument("outbox")
    relay.add_argument("target", metavar="module:function",
                       help="the delivery: returning acks, raising retries; an async def runs on asyncio")
    relay.add_argument("--worker-id", help="the claims' worker id (default: relay:<outbox>)")
    relay.add_argument("--poll-interval", type=_positive_float, default=1.0,
                       help="seconds between looks when nothing is due (1)")
    relay.add_argument("--burst", action="store_true", help="exit once nothing is due")
    _logging_options(relay)
    database_options(relay)
    relay.set_defaults(run=cmd_relay, shared=shared)
