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
# one per job, and this is 1.2 against 2.9 us a job. The instance is the
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
    job: Job = _new(Job)
    _set_id(job, row[start + 0])
    _set_queue(job, row[start + 1])
    _set_state(job, row[start + 2])
    _set_payload(job, row[start + 3])
    _set_priority(job, row[start + 4])
    _set_run_at(job, row[start + 5])
    _set_attempts(job, row[start + 6])
    _set_max_attempts(job, row[start + 7])
    _set_worker_id(job, row[start + 8])
    _set_claimed_at(job, row[start + 9])
    _set_claim_expires_at(job, row[start + 10])
    _set_created_at(job, row[start + 11])
    _set_expires_at(job, row[start + 12])
    _set_visibility_timeout_s(job, row[start + 13])
    _set_backoff_base_s(job, row[start + 14])
    _set_dead_letter_retention_s(job, row[start + 15])
    _set_last_error(job, row[start + 16])
    _set_died_at(job, row[start + 17])
    _set_dedup_key(job, row[start + 18])
    _set_attempts_refunded(job, row[start + 19])
    return job
