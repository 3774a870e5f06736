"""Option values shared by the sync and async wrappers."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta


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
