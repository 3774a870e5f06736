"""The values pyalk's calls return and take: frozen rows in their SQL type's
column order (a job, a stream event, a lock, a schedule and a fired job, a
queue's stats row, a registered worker) and the queue options a handle
resolves onto its jobs. Each row type has its select list (``*_COLUMNS``) and its ``*_from_row``."""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import timedelta
from typing import Any, Literal

# -- Queue -------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class QueueOpts:
    """Stamps a queue handle resolves onto every job it enqueues.

    None leaves the choice to the SQL defaults (300 s visibility, 3 attempts,
    5 s backoff base, dead rows kept forever); the numbers live in sql/ only.
    Durations are whole seconds (an int) or a :class:`~datetime.timedelta`
    (a sub-second part rounds up).
    """

    visibility_timeout_s: int | timedelta | None = None
    max_attempts: int | None = None
    backoff_base_s: int | timedelta | None = None
    dead_letter_retention_s: int | timedelta | None = None


JobState = Literal["pending", "processing", "dead", "completed"]


@dataclass(frozen=True, slots=True)
class Job:
    """One row of ``alk.job`` (columns in the SQL type's order)."""

    id: int
    queue: str
    state: JobState
    payload: Any
    priority: int
    run_at: int
    attempts: int
    max_attempts: int
    worker_id: str | None
    claimed_at: int | None
    claim_expires_at: int | None
    created_at: int
    expires_at: int | None
    visibility_timeout_s: int
    backoff_base_s: int
    dead_letter_retention_s: int | None
    last_error: str | None
    died_at: int | None
    #: While this job is live, enqueues with the same key return its id.
    dedup_key: str | None
    #: Claims given back (release, requeue_dead); attempts left are
    #: ``max_attempts - (attempts - attempts_refunded)``.
    attempts_refunded: int
    #: The JSON object enqueued with the job (trace context, correlation ids), or None.
    headers: dict[str, Any] | None
    #: What the ack stored (decoded JSON; None also for no result): completed jobs only.
    result: Any
    #: When it was acked, on a queue that keeps completed jobs; None otherwise.
    completed_at: int | None
    #: Its serial group: jobs of the queue with one key run at most
    #: ``max_running_per_group`` at a time (:class:`QueueLimits`); None: no group.
    group_key: str | None

    @property
    def attempts_spent(self) -> int:
        return self.attempts - self.attempts_refunded


#: The select list that reads an ``alk.job`` in :class:`Job` field order.
JOB_COLUMNS = ", ".join(field.name for field in fields(Job))


# A Job from a row through its slots' own setters, bypassing the frozen
# dataclass __init__ (an object.__setattr__ call per field): a claim builds
# one per job, and this is 1.4 against 2.9 us a job. The instance is the
# same; tests/test_job.py compares the two field by field.
_NAMES = tuple(field.name for field in fields(Job))
_new = object.__new__
(
    _set_id,
    _set_queue,
    _set_state,
    _set_payload,
    _set_priority,
    _set_run_at,
    _set_attempts,
    _set_max_attempts,
    _set_worker_id,
    _set_claimed_at,
    _set_claim_expires_at,
    _set_created_at,
    _set_expires_at,
    _set_visibility_timeout_s,
    _set_backoff_base_s,
    _set_dead_letter_retention_s,
    _set_last_error,
    _set_died_at,
    _set_dedup_key,
    _set_attempts_refunded,
    _set_headers,
    _set_result,
    _set_completed_at,
    _set_group_key,
) = (getattr(Job, name).__set__ for name in _NAMES)


def job_from_row(row: tuple[Any, ...], start: int = 0) -> Job:
    """The :class:`Job` in ``row[start:]`` (the columns of :data:`JOB_COLUMNS`)."""
    (
        id_,
        queue,
        state,
        payload,
        priority,
        run_at,
        attempts,
        max_attempts,
        worker_id,
        claimed_at,
        claim_expires_at,
        created_at,
        expires_at,
        visibility_timeout_s,
        backoff_base_s,
        dead_letter_retention_s,
        last_error,
        died_at,
        dedup_key,
        attempts_refunded,
        headers,
        result,
        completed_at,
        group_key,
    ) = row[start:] if start else row
    job: Job = _new(Job)
    _set_id(job, id_)
    _set_queue(job, queue)
    _set_state(job, state)
    _set_payload(job, payload)
    _set_priority(job, priority)
    _set_run_at(job, run_at)
    _set_attempts(job, attempts)
    _set_max_attempts(job, max_attempts)
    _set_worker_id(job, worker_id)
    _set_claimed_at(job, claimed_at)
    _set_claim_expires_at(job, claim_expires_at)
    _set_created_at(job, created_at)
    _set_expires_at(job, expires_at)
    _set_visibility_timeout_s(job, visibility_timeout_s)
    _set_backoff_base_s(job, backoff_base_s)
    _set_dead_letter_retention_s(job, dead_letter_retention_s)
    _set_last_error(job, last_error)
    _set_died_at(job, died_at)
    _set_dedup_key(job, dedup_key)
    _set_attempts_refunded(job, attempts_refunded)
    _set_headers(job, headers)
    _set_result(job, result)
    _set_completed_at(job, completed_at)
    _set_group_key(job, group_key)
    return job


