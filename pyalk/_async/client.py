"""The entry point: an :class:`AsyncAlk` composes pyalk on one connection
source (a conninfo, a psycopg pool, or the caller's connection; none:
``$PYALK_DSN``, else libpq's environment).

It builds one :class:`~pyalk._async.executor.AsyncExecutor` (connections,
the schema check, errors) and hands it to the mechanism handles; every
method here is a one-line composition of them. Transactional forms take
``conn=`` (the caller's connection) and then never commit or roll back on
their own.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from pyalk._async.executor import AsyncExecutor, Source
from pyalk._async.lock import DEFAULT_TTL, AsyncLock
from pyalk._async.outbox import AsyncOutbox
from pyalk._async.queue import AsyncQueue, queue_stats
from pyalk._async.rotation import rotate_jobs
from pyalk._async.schedule import AsyncSchedules
from pyalk._async.stream import AsyncStream
from pyalk._async.worker import AsyncWorker
from pyalk._async.workers import request_stop, workers

if TYPE_CHECKING:
    from psycopg import AsyncConnection

    from pyalk._async.worker import Handler
    from pyalk.stop_token import AsyncStopToken
    from pyalk.values import Fired, QueueOpts, QueueStats, Schedule, WorkerInfo


class AsyncAlk:
    """pyalk on one database.

    ``AsyncAlk("dbname=app")`` opens (lazily) and owns a small pool;
    ``AsyncAlk(pool)`` and ``AsyncAlk(connection)`` borrow the caller's.
    ``AsyncAlk()`` connects where the ``pyalk`` command does: ``$PYALK_DSN``,
    else libpq's own environment (PGHOST, PGPORT, PGDATABASE, PGUSER, ...);
    a source passed in always wins.
    Use it as a context manager, or call :meth:`close`, to release what it owns.
    A conninfo that cannot connect raises :class:`~pyalk.ConnectError` at the
    first call, within ``connect_timeout`` seconds (the conninfo's own, else 10).

    ``executor`` runs every statement; ``schedules`` is the scheduler handle.
    """

    def __init__(self, source: Source | None = None, *, max_connections: int = 4,
                 connect_timeout: int | None = None) -> None:
        self.executor = AsyncExecutor(source, max_connections=max_connections, connect_timeout=connect_timeout)
        self.schedules = AsyncSchedules(self.executor)

    async def __aenter__(self) -> AsyncAlk:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the pool this client opened; borrowed sources stay open."""
        await self.executor.close()

    # mechanisms ------------------------------------------------------------

    def queue(self, name: str, opts: QueueOpts | None = None) -> AsyncQueue:
        return AsyncQueue(self.executor, name, opts)

    def stream(self, name: str) -> AsyncStream:
        return AsyncStream(self.executor, name)

    def outbox(self, name: str, opts: QueueOpts | None = None) -> AsyncOutbox:
        return AsyncOutbox(self.executor, name, opts)

    def lock(self, name: str, owner: str | None = None, *, ttl: int | timedelta = DEFAULT_TTL,
             wait: float | timedelta | None = 0) -> AsyncLock:
        """The lease lock ``name`` held as ``owner`` (default ``host:pid:random``)
        for ``ttl`` seconds at a time. Nothing is taken until ``async with``
        (waits up to ``wait`` seconds, renews while held, releases on exit)
        or :meth:`AsyncLock.try_acquire`."""
        return AsyncLock(self.executor, name, owner, ttl=ttl, wait=wait)

    async def try_lock(self, name: str, owner: str, ttl: int | timedelta) -> AsyncLock | None:
        """Take the lease lock ``name`` for ``owner`` for ``ttl`` seconds; None
        while another owner holds it. Nothing renews it: use ``async with
        alk.lock(...)`` for that, or call :meth:`AsyncLock.renew`."""
        lock = self.lock(name, owner, ttl=ttl)
        return lock if await lock.try_acquire() else None

    def worker(self, queue: str, handler: Handler, **options: Any) -> AsyncWorker:
        """A worker running ``handler`` on the jobs of ``queue``; ``options``
        as :class:`~pyalk.AsyncWorker` takes them (``listen_conninfo``
        defaults to this client's database). Start it with ``run()``."""
        return AsyncWorker(queue if isinstance(queue, AsyncQueue) else self.queue(queue), handler, **options)

    async def stats(self, queue: str | None = None, *, exact_limit: int | None = None) -> list[QueueStats]:
        """``alk.queue_stats``: counts by state, lag and next due time per
        queue (or of one queue); past ``exact_limit`` a count is an estimate."""
        return await queue_stats(self.executor, queue, exact_limit=exact_limit)

    # the registry of workers (docs/worker.md) -----------------------------------

    async def workers(self, *, conn: AsyncConnection | None = None) -> list[WorkerInfo]:
        """``alk.workers()``: every registered worker, by worker_id, with its
        last beat, the jobs it held then, and whether it is ``gone``."""
        return await workers(self.executor, conn=conn)

    async def request_stop(self, worker_id: str, queue: str | None = None, *,
                           conn: AsyncConnection | None = None) -> bool:
        """``alk.request_stop``: ask a registered worker to stop as on SIGTERM
        (it learns at the commit); False when no such worker is registered.
        ``queue`` routes the call in a sharded deployment."""
        return await request_stop(self.executor, worker_id, queue, conn=conn)

    # job storage (docs/design.md, "Job storage") --------------------------------

    async def rotate_jobs(self, min_jobs: int | None = None, *, conn: AsyncConnection | None = None) -> str:
        """``alk.rotate_jobs``: empty the current slot of the job storage once
        ``min_jobs`` of its jobs are settled and no more are live than settled
        (None: the server's default; 0: now), 20,000 rows a call; 'rotated',
        'moving' (more rows are left: call again), 'not due', 'locked' or
        'too many live jobs'. Workers call it as they go."""
        return await rotate_jobs(self.executor, min_jobs, conn=conn)

    # scheduler (docs/schedule.md): compositions of ``self.schedules`` --------

    async def schedule(
        self,
        name: str,
        spec: str,
        queue: str,
        *,
        priority: int | None = None,
        max_attempts: int | None = None,
        expires: int | timedelta | None = None,
        payload: Any = None,
        tz: str | None = None,
        conn: AsyncConnection | None = None,
    ) -> int | None:
        """``alk.schedule``: register or replace ``name``; its next fire time."""
        return await self.schedules.add(name, spec, queue, priority=priority, max_attempts=max_attempts,
                                        expires=expires, payload=payload, tz=tz, conn=conn)

    async def get_schedule(self, name: str, *, conn: AsyncConnection | None = None) -> Schedule | None:
        return await self.schedules.get(name, conn=conn)

    async def list_schedules(self, *, conn: AsyncConnection | None = None) -> list[Schedule]:
        return await self.schedules.list(conn=conn)

    async def unschedule(self, name: str, *, conn: AsyncConnection | None = None) -> bool:
        return await self.schedules.remove(name, conn=conn)

    async def cron_next(self, spec: str, after: int | datetime, tz: str | None = None) -> int | None:
        return await self.schedules.cron_next(spec, after, tz)

    async def tick(self, now: int | datetime | None = None, *, conn: AsyncConnection | None = None) -> list[Fired]:
        return await self.schedules.tick(now, conn=conn)

    async def run_schedules(
        self,
        stop: AsyncStopToken,
        *,
        owner: str | None = None,
        lease_ttl: int | timedelta = 30,
        poll_interval: float = 5.0,
    ) -> None:
        """Fire due schedules while this process leads (lease ``alk:scheduler``),
        until ``stop`` is cancelled; see :meth:`AsyncSchedules.run`."""
        await self.schedules.run(stop, owner=owner, lease_ttl=lease_ttl, poll_interval=poll_interval)
