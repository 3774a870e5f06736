"""The entry point: an :class:`AsyncAlk` binds the ``alk.*`` functions on a
connection source (a conninfo, a psycopg pool, or the caller's connection).

Every method binds arguments, calls one SQL function and maps errors; the
rules live in sql/. Transactional forms take ``conn=`` (the caller's
connection) and then never commit or roll back on their own.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import AsyncConnection
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool

from pyalk.errors import ClaimInTransaction, translate

if TYPE_CHECKING:
    from typing import LiteralString

    from pyalk._async.lock import AsyncLock
    from pyalk._async.outbox import AsyncOutbox
    from pyalk._async.queue import AsyncQueue
    from pyalk._async.stream import AsyncStream
    from pyalk._async.worker import AsyncWorker, Handler
    from pyalk.options import QueueOpts
    from pyalk.schedule_value import Fired, Schedule
    from pyalk.stop_token import AsyncStopToken
    from pyalk.worker_types import QueueStats

Source = str | AsyncConnectionPool | AsyncConnection


class AsyncAlk:
    """pyalk on one database.

    ``AsyncAlk("dbname=app")`` opens (lazily) and owns a small pool;
    ``AsyncAlk(pool)`` and ``AsyncAlk(connection)`` borrow the caller's.
    Use it as a context manager, or call :meth:`close`, to release what it owns.
    """

    def __init__(self, source: Source, *, max_connections: int = 4) -> None:
        self._conn: AsyncConnection | None = None
        self._pool: AsyncConnectionPool | None = None
        self._owns_pool = False
        self._pool_opened = False
        self._open_lock = asyncio.Lock()
        if isinstance(source, str):
            self._pool = AsyncConnectionPool(
                source,
                min_size=1,
                max_size=max_connections,
                kwargs={"autocommit": True},
                open=False,
            )
            self._owns_pool = True
        elif isinstance(source, AsyncConnectionPool):
            self._pool = source
            self._pool_opened = True
        elif isinstance(source, AsyncConnection):
            self._conn = source
        else:
            raise TypeError(f"{type(self).__name__} needs a conninfo str, a pool or a connection, got {source!r}")

    async def __aenter__(self) -> AsyncAlk:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the pool this client opened; borrowed sources stay open."""
        if self._owns_pool and self._pool is not None and self._pool_opened:
            await self._pool.close()
            self._pool_opened = False

    # mechanisms ------------------------------------------------------------

    def queue(self, name: str, opts: QueueOpts | None = None) -> AsyncQueue:
        from pyalk._async.queue import AsyncQueue

        return AsyncQueue(self, name, opts)

    def stream(self, name: str) -> AsyncStream:
        from pyalk._async.stream import AsyncStream

        return AsyncStream(self, name)

    def outbox(self, name: str, opts: QueueOpts | None = None) -> AsyncOutbox:
        from pyalk._async.outbox import AsyncOutbox

        return AsyncOutbox(self, name, opts)

    async def try_lock(self, name: str, owner: str, ttl: int) -> AsyncLock | None:
        """Take the lease lock ``name`` for ``owner`` for ``ttl`` seconds; None
        while another owner holds it. The lock releases on context exit."""
        from pyalk._async.lock import try_lock

        return await try_lock(self, name, owner, ttl)

    def worker(self, queue: str, handler: Handler, **options: Any) -> AsyncWorker:
        """A worker running ``handler`` on the jobs of ``queue``; ``options``
        as :class:`~pyalk.AsyncWorker` takes them. Start it with ``run()``."""
        from pyalk._async.worker import AsyncWorker

        return AsyncWorker(self, queue, handler, **options)

    async def stats(self, queue: str | None = None) -> list[QueueStats]:
        """``alk.queue_stats``: counts by state, lag and next due time per
        queue (or of one queue)."""
        from pyalk._async.worker import queue_stats

        return await queue_stats(self, queue)

    # scheduler (docs/schedule.md) -------------------------------------------

    async def schedule(
        self,
        name: str,
        spec: str,
        queue: str,
        *,
        priority: int | None = None,
        max_attempts: int | None = None,
        expires: int | None = None,
        payload: Any = None,
        tz: str | None = None,
        conn: AsyncConnection | None = None,
    ) -> int | None:
        """``alk.schedule``: register or replace ``name``; its next fire time."""
        from pyalk._async import schedule

        return await schedule.schedule(self, name, spec, queue, priority=priority, max_attempts=max_attempts,
                                       expires=expires, payload=payload, tz=tz, conn=conn)

    async def get_schedule(self, name: str, *, conn: AsyncConnection | None = None) -> Schedule | None:
        from pyalk._async import schedule

        return await schedule.get_schedule(self, name, conn=conn)

    async def list_schedules(self, *, conn: AsyncConnection | None = None) -> list[Schedule]:
        from pyalk._async import schedule

        return await schedule.list_schedules(self, conn=conn)

    async def unschedule(self, name: str, *, conn: AsyncConnection | None = None) -> bool:
        from pyalk._async import schedule

        return await schedule.unschedule(self, name, conn=conn)

    async def cron_next(self, spec: str, after: int, tz: str | None = None) -> int | None:
        from pyalk._async import schedule

        return await schedule.cron_next(self, spec, after, tz)

    async def tick(self, now: int | None = None, *, conn: AsyncConnection | None = None) -> list[Fired]:
        from pyalk._async import schedule

        return await schedule.tick(self, now, conn=conn)

    async def run_schedules(
        self, stop: AsyncStopToken, *, owner: str | None = None, lease_ttl: int = 30, poll_interval: float = 5.0
    ) -> None:
        """Fire due schedules while this process leads (lease ``alk:scheduler``),
        until ``stop`` is cancelled; see :func:`pyalk._async.schedule.run_schedules`."""
        from pyalk._async import schedule

        await schedule.run_schedules(self, stop, owner=owner, lease_ttl=lease_ttl, poll_interval=poll_interval)

    # listening (stream subscriptions) --------------------------------------

    def _listen_conninfo(self) -> str:
        """A conninfo for a dedicated connection to this client's database,
        password included: a stream subscription LISTENs on its own connection
        rather than holding one of the pool's. A pool's ``configure`` callback
        is not replayed on it."""
        from psycopg.conninfo import make_conninfo

        if self._pool is not None:
            conninfo, kwargs = self._pool.conninfo, self._pool.kwargs or {}
            if not isinstance(conninfo, str) or not isinstance(kwargs, dict):
                raise TypeError("subscribing needs a pool built from a conninfo string, not a connection callable")
            # The pool's connect kwargs mix libpq parameters with psycopg's own.
            psycopg_options = {"autocommit", "prepare_threshold", "context", "row_factory", "cursor_factory"}
            extra = {k: v for k, v in kwargs.items() if k not in psycopg_options}
            return make_conninfo(conninfo, **extra)
        assert self._conn is not None
        info = self._conn.info
        return make_conninfo(info.dsn, **({"password": info.password} if info.password else {}))

    # plumbing --------------------------------------------------------------

    @asynccontextmanager
    async def _connection(self, conn: AsyncConnection | None, transactional: bool) -> AsyncIterator[AsyncConnection]:
        """A connection for one call.

        ``conn`` (a transactional form's caller connection) is used as it is.
        Non-transactional calls refuse a connection inside an open
        transaction: claims are never tied to a business transaction.
        """
        if conn is not None:
            yield conn
            return
        if self._conn is not None:
            status = self._conn.info.transaction_status
            if status == TransactionStatus.IDLE or self._conn.autocommit:
                if self._conn.autocommit:
                    yield self._conn
                else:
                    async with self._conn.transaction():
                        yield self._conn
                return
            if not transactional:
                raise ClaimInTransaction(
                    "this operation runs outside business transactions, and the connection is inside one: "
                    "use a separate connection or pool for claims"
                )
            yield self._conn
            return
        assert self._pool is not None
        if not self._pool_opened:
            async with self._open_lock:
                if not self._pool_opened:
                    await self._pool.open()
                    self._pool_opened = True
        async with self._pool.connection() as pooled:
            yield pooled

    async def _rows(
        self,
        query: LiteralString,
        params: Mapping[str, Any],
        *,
        conn: AsyncConnection | None = None,
        transactional: bool = False,
    ) -> list[tuple[Any, ...]]:
        """Run one statement and return its rows, with pyalk's errors."""
        try:
            async with self._connection(conn, transactional) as connection:
                cursor = await connection.execute(query, params)
                return await cursor.fetchall()
        except psycopg.Error as error:
            translated = translate(error)
            if translated is error:
                raise
            raise translated from error

    async def _value(
        self,
        query: LiteralString,
        params: Mapping[str, Any],
        *,
        conn: AsyncConnection | None = None,
        transactional: bool = False,
    ) -> Any:
        """The single value of a one-row, one-column statement."""
        rows = await self._rows(query, params, conn=conn, transactional=transactional)
        return rows[0][0]
