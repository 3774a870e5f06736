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

    from pyalk._async.queue import AsyncQueue
    from pyalk.options import QueueOpts

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
            raise TypeError(f"AsyncAlk needs a conninfo str, a pool or a connection, got {source!r}")

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
