"""The executor: the one place that runs pyalk's statements.

It owns the connection policy (a conninfo becomes an owned pool; a pool or a
connection is borrowed; the transactional ``conn=`` forms and the
:class:`~pyalk.ClaimInTransaction` refusal), the schema compatibility check
(once per executor, before its first statement), SQLSTATE-to-exception
translation, and the conninfo a LISTEN connection opens. Every mechanism
handle (queue, stream, outbox, lock, schedules) runs its SQL through one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, NoReturn

import psycopg
from psycopg import AsyncConnection
from psycopg.conninfo import make_conninfo
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool

from pyalk import compat
from pyalk.errors import ClaimInTransaction, translate

if TYPE_CHECKING:
    from typing import LiteralString

Source = str | AsyncConnectionPool | AsyncConnection

# The pool's connect kwargs mix libpq parameters with psycopg's own options.
_PSYCOPG_OPTIONS = {"autocommit", "prepare_threshold", "context", "row_factory", "cursor_factory"}


def raise_translated(error: psycopg.Error) -> NoReturn:
    """Raise the pyalk exception for ``error`` (an LK SQLSTATE), chained to
    it; any other error is raised unchanged."""
    translated = translate(error)
    if translated is error:
        raise error
    raise translated from error


class AsyncExecutor:
    """Runs statements on one connection source.

    ``AsyncExecutor("dbname=app")`` opens (lazily) and owns a small pool;
    ``AsyncExecutor(pool)`` and ``AsyncExecutor(connection)`` borrow the
    caller's. :meth:`close` releases what it owns.
    """

    def __init__(self, source: Source, *, max_connections: int = 4) -> None:
        self._conn: AsyncConnection | None = None
        self._pool: AsyncConnectionPool | None = None
        self._owns_pool = False
        self._pool_opened = False
        self._open_lock = asyncio.Lock()
        #: Set once the installed schema passed :func:`pyalk.compat.check`.
        self._schema_checked = False
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
            raise TypeError(f"pyalk needs a conninfo str, a pool or a connection, got {source!r}")

    async def close(self) -> None:
        """Close the pool this executor opened; borrowed sources stay open."""
        if self._owns_pool and self._pool is not None and self._pool_opened:
            await self._pool.close()
            self._pool_opened = False

    # connections -----------------------------------------------------------

    @asynccontextmanager
    async def connection(
        self, conn: AsyncConnection | None = None, *, transactional: bool = False
    ) -> AsyncIterator[AsyncConnection]:
        """A connection for one call, schema checked, errors translated.

        ``conn`` (a transactional form's caller connection) is used as it is.
        Non-transactional calls refuse a borrowed connection inside an open
        transaction: claims are never tied to a business transaction.
        """
        try:
            async with self._pick(conn, transactional) as connection:
                if not self._schema_checked:
                    await self._check_schema(connection)
                yield connection
        except psycopg.Error as error:
            raise_translated(error)

    @asynccontextmanager
    async def _pick(self, conn: AsyncConnection | None, transactional: bool) -> AsyncIterator[AsyncConnection]:
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

    async def _check_schema(self, connection: AsyncConnection) -> None:
        """Refuse, in one line, a schema this pyalk cannot run on. Run once:
        a passing check is cached; a failing one is asked again next call
        (the database may have been migrated meanwhile)."""
        try:
            cursor = await connection.execute(compat.SCHEMA_INFO)
            row = await cursor.fetchone()
        except psycopg.Error as error:
            if error.sqlstate in compat.MISSING:
                raise compat.missing() from None
            raise
        version, breaking_since = row if row is not None else (None, None)
        compat.check(version, breaking_since)
        self._schema_checked = True

    def listen_conninfo(self) -> str:
        """A conninfo for a dedicated connection to this executor's database,
        password included: a LISTEN loop holds its own connection rather than
        one of the pool's. A pool's ``configure`` callback is not replayed."""
        if self._pool is not None:
            conninfo, kwargs = self._pool.conninfo, self._pool.kwargs or {}
            if not isinstance(conninfo, str) or not isinstance(kwargs, dict):
                raise TypeError("listening needs a pool built from a conninfo string, not a connection callable")
            extra = {k: v for k, v in kwargs.items() if k not in _PSYCOPG_OPTIONS}
            return make_conninfo(conninfo, **extra)
        assert self._conn is not None
        info = self._conn.info
        return make_conninfo(info.dsn, **({"password": info.password} if info.password else {}))

    # statements ------------------------------------------------------------

    async def rows(
        self,
        query: LiteralString,
        params: Mapping[str, Any] | None = None,
        *,
        conn: AsyncConnection | None = None,
        transactional: bool = False,
    ) -> list[tuple[Any, ...]]:
        """Run one statement and return its rows, with pyalk's errors.

        ``transactional=True`` marks a call that may run inside the caller's
        transaction (``conn=``, or a borrowed connection inside one)."""
        async with self.connection(conn, transactional=transactional) as connection:
            cursor = await connection.execute(query, params or {})
            return await cursor.fetchall()

    async def one(
        self,
        query: LiteralString,
        params: Mapping[str, Any] | None = None,
        *,
        conn: AsyncConnection | None = None,
        transactional: bool = False,
    ) -> tuple[Any, ...] | None:
        """The first row of a statement, or None when it returns none."""
        rows = await self.rows(query, params, conn=conn, transactional=transactional)
        return rows[0] if rows else None

    async def value(
        self,
        query: LiteralString,
        params: Mapping[str, Any] | None = None,
        *,
        conn: AsyncConnection | None = None,
        transactional: bool = False,
    ) -> Any:
        """The single value of a one-row, one-column statement."""
        rows = await self.rows(query, params, conn=conn, transactional=transactional)
        return rows[0][0]
