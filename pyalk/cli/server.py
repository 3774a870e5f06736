"""``pyalk server start|stop|status|url``: the embedded PostgreSQL that
``--embedded`` and ``pyalk demo`` use (``PYALK_EMBEDDED_DIR`` chooses its data)."""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

from rich.console import Console

from pyalk import embedded
from pyalk.cli.common import CliError, Commands, UsageError


def print_server(server: Any, console: Console, headline: str) -> None:
    """Everything needed to reach, stop and remove the embedded server, as
    commands that work when pasted."""
    console.print(f"{headline}: data in {server.data_dir}, unix socket only (no TCP port)", soft_wrap=True)
    console.print(f"  dsn:    {server.conninfo}", soft_wrap=True)
    console.print(f"  psql:   {server.psql_command()}", soft_wrap=True)
    console.print(f"  pyalk:  export PYALK_DSN={shlex.quote(server.conninfo)}", soft_wrap=True)
    console.print("  stop:   pyalk server stop   (remove its data too: pyalk server stop --delete)", soft_wrap=True)


def cmd_server(args: argparse.Namespace, console: Console) -> int | None:
    from pyalk.schema import migrate  # lazy: Alembic and SQLAlchemy (pyalk/cli/common.py)

    if args.delete and args.action != "stop":
        raise UsageError("--delete goes with pyalk server stop")
    if args.action == "start":
        migrate.upgrade(embedded.start(stop_at_exit=False))
        print_server(embedded.info(), console, "the embedded PostgreSQL is running")
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
    print_server(server, console, "the embedded PostgreSQL is running")
    return None


def register(commands: Commands) -> None:
    server = commands.add_parser("server", help="start, stop or show the embedded PostgreSQL (--embedded, demo)")
    server.add_argument("action", choices=("start", "stop", "status", "url"),
                        help="start (and migrate) | stop | status (exit 3: not running) | url (print its DSN)")
    server.add_argument("--delete", action="store_true", help="with stop: remove its data directory too")
    server.set_defaults(run=cmd_server)
