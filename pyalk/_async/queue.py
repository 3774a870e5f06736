"""The queue: bindings of the queue functions, defined in sql/queue/ (one file
per concern): the wake-up handshake (alk.queue_channel, alk.wait_for_jobs,
alk.wake_fence, alk.stop_waiting), alk.enqueue, alk.claim and alk.next_claim_at,
the claimed-job ops (ack, retry, fail, heartbeat, snooze, settle, release_jobs,
settle_and_claim), control (cancel, get_job, sweep_expired, requeue_dead,
pause_queue, resume_queue, set_queue_retention, queue_retention,
set_queue_limits, queue_limits) and
alk.queue_stats and alk.list_jobs.

Every rule (ready time, stamps, claim order, fencing, backoff, expiry) is in
the SQL; this module only encodes arguments and decodes rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from pyalk import _codec, tracing
from pyalk._async.job import AsyncJobHandle
from pyalk._async.outcome import AsyncDeferredJob, wait_for_outcome
from pyalk.errors import InvalidArgument
from pyalk.queue_params import ENQUEUE_OPTIONS, after_ids, bigint_array, enqueue_params, text_array
from pyalk.values import (
    JOB_COLUMNS,
    QUEUE_LIMITS_COLUMNS,
    QUEUE_STATS_COLUMNS,
    Job,
    QueueLimits,
    QueueOpts,
    QueueStats,
    job_from_row,
    queue_stats_from_row,
)

if TYPE_CHECKING:
    from psycopg import AsyncConnection

    from pyalk._async.executor import AsyncExecutor

_ENQUEUE = (
    "SELECT alk.enqueue(queue => %(queue)s, payload => %(payload)s::jsonb, dedup_key => %(dedup_key)s::text,"
    " headers => %(headers)s::jsonb, group_key => %(group_key)s::text, after => %(after)s::bigint[],"
    + ENQUEUE_OPTIONS
    + ")"
)
_ENQUEUE_BATCH = (
    "SELECT * FROM alk.enqueue_batch(queue => %(queue)s, payloads => %(payloads)s::jsonb[],"
    " dedup_keys => %(dedup_keys)s::text[], headers => %(headers)s::jsonb, group_keys => %(group_keys)s::text[],"
    " after => %(after)s::bigint[],"
    + ENQUEUE_OPTIONS + ")"
)
_CLAIM = "SELECT " + JOB_COLUMNS + " FROM alk.claim(%(queue)s, %(worker_id)s, %(n)s::bigint)"
_GET_JOB = "SELECT " + JOB_COLUMNS + " FROM alk.get_job(%(queue)s, %(job_id)s::bigint)"
_QUEUE_STATS = "SELECT " + QUEUE_STATS_COLUMNS + " FROM alk.queue_stats(%(queue)s, %(exact_limit)s::bigint)"
_NEXT_CLAIM = "SELECT alk.next_claim_at(%(queue)s)"
#: next_claim_at with the clock it was computed on: alk.now() (whole seconds,
#: maybe pinned) and the server's wall clock (sub-second, for a precise sleep).
_NEXT_CLAIM_CLOCK = (
    "SELECT alk.next_claim_at(%(queue)s), alk.now(), extract(epoch FROM pg_catalog.clock_timestamp())::float8"
)
_LIST_JOBS = (
    "SELECT " + JOB_COLUMNS + " FROM alk.list_jobs(%(queue)s, %(state)s, %(n)s::bigint, %(after_id)s::bigint)"
)
_REQUEUE_DEAD = "SELECT alk.requeue_dead(%(queue)s, %(job_ids)s::bigint[])"
_SETTLE_AND_CLAIM = (
    "SELECT kind, " + JOB_COLUMNS + " FROM alk.settle_and_claim(%(queue)s, %(worker_id)s, %(n)s::bigint,"
    " %(job_ids)s::bigint[], %(attempts)s::bigint[], %(outcomes)s::text[], %(errs)s::text[], NULL::bigint[],"
    " %(results)s::jsonb[])"
)
_SETTLE = (
    "SELECT state FROM alk.settle(%(job_ids)s::bigint[], %(worker_id)s, %(attempts)s::bigint[],"
    " %(outcomes)s::text[], %(errs)s::text[], NULL::bigint[], %(queue)s, %(results)s::jsonb[])"
)
_SET_RETENTION = "SELECT alk.set_queue_retention(%(queue)s, %(completed_s)s::bigint)"
_RETENTION = "SELECT alk.queue_retention(%(queue)s)"
_SET_LIMITS = (
    "SELECT alk.set_queue_limits(%(queue)s, %(max_running)s::bigint, %(rate)s::bigint, %(rate_period_s)s::bigint,"
    " %(max_running_per_group)s::bigint)"
)
_LIMITS = "SELECT " + QUEUE_LIMITS_COLUMNS + " FROM alk.queue_limits(%(queue)s)"
_RELEASE = "SELECT alk.release_jobs(%(job_ids)s::bigint[], %(worker_id)s, %(attempts)s::bigint[], %(queue)s)"
#: Also run by a worker on its own LISTEN connection.
QUEUE_CHANNEL = "SELECT alk.queue_channel(%(queue)s)"


async def queue_stats(executor: AsyncExecutor, queue: str | None = None, *,
                      exact_limit: int | None = None) -> list[QueueStats]:
    """``alk.queue_stats``: one row per queue holding jobs, or only ``queue``'s.
    ``exact_limit``: counts past it are the planner's estimates (``estimated``)."""
    rows = await executor.rows(_QUEUE_STATS, {"queue": _codec.text(queue, "queue"),
                                              "exact_limit": _codec.bigint(exact_limit, "exact_limit")})
    return [queue_stats_from_row(row) for row in rows]


