"""Lease locks: bindings of alk.try_lock, alk.renew_lock and alk.release_lock.

The rules (free or expired acquires, the holder's re-acquire renews, ttl <= 0
refused, saturating expiry, who may renew and release) are in
sql/versions/0005_lock.sql; this module binds them and adds the context
manager. ``try_lock`` returns None while another owner holds the lock::

    lock = await alk.try_lock("nightly-report", "host-a", ttl=60)
    if lock is None:
        return
    async with lock:
        ...
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyalk import _codec

if TYPE_CHECKING:
    from typing import LiteralString

    from pyalk._async.client import AsyncAlk

# Public functions refuse the reserved alk: prefix; the internal ones accept
# it and are used only by pyalk itself (the scheduler's leader lock).
_TRY = "SELECT alk.try_lock(%(name)s, %(owner)s, %(ttl)s::bigint)"
_RENEW = "SELECT alk.renew_lock(%(name)s, %(owner)s, %(ttl)s::bigint)"
_RELEASE = "SELECT alk.release_lock(%(name)s, %(owner)s)"
_GET = "SELECT owner, expires_at FROM alk.get_lock(%(name)s)"
_TRY_RESERVED = "SELECT alk._try_lock(%(name)s, %(owner)s, %(ttl)s::bigint)"
_RENEW_RESERVED = "SELECT alk._renew_lock(%(name)s, %(owner)s, %(ttl)s::bigint)"
_RELEASE_RESERVED = "SELECT alk._release_lock(%(name)s, %(owner)s)"


async def try_lock(alk: AsyncAlk, name: str, owner: str, ttl: int, *, reserved: bool = False) -> AsyncLock | None:
    """Take ``name`` for ``owner`` for ``ttl`` seconds: the lock, or None
    while another owner holds it.

    ``reserved=True`` admits pyalk's own ``alk:`` names (the scheduler's
    leader lock); applications use :meth:`AsyncAlk.try_lock`.
    """
    lock = AsyncLock(alk, name, owner, reserved=reserved)
    return lock if await lock._call(_TRY_RESERVED if reserved else _TRY, ttl) else None


class AsyncLock:
    """A lock this process took. Holding the object does not prove the lock
    is still held: renew before ``ttl`` runs out and check what it returns.

    As an async context manager it releases the lock on exit.
    """

    def __init__(self, alk: AsyncAlk, name: str, owner: str, *, reserved: bool = False) -> None:
        self._alk = alk
        self.name = _codec.text(name, "name")
        self.owner = _codec.text(owner, "owner")
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
        return bool(await self._alk._value(query, params))

    async def renew(self, ttl: int) -> bool:
        """A new full window: held until now + ``ttl`` seconds. False when the
        lock was lost (released, or expired and taken by another owner)."""
        return await self._call(_RENEW_RESERVED if self._reserved else _RENEW, ttl)

    async def expires_at(self) -> int | None:
        """When this owner's hold ends (unix seconds on ``alk.now()``'s clock;
        at or before now it is expired but not yet taken), or None when the
        lock is no longer this owner's (released, or taken by another owner)."""
        rows = await self._alk._rows(_GET, {"name": self.name})
        owner, expires_at = rows[0]
        return int(expires_at) if owner == self.owner else None

    async def release(self) -> bool:
        """Free the lock; True if this owner still held it."""
        released = await self._call(_RELEASE_RESERVED if self._reserved else _RELEASE)
        self._released = True
        return released
