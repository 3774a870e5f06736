"""Every default a ``pyalk`` help text states is the value the code uses.

The parser is walked, every option of every command: each ``(default: X)``
is compared with the code's own value, which is a worker built the way
``pyalk worker`` builds one, the signature of the library call an option is
handed to, or, where the CLI itself is the user, the option's parsed default.
A default stated as a description (``$PYALK_DSN``, ``host:pid:random``) is
listed here and belongs to an option the code fills in (parsed default None).
"""

from __future__ import annotations

import argparse
import inspect
import re
from collections.abc import Iterator
from typing import Any

import pytest

from pyalk import Alk, Outbox
from pyalk.cli import demo, parser
from pyalk.cli.worker import worker_options

#: ``(default: X)``: X up to the first ``,``, ``;`` or ``)``.
STATED = re.compile(r"\(default: ([^,;)]+)")
#: Defaults stated as descriptions, by (command, option dest); "*": any command.
DESCRIBED = {
    ("*", "dsn"): "$PYALK_DSN",
    ("worker", "worker_id"): "host:pid:random",
    ("relay", "worker_id"): "relay:<outbox>",
    ("scheduler", "owner"): "host:pid:random",
    ("schedule add", "tz"): "UTC",
    ("schedule next", "tz"): "UTC",
    ("schedule next", "after"): "now",
    ("requeue-dead", "ids"): "every dead job of the queue",
    ("dashboard", "exact_limit"): "the dashboard's",
}

Key = tuple[str, str]


def commands(root: argparse.ArgumentParser, prefix: str = "") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every (sub)command's parser, as ``"schedule next"``."""
    for action in root._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield prefix + name, sub
                yield from commands(sub, f"{prefix}{name} ")


def helps(root: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.Action, str]]:
    """(command, option, its help as ``--help`` prints it) for every option with a help."""
    for command, sub in commands(root):
        formatter = sub._get_formatter()
        for action in sub._actions:
            if action.help and action.help is not argparse.SUPPRESS:
                yield command, action, formatter._expand_help(action)


def same(shown: str, value: Any) -> bool:
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return float(shown) == value
        except ValueError:
            return False
    return shown == str(value)


def mismatches(root: argparse.ArgumentParser, code: dict[Key, Any]) -> list[str]:
    """Every stated default that is not the code's; every option of ``code``
    whose help states no default."""
    found: list[str] = []
    stated: set[Key] = set()
    for command, action, text in helps(root):
        key = (command, action.dest)
        if re.search(r"\(\d[\d.]*\)|\bdefault\b(?!:)", text):
            found.append(f"{command} {action.option_strings}: a default not written '(default: X)': {text!r}")
        match = STATED.search(text)
        if match is None:
            continue
        stated.add(key)
        shown = match.group(1).strip()
        described = DESCRIBED.get(key, DESCRIBED.get(("*", action.dest)))
        if described is not None:
            # SUPPRESS: an action's option left to its command's (pyalk workers --dsn X stop), whose is None.
            if shown != described or action.default not in (None, argparse.SUPPRESS):
                found.append(f"{command} {action.option_strings}: states {shown!r}, described as {described!r}"
                             f" with the code filling it in (parsed default {action.default!r})")
            continue
        expected = code.get(key, action.default)
        if not same(shown, expected):
            found.append(f"{command} {action.option_strings}: help states {shown!r}, the code uses {expected!r}")
    found += [f"{command} --{dest}: the help states no default" for command, dest in code.keys() - stated]
    return found


def code_defaults(dsn: str) -> dict[Key, Any]:
    """The values the code uses when an option is left out."""
    args = parser().parse_args(["worker", "tests.cli.handlers:record", "--queue", "q", "--dsn", dsn])
    with Alk(dsn) as alk:
        worker = alk.worker("q", lambda job: None, **worker_options(args))
        used = {"concurrency": worker.concurrency, "batch_size": worker.batch_size,
                "poll_interval": worker.poll_interval, "grace": worker.grace_period}
    code: dict[Key, Any] = {("worker", dest): value for dest, value in used.items()}

    def signature(function: Any, parameter: str) -> Any:
        return inspect.signature(function).parameters[parameter].default

    code[("scheduler", "lease_ttl")] = signature(Alk.run_schedules, "lease_ttl")
    code[("scheduler", "poll_interval")] = signature(Alk.run_schedules, "poll_interval")
    code[("relay", "poll_interval")] = signature(Outbox.run, "poll_interval")
    code[("demo", "jobs")] = signature(demo.run, "jobs")
    code[("demo", "workers")] = signature(demo.run, "workers")
    return code


def test_every_stated_default_is_the_one_the_code_uses(dsn: str) -> None:
    assert mismatches(parser(), code_defaults(dsn)) == []


def test_a_wrong_default_is_caught(dsn: str) -> None:
    """The mistake this test exists for: ``--batch-size`` said "default:
    concurrency" while the worker claims up to its prefetch (1000)."""
    root = argparse.ArgumentParser(prog="pyalk")
    worker = root.add_subparsers(dest="command").add_parser("worker")
    worker.add_argument("--batch-size", type=int, help="most jobs per claim (default: concurrency)")
    worker.add_argument("--concurrency", type=int, default=10, help="handlers at once (10)")
    worker.add_argument("--grace", type=float, default=30.0, help="seconds to finish")
    code = code_defaults(dsn)
    found = mismatches(root, {key: value for key, value in code.items() if key[0] == "worker"})
    assert sorted(found) == sorted([
        "worker ['--batch-size']: help states 'concurrency', the code uses 1000",
        "worker ['--concurrency']: a default not written '(default: X)': 'handlers at once (10)'",
        *(f"worker --{dest}: the help states no default" for dest in ("concurrency", "grace", "poll_interval")),
    ])


@pytest.mark.parametrize("concurrency", [1, 5000])
def test_the_batch_size_follows_a_larger_concurrency_as_its_help_says(dsn: str, concurrency: int) -> None:
    args = parser().parse_args(["worker", "m:f", "--queue", "q", "--concurrency", str(concurrency), "--dsn", dsn])
    [text] = [text for command, action, text in helps(parser()) if (command, action.dest) == ("worker", "batch_size")]
    assert text.endswith("or --concurrency when larger)")
    prefetch = int(STATED.search(text).group(1))  # type: ignore[union-attr]
    with Alk(dsn) as alk:
        assert alk.worker("q", lambda job: None, **worker_options(args)).batch_size == max(prefetch, concurrency)
