"""Running the CLI's ``main`` in-process, as the CLI tests do."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from pyalk.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``pyalk <argv>``: its exit code, stdout and stderr."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str) -> str:
    """The one non-blank line of ``err`` (asserting there is just one)."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


@contextmanager
def logging_restored() -> Iterator[None]:
    """Undo the logging set-up a long-running command makes (it owns the
    process's logging) once the block ends."""
    logger = logging.getLogger("pyalk")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    try:
        yield
    finally:
        logger.handlers[:], logger.level, logger.propagate = saved
