"""Option values shared by the sync and async wrappers."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class QueueOpts:
    """Stamps a queue handle resolves onto every job it enqueues.

    None leaves the choice to the SQL defaults (300 s visibility, 3 attempts,
    5 s backoff base, dead rows kept forever); the numbers live in sql/ only.
    """

    visibility_timeout_s: int | None = None
    max_attempts: int | None = None
    backoff_base_s: int | None = None
    dead_letter_retention_s: int | None = None
