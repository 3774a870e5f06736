"""The worker's errors and their text: :class:`PermanentError` (a handler
fails its job for good), :class:`Snooze` (a handler puts its job off), the
``err`` a failed job records, and the one-line form of a database error in a
log line."""

from __future__ import annotations

from datetime import timedelta

from pyalk import _codec


class PermanentError(Exception):
    """Raise it from a handler to fail the job for good (dead at once, no
    retry). A worker's ``fail_on`` defaults to this class; pass your own
    exception types to widen it."""


class Snooze(Exception):
    """Raise it from a handler to put the job off for ``seconds`` (an int or
    a :class:`~datetime.timedelta`; 0 or less: due at once) without spending
    an attempt: the worker calls ``alk.snooze``, the job runs again later
    under a new claim. Checked before ``fail_on``, so it never fails a job."""

    def __init__(self, seconds: int | timedelta) -> None:
        #: Whole seconds (a timedelta's sub-second part rounds up).
        self.seconds: int = _codec.seconds(seconds, "seconds") or 0
        super().__init__(f"snooze for {self.seconds}s")

    def __reduce__(self) -> tuple[type[Snooze], tuple[int]]:
        return type(self), (self.seconds,)  # args hold the message, not the seconds


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
