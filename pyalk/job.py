"""The job value every queue call returns: the row, resolved, frozen."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal

JobState = Literal["pending", "processing", "dead"]


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
    return job
