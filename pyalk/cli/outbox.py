"""``pyalk relay``: deliver an outbox by calling ``module:function`` on every
message (``outbox.run``, docs/outbox.md) until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from rich.console import Console

from pyalk import Alk, AsyncAlk, AsyncStopToken, Outbox, StopToken, log
from pyalk.cli.common import (
    CliError,
    Commands,
    database,
    database_options,
    default_of,
    is_async,
    load,
    logging_options,
    positive_float,
    say,
    stopping_on_signals,
)


def cmd_relay(args: argparse.Namespace, console: Console) -> None:
    delivery = load(args.target, "the delivery function")
    if not callable(delivery):
        raise CliError(f"{args.target} is not callable")
    log.configure(args.log_level, args.log_format)
    dsn = database(args)
    options: dict[str, Any] = {"worker_id": args.worker_id, "poll_interval": args.poll_interval, "burst": args.burst}
    if is_async(delivery):
        async def run_async() -> tuple[int, int]:
            stop = AsyncStopToken()
            async with AsyncAlk(dsn) as alk:
                with stopping_on_signals(stop.cancel):
                    counts = await alk.outbox(args.outbox).run(stop, delivery, **options)
            return counts.delivered, counts.failed

        delivered, failed = asyncio.run(run_async())
    else:
        stop = StopToken()
        with Alk(dsn) as alk, stopping_on_signals(stop.cancel):
            counts = alk.outbox(args.outbox).run(stop, delivery, **options)
        delivered, failed = counts.delivered, counts.failed
    say(Console(stderr=True), f"relay of {args.outbox!r} stopped: {delivered} delivered, {failed} failed")


def register(commands: Commands) -> None:
    relay = commands.add_parser("relay", help="deliver an outbox: call module:function on every message")
    relay.add_argument("outbox")
    relay.add_argument("target", metavar="module:function",
                       help="the delivery: returning acks, raising retries; an async def runs on asyncio")
    relay.add_argument("--worker-id", help="the claims' worker id (default: relay:<outbox>)")
    relay.add_argument("--poll-interval", type=positive_float, default=default_of(Outbox.run, "poll_interval"),
                       help="seconds between looks when nothing is due (default: %(default)s)")
    relay.add_argument("--burst", action="store_true", help="exit once nothing is due")
    logging_options(relay)
    database_options(relay)
    relay.set_defaults(run=cmd_relay)
