"""What a worker counts and logs: :class:`WorkerCounts`, the structured log
fields of its records, and the tally of what each settle call led to. Plain
code, shared by the async and the threaded worker (nothing here waits)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pyalk.values import Job
    from pyalk.worker.observer import WorkerObserver

logger = logging.getLogger("pyalk.worker")


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
    #: Jobs whose handler raised :class:`~pyalk.Snooze`: pending again later,
    #: their attempt refunded (alk.snooze).
    snoozed: int = 0
    #: Jobs alk.cancel took while this worker held them: the handler was told
    #: (and its outcome not settled), or the job was dropped from the buffer.
    cancelled: int = 0

    @property
    def finished(self) -> int:
        return self.acked + self.retried + self.failed + self.lost + self.snoozed + self.cancelled


class LogFields:
    """The structured ``extra=`` fields of a worker's log records."""

    __slots__ = ("queue", "worker_id")

    def __init__(self, queue: str, worker_id: str) -> None:
        self.queue = queue
        self.worker_id = worker_id

    def __call__(self, job: Job | None = None, **extra: Any) -> dict[str, Any]:
        fields: dict[str, Any] = {"queue": self.queue, "worker_id": self.worker_id}
        if job is not None:
            fields["job_id"] = job.id
            fields["attempt"] = job.attempts
        fields.update(extra)
        return fields


class _Handle(Protocol):
    @property
    def job(self) -> Job: ...


class Finished(Protocol):
    """A settled outcome as the tally reads it (the worker's ``Outcome``)."""

    @property
    def handle(self) -> _Handle: ...
    @property
    def kind(self) -> str: ...
    @property
    def error(self) -> str | None: ...
    @property
    def exception(self) -> BaseException | None: ...
    @property
    def duration(self) -> float: ...


class Tally:
    """The worker's :class:`WorkerCounts`, changed under one lock (the
    threaded worker's runners are threads), and its observer, if any."""

    def __init__(self, fields: LogFields, observer: WorkerObserver | None) -> None:
        self.counts = WorkerCounts()
        self.lock = threading.Lock()
        self.fields = fields
        self.observer = observer

    def add(self, **deltas: int) -> None:
        with self.lock:
            for name, delta in deltas.items():
                setattr(self.counts, name, getattr(self.counts, name) + delta)

    def settled(self, batch: Sequence[Finished], states: Sequence[str | None], seconds: float) -> bool:
        """Count, log and observe what the SQL says each outcome led to
        (``seconds``: the settle call's); whether any was retried."""
        acked = retried = failed = lost = 0
        for outcome, state in zip(batch, states, strict=True):
            if state == "acked":
                acked += 1
                continue
            job = outcome.handle.job
            fields = self.fields(job, duration_s=outcome.duration, error=outcome.error)
            if state is None:
                lost += 1
                logger.warning("job %d %s but its claim was no longer valid (lease lapsed)", job.id,
                               "finished" if outcome.kind == "ack" else f"failed ({outcome.error})", extra=fields)
            elif state == "dead":
                failed += 1
                logger.error("job %d failed for good: %s", job.id, outcome.error, exc_info=outcome.exception,
                             extra=fields)
            else:
                retried += 1
                logger.warning("job %d failed (attempt %d of %d), will retry: %s", job.id, job.attempts,
                               job.max_attempts, outcome.error, exc_info=outcome.exception, extra=fields)
        self.add(acked=acked, retried=retried, failed=failed, lost=lost)
        observer = self.observer
        if observer is not None:
            for label, n in (("acked", acked), ("retried", retried), ("failed", failed), ("lost", lost)):
                if n:
                    observer.on_settled(label, n, seconds)
        return retried > 0

    def snoozed(self, job: Job, held: bool, delay: int, seconds: float) -> None:
        """Count, log and observe one alk.snooze call (``seconds``: its
        duration): snoozed, or lost when the claim was no longer valid."""
        if held:
            self.add(snoozed=1)
            logger.info("job %d snoozed for %ds (attempt %d refunded)", job.id, delay, job.attempts,
                        extra=self.fields(job, delay_s=delay))
        else:
            self.add(lost=1)
            logger.warning("job %d asked to snooze but its claim was no longer valid (lease lapsed)", job.id,
                           extra=self.fields(job, delay_s=delay))
        if self.observer is not None:
            self.observer.on_settled("snoozed" if held else "lost", 1, seconds)

    def cancelled(self, job: Job, *, started: bool) -> None:
        """Count and log a job alk.cancel took (``started``: its handler ran
        and was told; else it was dropped from the buffer). Nothing is
        settled for it: the row is gone. The observer sees it leave as a release."""
        self.add(cancelled=1)
        logger.info("job %d cancelled (alk.cancel) %s", job.id,
                    "while its handler ran: its outcome is not settled" if started else "before it started",
                    extra=self.fields(job))
        self.released(1)

    def released(self, n: int) -> None:
        """Claimed jobs let go unsettled (released, abandoned, given up): told to the observer."""
        if self.observer is not None:
            self.observer.on_released(n)
