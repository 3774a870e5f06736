"""The values the scheduler calls return: a schedule as ``alk.get_schedule``
reads it, and one job ``alk.tick`` fired. Rows, frozen."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True, slots=True)
class Schedule:
    """One ``alk.schedule`` (columns in the SQL type's order).

    ``tz`` is the zone as stored (``UTC`` when none was given);
    ``next_fire_at`` is None when the schedule never fires again.
    """

    name: str
    spec: str
    queue: str
    priority: int
    max_attempts: int
    expires: int | None
    payload: Any
    tz: str
    next_fire_at: int | None


@dataclass(frozen=True, slots=True)
class Fired:
    """One job ``alk.tick`` enqueued: which schedule, into which queue, for
    which boundary (unix seconds), and the job's id."""

    schedule_name: str
    queue: str
    fire_at: int
    job_id: int


#: The select list that reads an ``alk.schedule`` in :class:`Schedule` field order.
SCHEDULE_COLUMNS = ", ".join(field.name for field in fields(Schedule))


def schedule_from_row(row: tuple[Any, ...]) -> Schedule:
    return Schedule(*row)


def fired_from_row(row: tuple[Any, ...]) -> Fired:
    return Fired(*row)
