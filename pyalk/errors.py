"""pyalk's exceptions: one class per SQLSTATE the SQL raises, under one base.

The SQL functions raise class ``LK`` codes (docs/errors.md holds the table);
:func:`translate` turns a psycopg error carrying one of them into the matching
class here, with the server's message. Codec errors never reach the server.
"""

from __future__ import annotations

from typing import Any

import psycopg

#: Errors after which a loop (a worker, the scheduler, the outbox relay)
#: reconnects and tries again rather than giving up: the server went away
#: (restart, ``pg_terminate_backend``, network), a pool could not hand out a
#: connection in time, or a statement lost a serialization race.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    psycopg.OperationalError,
    psycopg.InterfaceError,
    psycopg.errors.TransactionRollback,
)


class AlkError(Exception):
    """Base class of every error pyalk raises on purpose."""

    sqlstate: str | None = None


class InvalidName(AlkError, ValueError):
    """LK001: an empty name, or one using the reserved ``alk:`` prefix."""

    sqlstate = "LK001"


class InvalidArgument(AlkError, ValueError):
    """LK002: an argument the function cannot accept (a duration <= 0, a
    value outside its column's range, an integer outside bigint)."""

    sqlstate = "LK002"


class InvalidSchedule(AlkError, ValueError):
    """LK003: a cron spec or time zone the scheduler cannot read."""

    sqlstate = "LK003"


class LeadershipLost(AlkError):
    """LK004: the scheduler's leader lease was taken by another process."""

    sqlstate = "LK004"


class NotPermitted(AlkError, PermissionError):
    """LK005: the caller's role lacks a pyalk privilege: pinning the clock
    or ticking later than it without the clock privilege (docs/security.md)."""

    sqlstate = "LK005"


class CodecError(AlkError, ValueError):
    """A value the wrapper cannot encode for PostgreSQL (NaN, a set, a NUL
    character, a non-JSON type); raised before anything is sent."""


class SchemaMismatch(AlkError):
    """The installed schema is one this pyalk cannot run on: older than it
    needs (run ``pyalk migrate``) or newer in a way it does not understand
    (upgrade pyalk)."""


class ClaimInTransaction(AlkError):
    """A claim-side operation was asked to run inside the caller's open
    transaction; claims are never tied to a business transaction."""


class ConnectError(AlkError):
    """The first connection to the database failed (no server at that host,
    no such database, authentication refused, or the connect timeout ran
    out). Raised at once; the message names the host and the database."""


class LockNotAcquired(AlkError, TimeoutError):
    """Entering ``with alk.lock(name, wait=...)``: another owner held the
    lock for the whole wait."""


class LockLost(AlkError):
    """Leaving ``with alk.lock(...)``: a renewal found the lock taken by
    another owner while the block ran (the lease lapsed), so the block did
    not run exclusively."""


class NoResultKept(AlkError):
    """Waiting for a job's outcome on a queue that keeps no completed jobs
    (its acks delete the job, so there is no result to wait for): set a
    retention first (``queue.set_retention``, ``alk.set_queue_retention``)."""


class JobNotFound(AlkError, LookupError):
    """Waiting for a job that is not there: never enqueued on that queue,
    cancelled or purged, or acked while its queue kept no completed jobs."""


class JobCancelled(AlkError):
    """The job a caller waited for was cancelled (``alk.cancel``): it has no outcome."""


class JobDied(AlkError):
    """The job a caller waited for is dead (failed, out of attempts or
    expired); ``job`` is its row, ``job.last_error`` says why."""

    def __init__(self, message: str, job: Any = None) -> None:
        super().__init__(message)
        #: The dead :class:`~pyalk.Job`.
        self.job = job


class WaitTimeout(AlkError, TimeoutError):
    """The job a caller waited for had no outcome within the timeout (it may still have one later)."""


#: SQLSTATE -> exception class, the single map the docs and tests check.
BY_SQLSTATE: dict[str, type[AlkError]] = {
    cls.sqlstate: cls
    for cls in (InvalidName, InvalidArgument, InvalidSchedule, LeadershipLost, NotPermitted)
    if cls.sqlstate is not None
}


def server_busy(error: psycopg.OperationalError) -> bool:
    """Whether a connection was refused for want of a free slot (SQLSTATE
    53300) or while the server starts or stops (57P03): transient, unlike a
    bad conninfo. A failed connect often carries the message only."""
    text = str(error)
    return error.sqlstate in {"53300", "57P03"} or any(
        phrase in text for phrase in ("too many clients", "remaining connection slots", "is starting up",
                                      "is shutting down"))


def translate(error: psycopg.Error) -> Exception:
    """The pyalk exception for a server error, or the error itself."""
    cls = BY_SQLSTATE.get(error.sqlstate or "")
    if cls is None:
        return error
    message = error.diag.message_primary or str(error)
    translated = cls(message)
    translated.__cause__ = error
    return translated
