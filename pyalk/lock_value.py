"""The value ``alk.get_lock`` returns: a lease lock as stored. Frozen."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: The columns of alk.get_lock, in LockInfo's field order.
LOCK_COLUMNS = "name, owner, acquired_at, expires_at"


@dataclass(frozen=True, slots=True)
class LockInfo:
    """A lock's row: who holds it since when, until when (unix seconds on
    ``alk.now()``'s clock; at or before now it is expired but not yet taken)."""

    name: str
    owner: str
    acquired_at: int
    expires_at: int


def lock_info_from_row(row: tuple[Any, ...]) -> LockInfo | None:
    """None for the all-NULL row of a lock nobody holds."""
    name, owner, acquired_at, expires_at = row
    return None if name is None else LockInfo(name, owner, int(acquired_at), int(expires_at))
