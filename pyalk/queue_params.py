"""The queue's call parameters as the SQL functions bind them: the enqueue
options (shared with the outbox's enqueue forms), ``after`` ids, and the
array literals settle binds per call. Pure: no connection, no waiting, so
the async and sync queues (and the outbox) share it as it is."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from pyalk import _codec
from pyalk.values import QueueOpts

#: The enqueue options every enqueue form binds, by name: enqueue_params fills them.
ENQUEUE_OPTIONS = """
    delay => %(delay)s::bigint, run_at => %(run_at)s::bigint, priority => %(priority)s::bigint,
    max_attempts => %(max_attempts)s::bigint, expires => %(expires)s::bigint,
    visibility_timeout_s => %(visibility_timeout_s)s::bigint, backoff_base_s => %(backoff_base_s)s::bigint,
    dead_letter_retention_s => %(dead_letter_retention_s)s::bigint"""


def enqueue_params(
    queue: str,
    opts: QueueOpts,
    delay: int | timedelta | None,
    run_at: int | datetime | None,
    priority: int | None,
    max_attempts: int | None,
    expires: int | timedelta | None,
) -> dict[str, Any]:
    """The parameters of ENQUEUE_OPTIONS (and ``queue``): the per-call options,
    then the stamps of ``opts``; the outbox binds its enqueue with them too."""
    return {
        "queue": queue,
        "delay": _codec.seconds(delay, "delay"),
        "run_at": _codec.instant(run_at, "run_at"),
        "priority": _codec.bigint(priority, "priority"),
        "max_attempts": _codec.bigint(max_attempts if max_attempts is not None else opts.max_attempts, "max_attempts"),
        "expires": _codec.seconds(expires, "expires"),
        "visibility_timeout_s": _codec.seconds(opts.visibility_timeout_s, "visibility_timeout_s"),
        "backoff_base_s": _codec.seconds(opts.backoff_base_s, "backoff_base_s"),
        "dead_letter_retention_s": _codec.seconds(opts.dead_letter_retention_s, "dead_letter_retention_s"),
    }


def bigint_array(values: list[int]) -> str:
    """A bigint[] literal; TypeError for anything but ints."""
    return "{" + ",".join(map(int.__repr__, values)) + "}"


#: Elements a text[] literal may hold unquoted (the outcome kinds).
_BARE = frozenset({"ack", "retry", "fail"})


def text_array(values: Sequence[str | None]) -> str:
    """A text[] literal: NULL for None, every other element quoted (backslash
    and double quote escaped) unless it is one of :data:`_BARE`."""
    parts = []
    for value in values:
        if value is None:
            parts.append("NULL")
        elif value in _BARE:
            parts.append(value)
        elif isinstance(value, str):
            parts.append('"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"')
        else:
            raise TypeError(f"expected str or None, got {type(value).__name__}")
    return "{" + ",".join(parts) + "}"


def after_ids(after: Iterable[int] | None) -> list[int | None] | None:
    """``after`` as bigint[] parameters: each id checked as a bigint (a None
    goes through, for the server's LK002 that names it)."""
    return None if after is None else [_codec.bigint(i, "after") for i in after]
