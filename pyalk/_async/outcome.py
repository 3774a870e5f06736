"""Waiting for a job's outcome without polling (docs/queue.md "Waiting for a
result"): a queue that keeps completed jobs announces each job that becomes
completed or dead, or is cancelled, on its outcome channel
(alk.outcome_channel, sql/queue/65_outcome.sql). The waiter LISTENs there on
a connection of its own, then reads the job, so an outcome settled before the
LISTEN is read and a later one is announced; it reads the job again on its
announcement.

:class:`AsyncDeferredJob` is what ``queue.defer`` and a task's ``defer``
return: the job's id with that wait.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from psycopg import AsyncConnection, sql

from pyalk import _codec
from pyalk.errors import InvalidArgument, JobCancelled, JobDied, JobNotFound, NoResultKept, WaitTimeout
from pyalk.values import JOB_COLUMNS, Job, job_from_row

if TYPE_CHECKING:
    from pyalk._async.executor import AsyncExecutor

_CHANNEL = "SELECT alk.outcome_channel(%(queue)s), alk.queue_retention(%(queue)s)"
_GET_JOB = "SELECT " + JOB_COLUMNS + " FROM alk.get_job(%(queue)s, %(job_id)s::bigint)"


def _timeout(timeout: float | None) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout >= 0:
        raise InvalidArgument(f"timeout must be None (no limit) or seconds >= 0, got {timeout!r}")
    return float(timeout)


async def wait_for_outcome(executor: AsyncExecutor, queue: str, job_id: int, timeout: float | None = None) -> Job:
    """The job ``job_id`` of ``queue`` once it is completed (its row, with
    ``result``). :class:`~pyalk.JobDied` when it is dead,
    :class:`~pyalk.JobCancelled` when it is cancelled while waited for,
    :class:`~pyalk.JobNotFound` when there is no such job,
    :class:`~pyalk.NoResultKept` when the queue keeps no completed jobs,
    :class:`~pyalk.WaitTimeout` after ``timeout`` seconds (None: no limit).
    Holds one connection of its own while it waits."""
    params = {"queue": _codec.text(queue, "queue"), "job_id": _codec.bigint(job_id, "job_id")}
    limit = _timeout(timeout)
    deadline = None if limit is None else time.monotonic() + limit
    channel, retention = (await executor.rows(_CHANNEL, params))[0]
    if not retention:
        raise NoResultKept(f"queue {queue!r} keeps no completed jobs, so job {job_id} leaves no result to wait "
                           "for: set a retention first (queue.set_retention, alk.set_queue_retention)")
    conn = await AsyncConnection.connect(executor.listen_conninfo(), autocommit=True)
    try:
        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        mine = f"{job_id} "
        while True:
            # Read after LISTEN: an outcome settled before it is here, a later one is announced.
            rows = await executor.rows(_GET_JOB, params, conn=conn, transactional=True)
            job = job_from_row(rows[0]) if rows else None
            if job is None:
                raise JobNotFound(f"job {job_id} is not in queue {queue!r}: never enqueued there, cancelled, "
                                  "purged, or acked while the queue kept no completed jobs")
            if job.state == "completed":
                return job
            if job.state == "dead":
                raise JobDied(f"job {job_id} of queue {queue!r} is dead: {job.last_error}", job)
            announced = None
            while announced is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise WaitTimeout(f"job {job_id} of queue {queue!r} had no outcome within {limit:g}s "
                                      f"(it is {job.state})")
                async for notify in conn.notifies(timeout=left, stop_after=1):
                    if notify.payload.startswith(mine):
                        announced = notify.payload[len(mine):]
            if announced == "cancelled":
                raise JobCancelled(f"job {job_id} of queue {queue!r} was cancelled")
    finally:
        await conn.close()


class AsyncDeferredJob:
    """An enqueued job: its ``queue`` and ``id``, and :meth:`wait` for its result."""

    def __init__(self, executor: AsyncExecutor, queue: str, job_id: int) -> None:
        self.executor = executor
        self.queue = queue
        self.id = job_id

    def __repr__(self) -> str:
        return f"{type(self).__name__}(queue={self.queue!r}, id={self.id})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, AsyncDeferredJob):
            return (self.queue, self.id) == (other.queue, other.id)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.queue, self.id))

    async def wait(self, timeout: float | None = None) -> Any:
        """The job's result once it is completed (None when its handler
        returned None); raises as :func:`wait_for_outcome` does. The queue
        must keep completed jobs (``set_retention``)."""
        return (await wait_for_outcome(self.executor, self.queue, self.id, timeout)).result

    async def get(self) -> Job | None:
        """The job's row now (any state), or None once it is gone."""
        rows = await self.executor.rows(_GET_JOB, {"queue": self.queue, "job_id": self.id})
        return job_from_row(rows[0]) if rows else None