class AsyncQueue:
    """One queue, by name. Cheap to create: it holds no connection."""

    def __init__(self, executor: AsyncExecutor, name: str, opts: QueueOpts | None = None) -> None:
        self.executor = executor
        self.name = _codec.text(name, "queue")
        self.opts = opts or QueueOpts()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    async def enqueue(
        self,
        payload: Any,
        *,
        delay: int | timedelta | None = None,
        run_at: int | datetime | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        expires: int | timedelta | None = None,
        dedup_key: str | None = None,
        headers: dict[str, Any] | None = None,
        group_key: str | None = None,
        after: Iterable[int] | None = None,
        conn: AsyncConnection | None = None,
    ) -> int:
        """Enqueue one job and return its id (``conn``: inside the caller's transaction).

        ``dedup_key``: while a live job of this queue holds it, nothing is
        written and that job's id is returned. ``headers``: a JSON object that
        travels with the job (trace context, correlation ids; ``Job.headers``).
        ``group_key``: its serial group; jobs of this queue with one key run
        at most ``max_running_per_group`` at a time (:meth:`set_limits`; 1 by default).
        ``after``: ids of jobs of this queue; the job is not claimed until none
        of them exists any more (acked, cancelled) or is completed, and dies
        when one of them dies (docs/queue.md "Dependencies").
        With tracing on, the enqueue's span adds its ``traceparent`` and
        ``tracestate`` to ``headers`` where the caller set none (docs/tracing.md).
        """
        params = enqueue_params(self.name, self.opts, delay, run_at, priority, max_attempts, expires)
        params["payload"] = _codec.payload(payload)
        params["dedup_key"] = None if dedup_key is None else _codec.text(dedup_key, "dedup_key")
        params["group_key"] = None if group_key is None else _codec.text(group_key, "group_key")
        params["after"] = after_ids(after)
        with tracing.Enqueue(self.name, headers) as span:
            params["headers"] = None if span.headers is None else _codec.payload(span.headers, "headers")
            job_id = int(await self.executor.value(_ENQUEUE, params, conn=conn, transactional=True))
            span.enqueued(job_id)
        return job_id

    async def defer(
        self,
        payload: Any,
        *,
        delay: int | timedelta | None = None,
        run_at: int | datetime | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        expires: int | timedelta | None = None,
        dedup_key: str | None = None,
        headers: dict[str, Any] | None = None,
        group_key: str | None = None,
        after: Iterable[int] | None = None,
        conn: AsyncConnection | None = None,
    ) -> AsyncDeferredJob:
        """:meth:`enqueue`, returning the job as an :class:`AsyncDeferredJob`
        whose ``wait()`` returns its result once a worker completed it (the
        queue must keep completed jobs: :meth:`set_retention`)."""
        job_id = await self.enqueue(payload, delay=delay, run_at=run_at, priority=priority,
                                    max_attempts=max_attempts, expires=expires, dedup_key=dedup_key,
                                    headers=headers, group_key=group_key, after=after, conn=conn)
        return AsyncDeferredJob(self.executor, self.name, job_id)

    async def wait_for_result(self, job_id: int, *, timeout: float | None = None) -> Any:
        """Wait, without polling, for job ``job_id`` to be completed and
        return its result (None when its handler returned None). Raises
        :class:`~pyalk.JobDied` (dead: failed, out of attempts, expired),
        :class:`~pyalk.JobCancelled`, :class:`~pyalk.JobNotFound`,
        :class:`~pyalk.NoResultKept` (the queue keeps no completed jobs) or
        :class:`~pyalk.WaitTimeout` after ``timeout`` seconds (None: no
        limit). LISTENs on ``alk.outcome_channel`` on a connection of its own
        while it waits."""
        return (await wait_for_outcome(self.executor, self.name, job_id, timeout)).result

    async def enqueue_batch(
        self,
        payloads: Iterable[Any],
        *,
        delay: int | timedelta | None = None,
        run_at: int | datetime | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        expires: int | timedelta | None = None,
        dedup_keys: Iterable[str | None] | None = None,
        headers: dict[str, Any] | None = None,
        group_keys: Iterable[str | None] | None = None,
        after: Iterable[int] | None = None,
        conn: AsyncConnection | None = None,
    ) -> list[int]:
        """Enqueue many jobs in one round trip; their ids in input order.

        ``dedup_keys`` (aligned with ``payloads``): a held key, or one repeated
        earlier in the batch, returns the holder's id. ``headers``: one JSON
        object for every job of the batch, as every other option; so is
        ``after``: every job of the batch waits for all of its ids.
        ``group_keys`` (aligned with ``payloads``): each job's serial group, or None.
        With tracing on, the batch's one span adds its trace context as
        :meth:`enqueue` does.
        """
        params = enqueue_params(self.name, self.opts, delay, run_at, priority, max_attempts, expires)
        params["payloads"] = _codec.payloads(payloads)
        params["dedup_keys"] = (
            None if dedup_keys is None
            else [None if k is None else _codec.text(k, "dedup_keys") for k in dedup_keys]
        )
        params["group_keys"] = (
            None if group_keys is None
            else [None if k is None else _codec.text(k, "group_keys") for k in group_keys]
        )
        params["after"] = after_ids(after)
        with tracing.Enqueue(self.name, headers, len(params["payloads"])) as span:
            params["headers"] = None if span.headers is None else _codec.payload(span.headers, "headers")
            rows = await self.executor.rows(_ENQUEUE_BATCH, params, conn=conn, transactional=True)
        return [row[0] for row in rows]

    async def claim_batch(self, worker_id: str, n: int) -> list[AsyncJobHandle]:
        """Claim up to ``n`` due jobs (``n <= 0`` claims nothing)."""
        params = {"queue": self.name, "worker_id": _codec.text(worker_id, "worker_id"), "n": _codec.bigint(n, "n")}
        rows = await self.executor.rows(_CLAIM, params)
        return [AsyncJobHandle(self.executor, job_from_row(row)) for row in rows]

    async def claim_one(self, worker_id: str) -> AsyncJobHandle | None:
        """Claim the next due job, or None when there is none."""
        handles = await self.claim_batch(worker_id, 1)
        return handles[0] if handles else None

    async def ack_batch(self, worker_id: str, jobs: Iterable[int | Job | AsyncJobHandle]) -> int:
        """Ack many claimed jobs in one round trip; how many were validly held.

        Jobs given as :class:`Job` or handles carry their fencing token; bare
        ids skip that check (worker and lease still apply).
        """
        ids: list[int | None] = []
        attempts: list[int | None] = []
        for item in jobs:
            job = item.job if isinstance(item, AsyncJobHandle) else item
            if isinstance(job, Job):
                ids.append(job.id)
                attempts.append(job.attempts)
            else:
                ids.append(_codec.bigint(job, "jobs"))
                attempts.append(None)
        params = {
            "job_ids": ids,
            "worker_id": _codec.text(worker_id, "worker_id"),
            "attempts": attempts,
            "queue": self.name,
        }
        return int(
            await self.executor.value(
                "SELECT alk.ack_batch(%(job_ids)s::bigint[], %(worker_id)s, %(attempts)s::bigint[], %(queue)s)",
                params,
            )
        )

    def _outcome_params(
        self, worker_id: str, outcomes: Sequence[tuple[Job, str, str | None]],
        results: Sequence[str | None] | None,
    ) -> dict[str, Any]:
        # Array literals built here: psycopg dumps a list element by element
        # in Python (a regex per element), most of a batch's encoding cost.
        # Which statement settles the batch (all acks or mixed) is alk._settle's to tell.
        if results is not None and len(results) != len(outcomes):
            raise InvalidArgument(f"results must have one entry per outcome: got {len(results)} for "
                                  f"{len(outcomes)} outcomes")
        return {
            "queue": self.name,
            "worker_id": _codec.text(worker_id, "worker_id"),
            "job_ids": bigint_array([job.id for job, _, _ in outcomes]),
            "attempts": bigint_array([job.attempts for job, _, _ in outcomes]),
            "outcomes": text_array([kind for _, kind, _ in outcomes]),
            "errs": text_array([err for _, _, err in outcomes]),
            # No result at all (the usual batch): NULL, nothing more to send.
            "results": None if results is None or not any(r is not None for r in results) else text_array(results),
        }

    async def settle(self, worker_id: str, outcomes: Sequence[tuple[Job, str, str | None]], *,
                     results: Sequence[str | None] | None = None) -> list[str | None]:
        """``alk.settle``: record many claimed jobs' outcomes (``(job, 'ack' |
        'retry' | 'fail', error text)``) in one round trip; per outcome, the
        state it led to ('acked', 'pending', 'dead'), None when the claim was
        no longer valid. ``results`` (aligned with ``outcomes``): each ack's
        result as JSON text (``json.dumps`` of it; None: none), kept when the
        queue keeps completed jobs."""
        if not outcomes:
            return []
        rows = await self.executor.rows(_SETTLE, self._outcome_params(worker_id, outcomes, results))
        return [row[0] for row in rows]

    async def settle_and_claim(
        self, worker_id: str, n: int, outcomes: Sequence[tuple[Job, str, str | None]] = (), *,
        results: Sequence[str | None] | None = None,
    ) -> tuple[list[str | None], list[AsyncJobHandle]]:
        """``alk.settle_and_claim``: settle ``outcomes`` (and ``results``) as
        :meth:`settle` does, then claim up to ``n``, in one call and one
        transaction; the settled states and the claimed jobs."""
        params = self._outcome_params(worker_id, outcomes, results)
        params["n"] = _codec.bigint(n, "n")
        states: list[str | None] = []
        handles: list[AsyncJobHandle] = []
        executor = self.executor
        for row in await executor.rows(_SETTLE_AND_CLAIM, params):
            if row[0] == "claimed":
                handles.append(AsyncJobHandle(executor, job_from_row(row, 1)))
            else:
                states.append(row[3])  # the state column of the job's shape
        return states, handles

    async def release_jobs(self, worker_id: str, jobs: Sequence[Job]) -> int:
        """``alk.release_jobs``: claimed jobs that never started go back to
        pending at once, their attempt refunded; how many were still held."""
        if not jobs:
            return 0
        params = {
            "queue": self.name,
            "worker_id": _codec.text(worker_id, "worker_id"),
            "job_ids": [job.id for job in jobs],
            "attempts": [job.attempts for job in jobs],
        }
        return int(await self.executor.value(_RELEASE, params))

    async def pause(self) -> bool:
        """Pause claims on this queue; True when it was not paused."""
        return bool(await self.executor.value("SELECT alk.pause_queue(%(queue)s)", {"queue": self.name}))

    async def resume(self) -> bool:
        """Resume claims and wake the queue's idle workers; True when it was paused."""
        return bool(await self.executor.value("SELECT alk.resume_queue(%(queue)s)", {"queue": self.name}))

    async def set_retention(self, seconds: int | timedelta) -> bool:
        """``alk.set_queue_retention``: keep acked jobs as completed, with
        their results, for ``seconds`` (0: delete at ack, the default); True
        when the setting changed."""
        params = {"queue": self.name, "completed_s": _codec.seconds(seconds, "seconds")}
        return bool(await self.executor.value(_SET_RETENTION, params))

    async def retention(self) -> int:
        """``alk.queue_retention``: seconds acked jobs stay completed (0: none kept)."""
        return int(await self.executor.value(_RETENTION, {"queue": self.name}))

    async def set_limits(
        self,
        *,
        max_running: int | None = None,
        rate: int | None = None,
        rate_period_s: int | timedelta | None = None,
        max_running_per_group: int | None = None,
    ) -> bool:
        """``alk.set_queue_limits``: this queue's claim limits, all at once
        (each None lifts one). At most ``max_running`` jobs processing with a
        valid lease, ``rate`` claims per window of ``rate_period_s`` seconds
        (set together), ``max_running_per_group`` jobs of one group key
        running (None: 1). True when the limits changed."""
        params = {
            "queue": self.name,
            "max_running": _codec.bigint(max_running, "max_running"),
            "rate": _codec.bigint(rate, "rate"),
            "rate_period_s": _codec.seconds(rate_period_s, "rate_period_s"),
            "max_running_per_group": _codec.bigint(max_running_per_group, "max_running_per_group"),
        }
        return bool(await self.executor.value(_SET_LIMITS, params))

    async def limits(self) -> QueueLimits:
        """``alk.queue_limits``: this queue's claim limits (None where not set)."""
        rows = await self.executor.rows(_LIMITS, {"queue": self.name})
        return QueueLimits(*rows[0])

    async def wait_for_jobs(self, worker_id: str) -> str:
        """``alk.wait_for_jobs``: advertise ``worker_id`` as idle on this
        queue, so enqueues notify its channel (returned)."""
        params = {"queue": self.name, "worker_id": _codec.text(worker_id, "worker_id")}
        return str(await self.executor.value("SELECT alk.wait_for_jobs(%(queue)s, %(worker_id)s)", params))

    async def stop_waiting(self, worker_id: str) -> bool:
        """``alk.stop_waiting``: withdraw the idle advert."""
        params = {"queue": self.name, "worker_id": _codec.text(worker_id, "worker_id")}
        return bool(await self.executor.value("SELECT alk.stop_waiting(%(queue)s, %(worker_id)s)", params))

    async def wake_fence(self, in_progress: list[int] | None = None) -> list[int]:
        """``alk.wake_fence``: the transactions in progress now (``None``), or
        those of ``in_progress`` not yet ended."""
        value = await self.executor.value("SELECT alk.wake_fence(%(fence)s::bigint[])", {"fence": in_progress})
        return list(value or [])

    async def cancel(self, job_id: int) -> bool:
        """Delete a pending or processing job; True if one went."""
        params = {"queue": self.name, "job_id": _codec.bigint(job_id, "job_id")}
        return bool(await self.executor.value("SELECT alk.cancel(%(queue)s, %(job_id)s::bigint)", params))

    async def get_job(self, job_id: int, *, conn: AsyncConnection | None = None) -> Job | None:
        """The job in any state (dead and completed included, a completed one
        with its ``result``), or None."""
        params = {"queue": self.name, "job_id": _codec.bigint(job_id, "job_id")}
        rows = await self.executor.rows(_GET_JOB, params, conn=conn, transactional=True)
        return job_from_row(rows[0]) if rows else None

    async def sweep_expired(self) -> int:
        """Bury expired jobs and purge dead ones past retention; how many rows changed."""
        return int(await self.executor.value("SELECT alk.sweep_expired(%(queue)s)", {"queue": self.name}))

    # observability and worker support (0007) ------------------------------

    async def stats(self, *, exact_limit: int | None = None) -> QueueStats:
        """``alk.queue_stats`` of this queue: counts by state, lag, next due time."""
        [stats] = await queue_stats(self.executor, self.name, exact_limit=exact_limit)
        return stats

    async def next_claim_at(self) -> int | None:
        """``alk.next_claim_at``: when a claim can next return a job (now when
        one is claimable), or None when nothing is waiting or running."""
        value = await self.executor.value(_NEXT_CLAIM, {"queue": self.name})
        return None if value is None else int(value)

    async def next_claim_clock(self) -> tuple[int | None, int, float]:
        """:meth:`next_claim_at` with the clock it was computed on:
        ``(next_claim_at, alk.now(), server wall clock as float seconds)``, so a
        sleep can end on the sub-second when the clock is the wall clock."""
        at, now, wall = (await self.executor.rows(_NEXT_CLAIM_CLOCK, {"queue": self.name}))[0]
        return (None if at is None else int(at)), int(now), float(wall)

    async def list_jobs(self, state: str | None = None, *, limit: int = 100, after_id: int | None = None) -> list[Job]:
        """``alk.list_jobs``: up to ``limit`` jobs in id order, in one state or
        any, after ``after_id`` (keyset paging)."""
        params = {
            "queue": self.name,
            "state": _codec.text(state, "state"),
            "n": _codec.bigint(limit, "limit"),
            "after_id": _codec.bigint(after_id, "after_id"),
        }
        return [job_from_row(row) for row in await self.executor.rows(_LIST_JOBS, params)]

    async def requeue_dead(self, job_ids: Iterable[int] | None = None) -> int:
        """``alk.requeue_dead``: dead jobs (all, or those of ``job_ids``) back
        to pending with fresh attempts; how many moved."""
        ids = None if job_ids is None else [_codec.bigint(job_id, "job_ids") for job_id in job_ids]
        return int(await self.executor.value(_REQUEUE_DEAD, {"queue": self.name, "job_ids": ids}))

    async def channel(self) -> str:
        """``alk.queue_channel``: the LISTEN channel notified when jobs are enqueued here."""
        return str(await self.executor.value(QUEUE_CHANNEL, {"queue": self.name}))
