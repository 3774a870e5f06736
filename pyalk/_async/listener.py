"""A dedicated LISTEN connection on one channel, shared by the worker (a
background loop that sets a wake event on every NOTIFY) and the stream
subscription (which reads on the same connection and waits on it). The
worker's loop also listens there on its control channel (``listen_also``),
whose payloads go to a callback and wake nothing.

The connection is opened outside any pool (``conninfo``, autocommit) and
subscribed before anything else runs on it, so a commit a later read misses
is always notified to it. A lost connection is dropped; the next connect
waits the backoff first.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from psycopg import AsyncConnection, sql

from pyalk.backoff import Backoff
from pyalk.errors import TRANSIENT_ERRORS
from pyalk.runtime import AsyncEvent, AsyncRuntime
from pyalk.worker.errors import one_line


class AsyncListener:
    """LISTEN on the channel ``channel()`` names, over a connection to ``conninfo``.

    Foreground use (a subscription): :meth:`connect`, run queries on the
    connection, :meth:`wait`; on a lost connection :meth:`lost`, and
    :meth:`healthy` once work succeeds again. Background use (a worker):
    :meth:`run`.
    """

    def __init__(
        self,
        conninfo: str,
        channel: Callable[[], Awaitable[str]],
        *,
        backoff: Backoff,
        connect_timeout: int | None = None,
    ) -> None:
        self._conninfo = conninfo
        self._resolve = channel
        self._channel: str | None = None
        self._backoff = backoff
        self._connect_timeout = connect_timeout
        self._conn: AsyncConnection | None = None
        self._pause = 0.0  # owed by a loss: waited before the next connect
        #: How many times the connection was lost (each loss is followed by a reconnect).
        self.reconnects = 0
        #: Notifications :meth:`run` received (and connects, which may hide one):
        #: a worker's idle advert is consumed by the enqueue that notifies it.
        self.notified = 0
        # Further channels of run()'s connection and what each payload goes
        # to; those added while connected are subscribed at the next slice.
        self._also: dict[str, Callable[[str], None]] = {}
        self._unsubscribed: list[str] = []

    @property
    def channel(self) -> str | None:
        """The channel, once resolved."""
        return self._channel

    @property
    def listening(self) -> bool:
        """Whether the connection is up and subscribed."""
        return self._conn is not None and not self._conn.closed

    @property
    def pid(self) -> int | None:
        """The server process id of the connection, when connected."""
        conn = self._conn
        return None if conn is None or conn.closed else conn.info.backend_pid

    def listen_also(self, channel: str, on_payload: Callable[[str], None]) -> None:
        """Also LISTEN on ``channel`` in :meth:`run` (from its next slice, and
        on every reconnect), calling ``on_payload`` with each notification's
        payload there; those count as no notification and wake nothing.
        Safe from any thread."""
        self._also[channel] = on_payload
        self._unsubscribed.append(channel)

    async def connect(self) -> AsyncConnection:
        """The listening connection: opened and subscribed when needed (after
        the pause a previous loss owes)."""
        if self._conn is not None and not self._conn.closed:
            return self._conn
        if self._pause:
            pause, self._pause = self._pause, 0.0
            await AsyncRuntime.sleep(pause)
        return await self._open()

    async def _open(self) -> AsyncConnection:
        if self._channel is None:
            self._channel = await self._resolve()
        options: dict[str, Any] = {"autocommit": True}
        if self._connect_timeout is not None:
            options["connect_timeout"] = self._connect_timeout
        conn = await AsyncConnection.connect(self._conninfo, **options)
        try:
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
            self._unsubscribed.clear()
            for channel in list(self._also):
                await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        except BaseException:
            await conn.close()
            raise
        self._conn = conn
        return conn

    async def wait(self, timeout: float) -> bool:
        """Wait for one notification, ``timeout`` seconds at most; whether one came.
        A notification that arrived since the last wait is kept by psycopg for
        this call (3.3 tested); were one ever dropped, the timeout is the fallback."""
        conn = await self.connect()
        async for _ in conn.notifies(timeout=timeout, stop_after=1):
            return True
        return False

    def healthy(self) -> None:
        """Work on the connection succeeded: the next loss retries from the first delay."""
        self._backoff.reset()

    async def lost(self) -> float:
        """The connection was lost: drop it; the next :meth:`connect` waits
        the returned backoff first."""
        await self.close()
        self.reconnects += 1
        self._pause = self._backoff.next()
        return self._pause

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            await conn.close()

    async def run(self, wake: AsyncEvent, stop: AsyncEvent, logger: logging.Logger, extra: dict[str, Any]) -> None:
        """Listen until ``stop`` is set, setting ``wake`` on every notification
        and on each (re)connect (anything sent while not listening);
        reconnect with backoff on a lost connection (the caller polls meanwhile)."""
        try:
            while not stop.is_set():
                try:
                    conn = await self._open()
                    self.healthy()
                    for channel in (self._channel, *self._also):
                        logger.debug("listening on %s", channel, extra={**extra, "channel": channel})
                    self.notified += 1
                    wake.set()
                    while not stop.is_set():
                        while self._unsubscribed:
                            channel = self._unsubscribed.pop(0)
                            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                            logger.debug("listening on %s", channel, extra={**extra, "channel": channel})
                        # Slices, for the channels listen_also adds meanwhile.
                        async for notify in AsyncRuntime.notifies(conn, stop, 0.25):
                            on_payload = self._also.get(notify.channel)
                            if on_payload is not None:
                                on_payload(notify.payload)
                                continue
                            self.notified += 1
                            wake.set()
                            # The woken claim goes first: re-arming this wait
                            # would otherwise delay it.
                            await AsyncRuntime.yield_now()
                    return
                except TRANSIENT_ERRORS as error:
                    pause = await self.lost()
                    if stop.is_set():
                        return
                    logger.warning("LISTEN connection lost (%s); reconnecting in %.1fs (polling meanwhile)",
                                   one_line(error), pause, extra=extra)
                except Exception:
                    pause = await self.lost()
                    logger.exception("LISTEN connection failed; polling only, retrying in %.1fs", pause,
                                     extra=extra)
                self._pause = 0.0  # waited here, where a stop ends it
                await stop.wait(pause)
        finally:
            await self.close()
