"""The ``pyalk`` command line (docs/cli.md): one module per command group,
each adding its commands with ``register(commands)``; what they share is in
:mod:`pyalk.cli.common`. Errors are one clear line and exit code 1."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from pyalk.cli import dashboard, demo, jobs, outbox, queue, schedule, schema, server, worker, workers
from pyalk.cli.common import REPORTED, Command, literal_console, report

#: In the order ``pyalk --help`` lists them.
GROUPS = (schema, demo, server, worker, workers, queue, jobs, schedule, outbox, dashboard)


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="pyalk", description="Job queues and more, inside PostgreSQL.")
    commands = root.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        group.register(commands)
    return root


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    console = literal_console(stderr=args.command == "sql")  # stdout carries the script
    run: Command = args.run
    try:
        code = run(args, console)
    except REPORTED as error:
        return report(error)
    except KeyboardInterrupt:
        return 130
    return code or 0


__all__ = ["main", "parser"]
