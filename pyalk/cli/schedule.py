"""``pyalk schedule add|list|remove|next`` (the bindings of docs/schedule.md)
and ``pyalk scheduler`` (the leader loop, ``alk.run_schedules``). Every value
from the database or the user is printed literally (never as console markup).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from rich.console import Console
from rich.table import Table
from rich.text import Text

from pyalk import Alk, StopToken, log
from pyalk.cli.common import (
    CliError,
    Commands,
    client,
    database,
    database_options,
    default_of,
    json_argument,
    logging_options,
    positive_float,
    positive_int,
    say,
    stamp,
    stopping_on_signals,
)


def _next_text(at: int | None) -> str:
    return "never" if at is None else f"{stamp(at)} UTC ({at})"


def cmd_schedule_add(args: argparse.Namespace, console: Console) -> None:
    payload = None if args.payload is None else json_argument(args.payload, "--payload")
    with client(args) as alk:
        next_fire_at = alk.schedules.add(args.name, args.spec, args.queue, priority=args.priority,
                                         max_attempts=args.max_attempts, expires=args.expires,
                                         payload=payload, tz=args.tz)
    say(console, f"schedule {args.name!r} into {args.queue!r}: next fire {_next_text(next_fire_at)}")


def cmd_schedule_list(args: argparse.Namespace, console: Console) -> None:
    with client(args) as alk:
        schedules = alk.schedules.list()
    if args.json:
        for schedule in schedules:
            sys.stdout.write(json.dumps(dataclasses.asdict(schedule)) + "\n")
        return
    if not schedules:
        say(console, "no schedules")
        return
    table = Table(title="pyalk schedules", title_justify="left")
    for name in ("name", "spec", "tz", "queue", "next fire (UTC)"):
        table.add_column(name, overflow="fold")
    for schedule in schedules:
        table.add_row(Text(schedule.name), Text(schedule.spec), Text(schedule.tz), Text(schedule.queue),
                      Text("never" if schedule.next_fire_at is None else stamp(schedule.next_fire_at)))
    console.print(table)


def cmd_schedule_remove(args: argparse.Namespace, console: Console) -> None:
    with client(args) as alk:
        if not alk.schedules.remove(args.name):
            raise CliError(f"no schedule named {args.name!r}")
    say(console, f"removed schedule {args.name!r}")


def cmd_schedule_next(args: argparse.Namespace, console: Console) -> None:
    with client(args) as alk:
        after = args.after if args.after is not None else int(alk.executor.value("SELECT alk.now()"))
        for _ in range(args.count):
            at = alk.schedules.cron_next(args.spec, after, args.tz)
            if at is None:
                say(console, "never (no further fire up to 9999-12-31)")
                return
            say(console, f"{at}  {stamp(at)} UTC")
            after = at


# pyalk scheduler: until SIGINT or SIGTERM ----------------------------------------------------


def cmd_scheduler(args: argparse.Namespace, console: Console) -> None:
    log.configure(args.log_level, args.log_format)
    dsn = database(args)
    stop = StopToken()
    with Alk(dsn) as alk, stopping_on_signals(stop.cancel):
        alk.run_schedules(stop, owner=args.owner, lease_ttl=args.lease_ttl, poll_interval=args.poll_interval)
    Console(stderr=True).print("scheduler stopped", markup=False, highlight=False)


def register(commands: Commands) -> None:
    schedule = commands.add_parser("schedule", help="add, list, remove schedules; show a spec's next fires")
    actions = schedule.add_subparsers(dest="action", required=True)

    add = actions.add_parser("add", help="register or replace a schedule (alk.schedule)")
    add.add_argument("name")
    add.add_argument("spec", help="a cron spec: '0 2 * * *', '@daily', '@every 30s'")
    add.add_argument("queue", help="the queue every fire enqueues a job into")
    add.add_argument("--tz", help="IANA time zone of the spec (default: UTC)")
    add.add_argument("--payload", metavar="JSON", help="the JSON value the fired jobs carry")
    add.add_argument("--priority", type=int)
    add.add_argument("--max-attempts", type=int)
    add.add_argument("--expires", type=int, help="TTL in seconds of every fired job")
    database_options(add)
    add.set_defaults(run=cmd_schedule_add)

    listing = actions.add_parser("list", help="every schedule, by name (alk.list_schedules)")
    listing.add_argument("--json", action="store_true", help="one JSON object per line")
    database_options(listing)
    listing.set_defaults(run=cmd_schedule_list)

    remove = actions.add_parser("remove", help="delete a schedule (alk.unschedule)")
    remove.add_argument("name")
    database_options(remove)
    remove.set_defaults(run=cmd_schedule_remove)

    upcoming = actions.add_parser("next", help="the next fire times of a spec (alk.cron_next)")
    upcoming.add_argument("spec")
    upcoming.add_argument("--tz", help="IANA time zone of the spec (default: UTC)")
    upcoming.add_argument("--count", "-n", type=positive_int, default=5, help="how many (default: %(default)s)")
    upcoming.add_argument("--after", type=int, metavar="UNIX_SECONDS", help="start after this time (default: now)")
    database_options(upcoming)
    upcoming.set_defaults(run=cmd_schedule_next)

    scheduler = commands.add_parser("scheduler", help="run the scheduler's leader loop (fires due schedules)")
    scheduler.add_argument("--owner", help="this contender's name (default: host:pid:random)")
    scheduler.add_argument("--lease-ttl", type=positive_int, default=default_of(Alk.run_schedules, "lease_ttl"),
                           help="seconds of the leader lease, renewed every third (default: %(default)s)")
    scheduler.add_argument("--poll-interval", type=positive_float,
                           default=default_of(Alk.run_schedules, "poll_interval"),
                           help="longest sleep in seconds: standby retries, new schedules noticed "
                                "(default: %(default)s)")
    logging_options(scheduler)
    database_options(scheduler)
    scheduler.set_defaults(run=cmd_scheduler)