# -- Queue stats (alk.queue_stats) -------------------------------------------

@dataclass(frozen=True, slots=True)
class QueueStats:
    """One row of ``alk.queue_stats`` (see docs/worker.md)."""

    queue: str
    pending: int
    ready: int
    scheduled: int
    processing: int
    lapsed: int
    dead: int
    oldest_ready_age_s: int | None
    next_run_at: int | None
    paused: bool
    #: Some count is the planner's estimate: those above the exact_limit asked for.
    estimated: bool
    #: Acked jobs kept by the queue's retention (``set_retention``).
    completed: int


#: The select list that reads an ``alk.queue_stat`` in :class:`QueueStats` order.
QUEUE_STATS_COLUMNS = ", ".join(field.name for field in fields(QueueStats))


def queue_stats_from_row(row: tuple[Any, ...]) -> QueueStats:
    return QueueStats(*row)


# -- Queue limits (alk.queue_limits) -----------------------------------------

@dataclass(frozen=True, slots=True)
class QueueLimits:
    """One row of ``alk.queue_limits``: a queue's claim limits, None where
    not set (docs/queue.md, "Limits and serial groups")."""

    queue: str
    #: At most this many jobs processing with a valid lease.
    max_running: int | None
    #: At most ``rate`` claims per fixed window of ``rate_period_s`` seconds.
    rate: int | None
    rate_period_s: int | None
    #: Jobs sharing a group key running at once (None: 1).
    max_running_per_group: int | None


#: The select list that reads an ``alk.queue_limit`` in :class:`QueueLimits` order.
QUEUE_LIMITS_COLUMNS = ", ".join(field.name for field in fields(QueueLimits))


# -- Stream ------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One row of ``alk.stream_event``, in the SQL type's column order.

    ``offset`` is the SQL column ``event_offset`` (``OFFSET`` is a keyword in
    SQL): per stream, from 1, commit ordered, never reused.
    """

    stream: str
    offset: int
    key: str | None
    payload: Any
    created_at: int


#: The select list that reads an ``alk.stream_event`` in :class:`StreamEvent` field order.
STREAM_EVENT_COLUMNS = "stream, event_offset, key, payload, created_at"


def stream_event_from_row(row: tuple[Any, ...]) -> StreamEvent:
    return StreamEvent(*row)


# -- Lock --------------------------------------------------------------------

#: The columns of alk.get_lock, in LockInfo's field order.
LOCK_COLUMNS = "name, owner, acquired_at, expires_at"


@dataclass(frozen=True, slots=True)
class LockInfo:
    """A lock's row: who holds it since when, until when (unix seconds on
    ``alk.now()``'s clock; at or before now it is expired but not yet taken)."""

    name: str
    owner: str
    acquired_at: int
    expires_at: int


def lock_info_from_row(row: tuple[Any, ...]) -> LockInfo | None:
    """None for the all-NULL row of a lock nobody holds."""
    name, owner, acquired_at, expires_at = row
    return None if name is None else LockInfo(name, owner, int(acquired_at), int(expires_at))


# -- Scheduler ---------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Schedule:
    """One ``alk.schedule`` (columns in the SQL type's order).

    ``tz`` is the zone as stored (``UTC`` when none was given);
    ``next_fire_at`` is None when the schedule never fires again.
    """

    name: str
    spec: str
    queue: str
    priority: int
    max_attempts: int
    expires: int | None
    payload: Any
    tz: str
    next_fire_at: int | None


@dataclass(frozen=True, slots=True)
class Fired:
    """One job ``alk.tick`` enqueued: which schedule, into which queue, for
    which boundary (unix seconds), and the job's id."""

    schedule_name: str
    queue: str
    fire_at: int
    job_id: int


#: The select list that reads an ``alk.schedule`` in :class:`Schedule` field order.
SCHEDULE_COLUMNS = ", ".join(field.name for field in fields(Schedule))


def schedule_from_row(row: tuple[Any, ...]) -> Schedule:
    return Schedule(*row)


def fired_from_row(row: tuple[Any, ...]) -> Fired:
    return Fired(*row)


# -- Workers (alk.workers) -----------------------------------------------------

@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """One row of ``alk.workers()`` (``alk.worker``, columns in the SQL
    type's order): a registered worker, its last beat and what it held then
    (docs/worker.md, "Workers you can see and stop"). Times are unix seconds
    on ``alk.now()``'s clock; ``gone``: no beat for longer than the silence
    bound (30 s), it died or lost the database."""

    worker_id: str
    queue: str
    host: str | None
    pid: int | None
    started_at: int
    last_seen_at: int
    #: Jobs the worker held at its last beat: claimed and not yet settled.
    running: int
    concurrency: int
    #: The worker's client and its version (``pyalk 0.1.0``).
    version: str | None
    #: ``alk.request_stop`` asked it to stop.
    stopping: bool
    gone: bool


#: The select list that reads an ``alk.worker`` in :class:`WorkerInfo` field order.
WORKER_INFO_COLUMNS = ", ".join(field.name for field in fields(WorkerInfo))


def worker_info_from_row(row: tuple[Any, ...]) -> WorkerInfo:
    return WorkerInfo(*row)
