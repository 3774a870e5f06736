"""Lease locks: a handle binding alk.try_lock, alk.renew_lock,
alk.release_lock and alk.get_lock for one (name, owner).

The rules (free or expired acquires, the holder's re-acquire renews, ttl <= 0
refused, saturating expiry, who may renew and release) are in
sql/versions/0005_lock.sql; this module binds them. ``AsyncAlk.try_lock``
returns the lock once taken, or None while another owner holds it::

    lock = await alk.try_lock("nightly-report", "host-a", ttl=60)
    if lock is None:
        return
    async with lock:
        ...
"""

from __future__ import annotations

import os
import secrets
import socket
from typing import TYPE_CHECKING

from pyalk import _codec
from pyalk.lock_value import LOCK_COLUMNS, LockInfo, lock_info_from_row

if TYPE_CHECKING:
    from typing import LiteralString

    from pyalk._async.executor import AsyncExecutor

# Public functions refuse the reserved alk: prefix; the internal ones accept
# it and are used only by pyalk itself (the scheduler's leader lock).
_TRY = "SELECT alk.try_lock(%(name)s, %(owner)s, %(ttl)s::bigint)"
_RENEW = "SELECT alk.renew_lock(%(name)s, %(owner)s, %(ttl)s::bigint)"
_RELEASE = "SELECT alk.release_lock(%(name)s, %(owner)s)"
_GET = "SELECT " + LOCK_COLUMNS + " FROM alk.get_lock(%(name)s)"
_TRY_RESERVED = "SELECT alk._try_lock(%(name)s, %(owner)s, %(ttl)s::bigint)"
_RENEW_RESERVED = "SELECT alk._renew_lock(%(name)s, %(owner)s, %(ttl)s::bigint)"
_RELEASE_RESERVED = "SELECT alk._release_lock(%(name)s, %(owner)s)"


def default_owner() -> str:
    """``host:pid:random``: unique per call, so two handles of one process are
    two contenders (an owner re-acquiring its own lock would succeed)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


class AsyncLock:
    """The lease lock ``name`` as ``owner`` (default ``host:pid:random``)
    sees it. Cheap to create: creating it takes nothing; :meth:`try_acquire`
    does. Holding the object does not prove the lock is held: renew before
    ``ttl`` runs out and check what it returns.

    As an async context manager it releases the lock on exit.
    ``reserved=True`` admits pyalk's own ``alk:`` names (the scheduler's
    leader lock) through the internal functions.
    """

    def __init__(self, executor: AsyncExecutor, name: str, owner: str | None = None, *,
                 reserved: bool = False) -> None:
        self.executor = executor
        self.name = _codec.text(name, "name")
        self.owner = default_owner() if owner is None else _codec.text(owner, "owner")
        self._reserved = reserved
        self._released = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, owner={self.owner!r})"

    async def __aenter__(self) -> AsyncLock:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self._released:
            await self.release()

    async def _call(self, query: LiteralString, ttl: int | None = None) -> bool:
        params = {"name": self.name, "owner": self.owner, "ttl": _codec.bigint(ttl, "ttl")}
        # Never inside a business transaction: a lock taken there would block
        # every contender until that transaction ends, and vanish on rollback.
        return bool(await self.executor.value(query, params))

    async def try_acquire(self, ttl: int) -> bool:
        """``alk.try_lock``: take the lock for ``ttl`` seconds; False while
        another owner holds it (this owner re-acquiring renews)."""
        acquired = await self._call(_TRY_RESERVED if self._reserved else _TRY, ttl)
        if acquired:
            self._released = False
        return acquired

    async def renew(self, ttl: int) -> bool:
        """``alk.renew_lock``: a new full window, held until now + ``ttl``
        seconds. False when the lock was lost (released, or expired and taken
        by another owner)."""
        return await self._call(_RENEW_RESERVED if self._reserved else _RENEW, ttl)

    async def release(self) -> bool:
        """``alk.release_lock``: free the lock; True if this owner still held it."""
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
