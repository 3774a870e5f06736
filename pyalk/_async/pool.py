"""The connection pool pyalk opens for a conninfo: psycopg_pool's, recovering
fast from a server restart or outage (issue 13 item 2).

Two changes to the stock pool, both about dead connections:

* a checkout check that costs no round trip: an idle pooled connection
  whose socket has become readable was closed by the server (or holds an
  unsolicited message); only then is it probed (``execute("")``), and a
  dead one is discarded, together with every other dead idle connection,
  before the caller sees it. So a restart costs no failed claim per dead
  connection;
* reconnect attempts from 50 ms doubling to 0.5 s (the stock pool starts
  at 1 s and doubles without a cap: after an 8 s outage its next attempt
  came about 6 s late).
"""

from __future__ import annotations

import select
from typing import Any

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool
from psycopg_pool.base import AttemptWithBackoff

#: The reconnect schedule: first retry, cap (seconds).
RECONNECT_FIRST = 0.05
RECONNECT_CAP = 0.5


class _Attempt(AttemptWithBackoff):
    """The stock doubling schedule with a short start and a cap."""

    INITIAL_DELAY = RECONNECT_FIRST

    def update_delay(self, now: float) -> None:
        super().update_delay(now)
        self.delay = min(self.delay, RECONNECT_CAP)


def _readable(conn: AsyncConnection) -> bool:
    """Whether an idle connection's socket has input: EOF or an error the
    server sent before closing it (a live idle connection has none)."""
    try:
        ready, _, _ = select.select([conn.pgconn.socket], [], [], 0)
    except (OSError, ValueError):  # closed socket: fileno gone
        return True
    return bool(ready)


class AsyncReconnectingPool(AsyncConnectionPool):
    """An :class:`AsyncConnectionPool` that checks connections at checkout
    (cheaply, see the module) and reconnects on a short capped schedule."""

    def __init__(self, conninfo: str, **kwargs: Any) -> None:
        super().__init__(conninfo, check=self._check_idle, **kwargs)

    async def _check_idle(self, conn: AsyncConnection) -> None:
        if conn.closed or _readable(conn):
            try:
                await conn.execute("")
            except Exception:
                # The others idle beside it most likely died with it: sweep
                # them now rather than hand each out once more.
                await self.check()
                raise

    async def _add_connection(self, attempt: AttemptWithBackoff | None, growing: bool = False) -> None:
        await super()._add_connection(attempt or _Attempt(timeout=self.reconnect_timeout), growing)
