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


def job_from_row(row: tuple[Any, ...]) -> Job:
    return Job(*row)
