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
import getpass
import logging
import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from time import monotonic
from typing import TYPE_CHECKING, Any, NoReturn

import psycopg
from psycopg import AsyncConnection
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool

from pyalk import _jsonb
from pyalk._async.pool import AsyncReconnectingPool
from pyalk.backoff import Backoff
from pyalk.conninfo import default_conninfo
from pyalk.errors import ClaimInTransaction, ConnectError, InvalidArgument, server_busy, translate
from pyalk.schema import compat

if TYPE_CHECKING:
    from typing import LiteralString

Source = str | AsyncConnectionPool | AsyncConnection

logger = logging.getLogger("pyalk")

#: Seconds a connection attempt may take when neither the conninfo nor the
#: caller says (libpq's own default is to wait for ever).
DEFAULT_CONNECT_TIMEOUT = 10

# The pool's connect kwargs mix libpq parameters with psycopg's own options.
_PSYCOPG_OPTIONS = {"autocommit", "prepare_threshold", "context", "row_factory", "cursor_factory"}


def raise_translated(error: psycopg.Error) -> NoReturn:
    """Raise the pyalk exception for ``error`` (an LK SQLSTATE), chained to
    it; any other error is raised unchanged."""
    translated = translate(error)
    if translated is error:
        raise error
    raise translated from error


async def _configure(conn: AsyncConnection) -> None:
    """Each connection of a pool pyalk owns: the fast jsonb decoding (a
    claim decodes a payload per job); see pyalk/_jsonb.py."""
    _jsonb.register(conn)


def _connect_timeout(conninfo: str, timeout: int | None) -> int:
    """The connect timeout in seconds: the argument, else the conninfo's
    ``connect_timeout``, else :data:`DEFAULT_CONNECT_TIMEOUT`."""
    if timeout is None:
        try:
            given = conninfo_to_dict(conninfo).get("connect_timeout")
            return int(float(given)) if given not in (None, "") else DEFAULT_CONNECT_TIMEOUT
        except (psycopg.ProgrammingError, ValueError):  # a bad conninfo: connecting says why
            return DEFAULT_CONNECT_TIMEOUT
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 1:
        raise InvalidArgument(f"connect_timeout must be a whole number of seconds >= 1, got {timeout!r}")
    return timeout


def connect_error(conninfo: str, error: psycopg.OperationalError) -> ConnectError:
    """A :class:`ConnectError` naming where the connection went (host, port,
    database, user, as libpq resolves them from the conninfo and PG*
    variables) and libpq's first line of why it failed."""
    params = conninfo_to_dict(conninfo)

    def param(key: str, variable: str, default: str) -> str:
        return str(params.get(key) or os.environ.get(variable) or default)

    try:
        login = getpass.getuser()
    except (OSError, KeyError):
        login = "the login user"
    user = param("user", "PGUSER", login)
    where = (f"host={param('host', 'PGHOST', 'the default socket directory')} port={param('port', 'PGPORT', '5432')} "
             f"dbname={param('dbname', 'PGDATABASE', user)} user={user}")
    # libpq's first line reads "connection failed: connection to server on
    # socket "..." failed: FATAL:  <why>"; the where is said above, keep the why.
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    why = first.rpartition("failed: ")[2].removeprefix("FATAL:").strip() or first
    return ConnectError(f"cannot connect to PostgreSQL at {where}: {why}")


class AsyncExecutor:
    """Runs statements on one connection source.

    ``AsyncExecutor("dbname=app")`` opens (lazily) and owns a small pool;
    ``AsyncExecutor(pool)`` and ``AsyncExecutor(connection)`` borrow the
    caller's. :meth:`close` releases what it owns. No source (None) is the
    conninfo of :func:`pyalk.conninfo.default_conninfo`: ``$PYALK_DSN``,
    else libpq's environment (PGHOST, PGDATABASE, PGUSER, ...).

    An owned pool opens only after one direct connection succeeded, so a
    bad conninfo raises :class:`~pyalk.ConnectError` at once (within
    ``connect_timeout`` seconds: the conninfo's own, else 10) instead of a
    pool retrying in the background; later connection losses are the
    pool's to recover from.
    """

    def __init__(self, source: Source | None = None, *, max_connections: int = 4,
                 connect_timeout: int | None = None) -> None:
        if source is None:
            source = default_conninfo()
        self._conn: AsyncConnection | None = None
        self._pool: AsyncConnectionPool | None = None
        self._owns_pool = False
        self._pool_opened = False
        self._open_lock = asyncio.Lock()
        #: Set once the installed schema passed :func:`pyalk.schema.compat.check`.
        self._schema_checked = False
        if isinstance(source, str):
            # Checked at checkout and quick to reconnect: see pool.py.
            self._pool = AsyncReconnectingPool(
                source,
                min_size=1,
                max_size=max_connections,
                kwargs={"autocommit": True, "connect_timeout": _connect_timeout(source, connect_timeout)},
                configure=_configure,
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
                    await self._first_connection(self._pool)
                    await self._pool.open()
                    self._pool_opened = True
        async with self._pool.connection() as pooled:
            yield pooled

    async def _first_connection(self, pool: AsyncConnectionPool) -> None:
        """Connect once directly with the pool's settings (the pool itself
        would retry in the background, logging, until its 30 s timeout), and
        check the schema on that connection while it is open."""
        conninfo, kwargs = pool.conninfo, pool.kwargs or {}
        assert isinstance(conninfo, str) and isinstance(kwargs, dict)
        backoff = Backoff(0.05, 0.5)
        # As long as a checkout waits for a free connection (the pool's
        # timeout), then the busy error, transient: a caller that retries
        # (a worker's claim loop) decides, and a worker that stopped is not
        # left with a loop retrying for ever.
        give_up = monotonic() + pool.timeout
        while True:
            try:
                probe = await AsyncConnection.connect(conninfo, **kwargs)
                break
            except psycopg.OperationalError as error:
                if not server_busy(error):
                    raise connect_error(conninfo, error) from error
                if monotonic() >= give_up:
                    raise
                # Reachable but full or restarting: wait as after a restart.
                pause = backoff.next()
                logger.warning("%s; retrying in %.2fs", connect_error(conninfo, error), pause)
                await asyncio.sleep(pause)
        try:
            if not self._schema_checked:
                await self._check_schema(probe)
        finally:
            await probe.close()

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
