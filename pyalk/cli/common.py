"""What every command of ``pyalk`` shares: its errors and how they are
reported, the database it works on (``--dsn`` / ``--embedded``), importing
``module:name``, argument types and option groups, the defaults its help
states, and literal output (data is never read as console markup)."""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TypeAlias

import psycopg
from rich.console import Console
from rich.text import Text

from pyalk import Alk, embedded
from pyalk._sync.executor import connect_error
from pyalk.conninfo import default_conninfo
from pyalk.errors import AlkError

#: The subparsers every command module registers its commands on.
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
#: What a command runs: the parsed arguments and stdout's console in, an
#: exit code out (None: 0).
Command = Callable[[argparse.Namespace, Console], "int | None"]


# errors -----------------------------------------------------------------------------


class CliError(Exception):
    """A user-facing failure: printed as one line, exit code 1."""


class UsageError(CliError):
    """A bad command line argument: one line and exit code 2, like argparse's."""


def report(error: BaseException) -> int:
    """Print ``error`` as one line on stderr; the exit code it means."""
    errors = literal_console(stderr=True)
    if isinstance(error, UsageError):
        errors.print(Text.assemble(("error:", "red"), f" {error}"), soft_wrap=True)
        return 2
    if isinstance(error, psycopg.Error):
        lines = str(error).strip().splitlines()
        message = lines[0] if lines else type(error).__name__
        if error.sqlstate in ("42883", "3F000"):  # undefined function, no such schema
            message += " (is pyalk installed in this database? run: pyalk migrate)"
        errors.print(Text.assemble(("database error:", "red"), f" {message}"), soft_wrap=True)
        return 1
    errors.print(Text.assemble(("error:", "red"), f" {error}"), soft_wrap=True)
    return 1


#: The errors :func:`report` turns into one line (anything else is a bug: a traceback).
REPORTED: tuple[type[BaseException], ...] = (CliError, AlkError, RuntimeError, psycopg.Error)


# the database -------------------------------------------------------------------------


def dsn(args: argparse.Namespace, *, stop_at_exit: bool = False) -> str:
    """The embedded server's with ``--embedded``, else ``--dsn``, else
    :func:`~pyalk.conninfo.default_conninfo` (``$PYALK_DSN``, else libpq's
    environment), as ``Alk()`` resolves it."""
    if getattr(args, "embedded", False):
        return embedded.start(stop_at_exit=stop_at_exit)
    return str(args.dsn) if args.dsn is not None else default_conninfo()


def database(args: argparse.Namespace) -> str:
    """The conninfo of the database to work on. An embedded server is
    started (or reused) and migrated: it is pyalk's own."""
    conninfo = dsn(args)
    if getattr(args, "embedded", False):
        # Alembic and SQLAlchemy: only the commands that migrate pay their
        # import (and its teardown at exit, 0.4 s of a stopping worker's time).
        from pyalk.schema import migrate

        migrate.upgrade(conninfo)
    return conninfo


@contextmanager
def client(args: argparse.Namespace) -> Iterator[Alk]:
    """A client on one direct connection: a short command fails at once
    when the server is unreachable instead of waiting on a pool."""
    conninfo = database(args)
    try:
        conn = psycopg.connect(conninfo, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as error:
        if conninfo:  # named by --dsn or PYALK_DSN: libpq's own message says enough
            raise
        # Nothing named a database: say where libpq's defaults led, and how to name one.
        raise CliError(f"{connect_error(conninfo, error)} (no --dsn and no PYALK_DSN: libpq's PG* "
                       "variables and defaults were used; pass --dsn, set PYALK_DSN, or use --embedded)") from error
    with conn:
        yield Alk(conn)


def database_options(sub: argparse.ArgumentParser, *, nested: bool = False) -> None:
    """--dsn and --embedded. ``nested``: ``sub`` is an action of a command
    that takes them too (``pyalk workers --dsn X stop ID``); its own then
    default to nothing, so what was given before the action stands."""
    sub.add_argument("--dsn", default=argparse.SUPPRESS if nested else None,
                     help="libpq conninfo or URI (default: $PYALK_DSN, else libpq's PG* variables)")
    sub.add_argument("--embedded", action="store_true", default=argparse.SUPPRESS if nested else False,
                     help="start or reuse an embedded PostgreSQL")


# user code and arguments --------------------------------------------------------------------


def load(spec: str, what: str) -> Any:
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


def is_async(function: Any) -> bool:
    """Whether a callable is an ``async def`` (or has an async ``__call__``)."""
    call = getattr(function, "__call__", None)  # noqa: B004 - an async __call__ counts
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(call)


def json_argument(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise CliError(f"{what} is not JSON: {error}") from None


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def port(text: str) -> int:
    value = int(text)
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"must be 1 to 65535, got {value}")
    return value


def default_of(function: Callable[..., Any], parameter: str) -> Any:
    """The default of ``function``'s ``parameter``. An option whose value
    goes on to a library call takes the callee's default from here, so its
    help (``%(default)s``) states the value the code uses, never a copy."""
    default = inspect.signature(function).parameters[parameter].default
    if default is inspect.Parameter.empty:
        raise TypeError(f"{parameter} of {function.__qualname__} has no default")
    return default


def logging_options(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    sub.add_argument("--log-format", default="text", choices=("text", "json"))


@contextmanager
def stopping_on_signals(cancel: Callable[[], None]) -> Iterator[None]:
    """SIGINT and SIGTERM cancel a loop's stop token (the loop then returns
    cleanly); the previous handlers come back afterwards."""
    previous = {number: signal.signal(number, lambda *_: cancel()) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


# output -------------------------------------------------------------------------------------


def literal_console(*, stderr: bool = False) -> Console:
    """A console that prints every string as it is: queue names, payloads and
    error texts are data, never rich markup (``[b]`` stays ``[b]``). Styles
    come only from :class:`Text` spans built by the commands."""
    return Console(stderr=stderr, markup=False, highlight=False, emoji=False)


def say(console: Console, text: str) -> None:
    """One line of text, as it is, never wrapped."""
    console.print(text, markup=False, highlight=False, soft_wrap=True)


def print_json(document: Any) -> None:
    """One JSON document on stdout: data only, for scripts."""
    sys.stdout.write(json.dumps(document, ensure_ascii=False) + "\n")


def plural(count: int, noun: str) -> str:
    """``1 job``, ``2 jobs``, ``0 jobs``."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def ago(seconds: int | None) -> str:
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


def stamp(at: int | None) -> str:
    """Unix seconds as ``YYYY-MM-DD HH:MM:SS`` (UTC)."""
    if at is None:
        return "-"
    try:
        return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):
        return str(at)


def one_line(text: str) -> str:
    """A multi-line text (a traceback's last lines) as one table line."""
    return " ".join(text.split())
