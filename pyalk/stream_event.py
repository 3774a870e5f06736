"""The event value every stream read returns: the row, frozen."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One row of ``alk.stream_event``, in the SQL type's column order.

    ``offset`` is the SQL column ``event_offset`` (``OFFSET`` is a keyword in
    SQL): per stream, from 1, commit ordered, never reused.
    """

    stream: str
    offset: int
    key: str | None
    payload: Any
    created_at: int


#: The select list that reads an ``alk.stream_event`` in :class:`StreamEvent` field order.
STREAM_EVENT_COLUMNS = "stream, event_offset, key, payload, created_at"


def stream_event_from_row(row: tuple[Any, ...]) -> StreamEvent:
    return StreamEvent(*row)
