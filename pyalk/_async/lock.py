"""Lease locks: a handle binding alk.try_lock, alk.renew_lock,
alk.release_lock and alk.get_lock for one (name, owner), and the context
manager that takes, keeps and frees one.

The rules (free or expired acquires, the holder's re-acquire renews, ttl <= 0
refused, saturating expiry, who may renew and release) are in sql/lock.sql
(docs/contract.md#locks); this module binds them. What SQL cannot do on its
own is here: waiting for a held lock (polling with a backoff) and renewing
while the block runs (a background task)::

    async with alk.lock("nightly-report", ttl=30, wait=5):
        ...   # held, renewed every (ttl - 1) / 3 s, released on exit
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import socket
import time
from datetime import timedelta
from typing import TYPE_CHECKING

from pyalk import _codec
from pyalk.errors import InvalidArgument, LockLost, LockNotAcquired
from pyalk.runtime import AsyncRuntime, AsyncTask
from pyalk.stop_token import AsyncStopToken
from pyalk.values import LOCK_COLUMNS, LockInfo, lock_info_from_row

if TYPE_CHECKING:
    from typing import LiteralString

    from pyalk._async.executor import AsyncExecutor

logger = logging.getLogger("pyalk.lock")

# Public functions refuse the reserved alk: prefix; the internal ones accept
# it and are used only by pyalk itself (the scheduler's leader lock).
_TRY = "SELECT alk.try_lock(%(name)s, %(owner)s, %(ttl)s::bigint)"
_RENEW = "SELECT alk.renew_lock(%(name)s, %(owner)s, %(ttl)s::bigint)"
_RELEASE = "SELECT alk.release_lock(%(name)s, %(owner)s)"
_GET = "SELECT " + LOCK_COLUMNS + " FROM alk.get_lock(%(name)s)"
_TRY_RESERVED = "SELECT alk._try_lock(%(name)s, %(owner)s, %(ttl)s::bigint)"
_RENEW_RESERVED = "SELECT alk._renew_lock(%(name)s, %(owner)s, %(ttl)s::bigint)"
_RELEASE_RESERVED = "SELECT alk._release_lock(%(name)s, %(owner)s)"

#: The default lease of the context manager form, in seconds.
DEFAULT_TTL = 30
# Waiting for a held lock polls try_lock: first after 50 ms, doubling up to 1 s.
_FIRST_PAUSE = 0.05
_MAX_PAUSE = 1.0
# A renewal at least once a day, whatever the ttl (a thread cannot sleep for ever).
_MAX_RENEW_INTERVAL = 86400.0


def default_owner() -> str:
    """``host:pid:random``: unique per call, so two handles of one process are
    two contenders (an owner re-acquiring its own lock would succeed)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def wait_seconds(value: float | timedelta | None, argument: str = "wait") -> float | None:
    """How long to wait for a held lock: seconds >= 0 (a number or a
    timedelta), or None for as long as it takes."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0 or math.isinf(value):
        raise InvalidArgument(f"{argument} must be a finite number of seconds >= 0, a timedelta or None, got {value!r}")
    return float(value)


class AsyncLock:
    """The lease lock ``name`` as ``owner`` (default ``host:pid:random``)
    sees it. Creating it takes nothing.

    The documented form is the async context manager: ``async with
    alk.lock(name, ttl=30, wait=5):`` takes the lock (waiting up to ``wait``
    seconds for its holder, then :class:`~pyalk.LockNotAcquired`), renews it
    every ``(ttl - 1) / 3`` seconds in a background task while the block runs, and releases
    it on exit. If a renewal finds the lock taken by another owner,
    :attr:`lost` turns True and leaving the block raises
    :class:`~pyalk.LockLost` (unless the block is already raising).

    :meth:`try_acquire`, :meth:`renew` and :meth:`release` are the manual
    forms, one statement each; they renew nothing on their own.
    ``reserved=True`` admits pyalk's own ``alk:`` names (the scheduler's
    leader lock) through the internal functions.
    """

    def __init__(self, executor: AsyncExecutor, name: str, owner: str | None = None, *,
                 ttl: int | timedelta = DEFAULT_TTL, wait: float | timedelta | None = 0,
                 reserved: bool = False) -> None:
        self.executor = executor
        self.name = _codec.text(name, "name")
        self.owner = default_owner() if owner is None else _codec.text(owner, "owner")
        #: The lease in whole seconds that acquires and renewals ask for.
        self.ttl = self._ttl(ttl)
        #: How long entering the context manager waits for a held lock (None: no limit).
        self.wait = wait_seconds(wait)
        self._reserved = reserved
        self._released = False
        self._lost = False
        self._keeper: AsyncTask | None = None
        self._stop: AsyncStopToken | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, owner={self.owner!r})"

    @staticmethod
    def _ttl(ttl: int | timedelta) -> int:
        seconds = _codec.seconds(ttl, "ttl")
        if seconds is None:
            raise InvalidArgument("ttl must be a number of seconds or a timedelta, got None")
        return seconds  # ttl <= 0 is the SQL's refusal (LK002), at the first acquire

    @property
    def lost(self) -> bool:
        """True once a background renewal found the lock taken by another
        owner: the block is no longer exclusive."""
        return self._lost

    # the context manager -------------------------------------------------------

    async def __aenter__(self) -> AsyncLock:
        await self.acquire()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        await self._stop_keeping()
        if self._released:  # released by hand inside the block
            return
        released = await self.release()
        if self._lost or not released:
            message = (f"lock {self.name!r} was lost while held by {self.owner!r}: it lapsed and another owner "
                       "took it, so the block did not run exclusively")
            if exc_type is None:
                raise LockLost(message)
            logger.error("%s (the block raised %s)", message, exc_type.__name__)

    async def acquire(self) -> None:
        """Take the lock, waiting up to :attr:`wait` seconds while another
        owner holds it (polling ``alk.try_lock`` with a backoff from 50 ms to
        1 s), then keep it renewed until :meth:`release`. Raises
        :class:`~pyalk.LockNotAcquired` when the wait ran out."""
        if 0 < self.ttl < 2:
            # alk.now() counts whole seconds: a 1 s lease taken late in a second ends at once.
            raise InvalidArgument(f"ttl must be at least 2 seconds for a lock kept renewed, got {self.ttl}")
        await self._stop_keeping()  # entered again while held: one renewal task, not two
        deadline = None if self.wait is None else time.monotonic() + self.wait
        pause = _FIRST_PAUSE
        while not await self.try_acquire():
            left = math.inf if deadline is None else deadline - time.monotonic()
            if left <= 0:
                info = await self.get()
                holder = "" if info is None else f" (held by {info.owner!r} until {info.expires_at})"
                raise LockNotAcquired(f"lock {self.name!r} not acquired within {self.wait:g}s{holder}")
            await AsyncRuntime.sleep(min(pause, left))
            pause = min(pause * 2, _MAX_PAUSE)
        self._lost = False
        self._stop = AsyncStopToken()
        self._keeper = AsyncRuntime.spawn(self._keep, self._stop, name=f"pyalk-lock-{self.name}")

    async def _keep(self, stop: AsyncStopToken) -> None:
        """Renew every (ttl - 1) / 3 seconds until stopped (the clock counts
        whole seconds, so a lease is sure of ttl - 1 of them); a failed attempt
        (the database unreachable) is logged and tried again at the next turn,
        while the lease still runs."""
        interval = min((self.ttl - 1) / 3, _MAX_RENEW_INTERVAL)
        while not await stop.wait(interval):
            try:
                renewed = await self.renew()
            except Exception as error:
                logger.warning("lock %r: renewal failed (%s); trying again in %.1fs", self.name, error, interval)
                continue
            if not renewed:
                self._lost = True
                logger.error("lock %r: lost by %r (it lapsed and another owner took it)", self.name, self.owner)
                return

    async def _stop_keeping(self) -> None:
        if self._stop is not None and self._keeper is not None:
            self._stop.cancel()
            await self._keeper.join()
        self._stop = self._keeper = None

    # one statement each ----------------------------------------------------------

    async def _call(self, query: LiteralString, ttl: int | None = None) -> bool:
        params = {"name": self.name, "owner": self.owner, "ttl": ttl}
        # Never inside a business transaction: a lock taken there would block
        # every contender until that transaction ends, and vanish on rollback.
        return bool(await self.executor.value(query, params))

    async def try_acquire(self, ttl: int | timedelta | None = None) -> bool:
        """``alk.try_lock``: take the lock for ``ttl`` (default :attr:`ttl`;
        given, it becomes the handle's ttl); False while another owner holds
        it (this owner re-acquiring renews). Starts no renewal."""
        if ttl is not None:
            self.ttl = self._ttl(ttl)
        acquired = await self._call(_TRY_RESERVED if self._reserved else _TRY, self.ttl)
        if acquired:
            self._released = False
        return acquired

    async def renew(self, ttl: int | timedelta | None = None) -> bool:
        """``alk.renew_lock``: a new full window, held until now + ``ttl``
        (default :attr:`ttl`). False when the lock was lost (released, or
        expired and taken by another owner)."""
        seconds = self.ttl if ttl is None else self._ttl(ttl)
        return await self._call(_RENEW_RESERVED if self._reserved else _RENEW, seconds)

    async def release(self) -> bool:
        """``alk.release_lock``: stop renewing and free the lock; True if this
        owner still held it."""
        await self._stop_keeping()
        released = await self._call(_RELEASE_RESERVED if self._reserved else _RELEASE)
        self._released = True
        return released

    async def get(self) -> LockInfo | None:
        """``alk.get_lock``: the lock as stored, whoever holds it; None when
        nobody took it or it was released."""
        row = await self.executor.one(_GET, {"name": self.name})
        return None if row is None else lock_info_from_row(row)

    async def expires_at(self) -> int | None:
        """When this owner's hold ends (unix seconds on ``alk.now()``'s clock;
        at or before now it is expired but not yet taken), or None when the
        lock is no longer this owner's (released, or taken by another owner)."""
        info = await self.get()
        return info.expires_at if info is not None and info.owner == self.owner else None
