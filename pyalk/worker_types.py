"""Values shared by the async and the threaded worker, and the queue
observability rows (``alk.queue_stats``)."""

from __future__ import annotations

from dataclasses import dataclass


class PermanentError(Exception):
    """Raise it from a handler to fail the job for good (dead at once, no
    retry). A worker's ``fail_on`` defaults to this class; pass your own
    exception types to widen it."""






@dataclass(slots=True)
class WorkerCounts:
    """What a worker has done since it started (read it any time)."""

    #: Jobs handed to the handler (claimed jobs still buffered are not counted).
    claimed: int = 0
    acked: int = 0
    retried: int = 0
    failed: int = 0
    #: Jobs whose handler finished but whose claim was no longer valid when
    #: settled (lease lapsed and maybe claimed by another worker).
    lost: int = 0
    #: Jobs left to lease expiry at shutdown (their handlers outlived the grace period).
    abandoned: int = 0
    #: Claimed jobs that never started, given back unspent (alk.release_jobs).
    released: int = 0

    @property
    def finished(self) -> int:
        return self.acked + self.retried + self.failed + self.lost


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
