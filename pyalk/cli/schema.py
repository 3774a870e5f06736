"""``pyalk migrate``, ``pyalk sql`` and ``pyalk extension``: installing and
upgrading pyalk's schema (docs/migrations.md, docs/install.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from pyalk.cli.common import Commands, UsageError, database_options, dsn
from pyalk.schema import extension
from pyalk.schema.install import install_script, versions
from pyalk.schema.router import router_install


def cmd_migrate(args: argparse.Namespace, console: Console) -> None:
    from pyalk.schema import migrate  # lazy: Alembic and SQLAlchemy (pyalk/cli/common.py)

    conninfo = dsn(args)
    before = migrate.current(conninfo)
    migrate.upgrade(conninfo)
    after = migrate.current(conninfo)
    console.print(f"pyalk schema: {before or 'not installed'} -> {after}", soft_wrap=True)


def cmd_sql(args: argparse.Namespace, console: Console) -> None:
    sys.stdout.write(router_install(args.router) if args.router else install_script(after=known_version(args.after)))


def cmd_extension(args: argparse.Namespace, console: Console) -> None:
    for path in extension.write(Path(args.out)):
        console.print(str(path), highlight=False)


def known_version(after: str | None) -> str | None:
    """``--after`` must name a version of the chain (pyalk.schema.install.versions())."""
    known = [version.number for version in versions()]
    if after is not None and after not in known:
        raise UsageError(f"--after {after!r} is not a pyalk version: known versions are {', '.join(known)}"
                         " (without --after: the install into a database without pyalk)")
    return after


def register(commands: Commands) -> None:
    migrating = commands.add_parser("migrate", help="apply every pending migration (Alembic)")
    database_options(migrating)
    migrating.set_defaults(run=cmd_migrate)

    sql = commands.add_parser("sql", help="print the install script for psql")
    sql.add_argument("--after", help="the installed version: print only the upgrade from it")
    sql.add_argument("--router", action="append", metavar="PARTITION",
                     help="print the PL/Proxy router install instead; repeat per partition conninfo, p0 first")
    sql.set_defaults(run=cmd_sql)

    files = commands.add_parser("extension", help="write CREATE EXTENSION alk's control file and scripts")
    files.add_argument("--out", required=True, help="the folder to write into (the server's share/extension)")
    files.set_defaults(run=cmd_extension)
