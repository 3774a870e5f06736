"""A claimed job's handle: the ops that carry its claim's fencing token
(alk.ack, alk.retry, alk.fail, alk.heartbeat: sql/queue/50_settle.sql; alk.snooze: 55_give_back.sql).
The rules are the SQL's; this module binds them for one claimed job."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from pyalk import _codec
from pyalk.values import Job

if TYPE_CHECKING:
    from pyalk._async.executor import AsyncExecutor

_ACK = "SELECT alk.ack(%(job_id)s, %(worker_id)s, %(attempt)s, %(queue)s, %(result)s::jsonb)"
_SNOOZE = "SELECT alk.snooze(%(job_id)s, %(worker_id)s, %(attempt)s, %(delay)s::bigint, %(queue)s)"


class AsyncJobHandle:
    """A claimed job. Its ops carry the claim's fencing token (``attempts``),
    so a handler whose claim lapsed and was re-claimed cannot touch the job."""

    def __init__(self, executor: AsyncExecutor, job: Job) -> None:
        self.executor = executor
        self.job = job
        self._cancelled = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.job.id}, queue={self.job.queue!r}, attempt={self.job.attempts})"

    @property
    def id(self) -> int:
        return self.job.id

    @property
    def payload(self) -> Any:
        return self.job.payload

    @property
    def cancelled(self) -> bool:
        """alk.cancel took this job while it ran: stop, its outcome is refused.
        The worker sets it (:meth:`mark_cancelled`) when its control channel
        says so; a blocking handler polls it (an async one's task is cancelled
        as well)."""
        return self._cancelled

    def mark_cancelled(self) -> None:
        """The worker's call: the job was cancelled (``cancel <job_id>`` on its control channel)."""
        self._cancelled = True

    def _params(self, **extra: Any) -> dict[str, Any]:
        return {
            "job_id": self.job.id,
            "worker_id": self.job.worker_id,
            "attempt": self.job.attempts,
            "queue": self.job.queue,
            **extra,
        }

    async def ack(self, result: Any = None) -> bool:
        """Done: delete the job, or, when the queue keeps completed jobs
        (:meth:`AsyncQueue.set_retention`), keep it completed with ``result``
        (JSON-encoded like a payload; None stores no result). False when the
        claim is no longer valid."""
        params = self._params(result=None if result is None else _codec.payload(result, "result"))
        return bool(await self.executor.value(_ACK, params))

    async def retry(self, err: str | None = None, delay: int | timedelta | None = None) -> bool:
        """Back to pending after ``delay`` seconds, or the row's backoff curve."""
        params = self._params(err=_codec.text(err, "err"), delay=_codec.seconds(delay, "delay"))
        return bool(
            await self.executor.value(
                "SELECT alk.retry(%(job_id)s, %(worker_id)s, %(attempt)s, %(err)s, %(delay)s::bigint, %(queue)s)",
                params,
            )
        )

    async def fail(self, err: str | None = None) -> bool:
        """Dead for good, with ``err`` (or 'failed') as its last error."""
        params = self._params(err=_codec.text(err, "err"))
        return bool(
            await self.executor.value(
                "SELECT alk.fail(%(job_id)s, %(worker_id)s, %(attempt)s, %(err)s, %(queue)s)", params
            )
        )

    async def snooze(self, seconds: int | timedelta) -> bool:
        """``alk.snooze``: back to pending in ``seconds`` (0 or less: at once)
        without spending the attempt; this handle's token is dead after it.
        False when the claim is no longer valid. (A worker's handler raises
        :class:`~pyalk.Snooze` instead: the worker then snoozes the job.)"""
        params = self._params(delay=_codec.seconds(seconds, "seconds"))
        return bool(await self.executor.value(_SNOOZE, params))

    async def heartbeat(self, extend: int | timedelta | None = None) -> bool:
        """Extend the lease to now + ``extend`` seconds (the row's visibility timeout when None)."""
        params = self._params(extend=_codec.seconds(extend, "extend"))
        return bool(
            await self.executor.value(
                "SELECT alk.heartbeat(%(job_id)s, %(worker_id)s, %(attempt)s, %(extend)s::bigint, %(queue)s)",
                params,
            )
        )
