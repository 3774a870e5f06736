"""The ``pyalk`` command line. Errors are one clear line and exit code 1."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

import psycopg
from rich.console import Console

from pyalk.errors import AlkError


def _dsn(args: argparse.Namespace, *, stop_at_exit: bool = False) -> str:
    if getattr(args, "embedded", False):
        from pyalk import embedded

        return embedded.start(stop_at_exit=stop_at_exit)
    dsn = args.dsn or os.environ.get("PYALK_DSN")
    if not dsn:
        raise CliError("no database: pass --dsn, set PYALK_DSN, or use --embedded")
    return dsn


class CliError(Exception):
    """A user-facing failure: printed as one line."""


def cmd_migrate(args: argparse.Namespace, console: Console) -> None:
    from pyalk import migrate

    dsn = _dsn(args)
    before = migrate.current(dsn)
    migrate.upgrade(dsn)
    after = migrate.current(dsn)
    console.print(f"pyalk schema: {before or 'not installed'} -> {after}")


def cmd_sql(args: argparse.Namespace, console: Console) -> None:
    from pyalk.install import install_script

    sys.stdout.write(install_script(after=args.after))


def cmd_demo(args: argparse.Namespace, console: Console) -> None:
    from pyalk import demo

    dsn = args.dsn or os.environ.get("PYALK_DSN")
    if not dsn:
        console.print("starting an embedded PostgreSQL ...")
        from pyalk import embedded

        dsn = embedded.start(stop_at_exit=not args.keep_server)
    demo.run(dsn, jobs=args.jobs, workers=args.workers, console=console)


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
    sql.set_defaults(run=cmd_sql)

    demo = commands.add_parser("demo", help="run a demo on an embedded PostgreSQL (or --dsn)")
    demo.add_argument("--dsn", help="use this database instead of an embedded server")
    demo.add_argument("--jobs", type=int, default=5000)
    demo.add_argument("--workers", type=int, default=4)
    demo.add_argument("--keep-server", action="store_true", help="leave the embedded server running")
    demo.set_defaults(run=cmd_demo)
    return root


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    console = Console(stderr=args.command == "sql")
    run: Callable[[argparse.Namespace, Console], None] = args.run
    try:
        run(args, console)
    except (CliError, AlkError, RuntimeError) as error:
        console.print(f"[red]error:[/red] {error}")
        return 1
    except psycopg.Error as error:
        console.print(f"[red]database error:[/red] {str(error).strip().splitlines()[0]}")
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
