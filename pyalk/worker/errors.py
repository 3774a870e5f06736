"""The worker's errors and their text: :class:`PermanentError` (a handler
fails its job for good), the ``err`` a failed job records, and the one-line
form of a database error in a log line."""

from __future__ import annotations


class PermanentError(Exception):
    """Raise it from a handler to fail the job for good (dead at once, no
    retry). A worker's ``fail_on`` defaults to this class; pass your own
    exception types to widen it."""


def error_text(error: BaseException, limit: int = 4000) -> str:
    """The ``err`` a failed job records: ``Type: message`` (the type alone when
    the message is empty), NUL shown as ``\\0``, a lone surrogate (not UTF-8
    encodable) as ``\\udXXX``, cut to ``limit`` characters."""
    message = str(error)
    text = f"{type(error).__name__}: {message}" if message else type(error).__name__
    text = text.replace("\x00", "\\0")
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def one_line(error: BaseException) -> str:
    """``Type: first line of the message``, for a log line about a database error."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__
