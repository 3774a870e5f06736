"""The scheduler: :class:`AsyncSchedules`, a handle binding alk.schedule
(``add``), alk.get_schedule (``get``), alk.list_schedules (``list``),
alk.unschedule (``remove``), alk.cron_next, alk.tick and alk.scheduler_tick,
and running the leader loop (``run``) that calls ``alk.scheduler_tick`` on
time.

The cron engine, the schedules, the firing and leadership are SQL
(sql/schedule.sql): ``alk.scheduler_tick(owner, ttl)`` takes or renews the
lease ``alk:scheduler`` and ticks in one transaction, and raises LK004 (here
:class:`~pyalk.LeadershipLost`, through the usual error translation) while
another owner holds it. ``run`` adds the one thing SQL cannot do on its own,
calling it on time:

* it sleeps until the earliest ``next_fire_at``, the next renewal
  (``lease_ttl / 3``) or ``poll_interval``, whichever comes first, on the stop
  token, which wakes it at once;
* a standby (its call refused with LK004) retries every ``poll_interval``
  seconds, or when the leader's lease runs out if that is sooner;
* a cancelled token makes it release the lease (a standby takes over on its
  next attempt, without waiting for expiry) and return; LK004 once it led
  is raised as :class:`~pyalk.LeadershipLost`.
"""

from __future__ import annotations

import builtins
import logging
import math
import time
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from pyalk import _codec
from pyalk._async.lock import AsyncLock, default_owner
from pyalk.errors import TRANSIENT_ERRORS, InvalidArgument, LeadershipLost
from pyalk.values import SCHEDULE_COLUMNS, Fired, Schedule, fired_from_row, schedule_from_row

if TYPE_CHECKING:
    from psycopg import AsyncConnection

    from pyalk._async.executor import AsyncExecutor
    from pyalk.stop_token import AsyncStopToken

logger = logging.getLogger("pyalk.scheduler")

#: The leader lease every ``run_schedules`` contends for (a reserved name).
SCHEDULER_LOCK = "alk:scheduler"

_SCHEDULE = """SELECT alk.schedule(
    name => %(name)s, spec => %(spec)s, queue => %(queue)s, priority => %(priority)s::bigint,
    max_attempts => %(max_attempts)s::bigint, expires => %(expires)s::bigint, payload => %(payload)s::jsonb,
    tz => %(tz)s)"""
_GET = "SELECT " + SCHEDULE_COLUMNS + " FROM alk.get_schedule(%(name)s)"
_LIST = "SELECT " + SCHEDULE_COLUMNS + " FROM alk.list_schedules() ORDER BY name"
_UNSCHEDULE = "SELECT alk.unschedule(%(name)s)"
_CRON_NEXT = "SELECT alk.cron_next(spec => %(spec)s, after => %(after)s::bigint, tz => %(tz)s)"
_TICK = "SELECT schedule_name, queue, fire_at, job_id FROM alk.tick(%(now)s::bigint)"
_SCHEDULER_TICK = (
    "SELECT schedule_name, queue, fire_at, job_id FROM alk.scheduler_tick(owner => %(owner)s, ttl => %(ttl)s::bigint)"
)

# The leader loop's statements. The clock pair (alk.now(), the server's wall
# clock) lets a sleep end on the sub-second when the clock is the wall clock,
# and in whole seconds when a session pins alk.now.
_NEXT_DUE = (
    "SELECT min(next_fire_at), alk.now(), extract(epoch FROM clock_timestamp())::float8 FROM alk.list_schedules()"
)
_LEASE = (
    "SELECT l.owner, l.expires_at, alk.now(), extract(epoch FROM clock_timestamp())::float8"
    " FROM alk.get_lock(%(name)s) l"
)


# A boundary still due right after a tick is held by a concurrent tick (FOR
# UPDATE SKIP LOCKED); look again after this pause rather than spin.
_STALLED_PAUSE = 0.5
# The shortest standby pause: a free or lapsed lease is taken on the next try.
_MIN_PAUSE = 0.01


# the handle ------------------------------------------------------------------


class AsyncSchedules:
    """Every schedule of one database; ``alk.schedules``. Holds no connection."""

    def __init__(self, executor: AsyncExecutor) -> None:
        self.executor = executor

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    async def add(
        self,
        name: str,
        spec: str,
        queue: str,
        *,
        priority: int | None = None,
        max_attempts: int | None = None,
        expires: int | timedelta | None = None,
        payload: Any = None,
        tz: str | None = None,
        conn: AsyncConnection | None = None,
    ) -> int | None:
        """``alk.schedule``: register or replace ``name``; the next fire time (None: never)."""
        params = {
            "name": _codec.text(name, "name"),
            "spec": _codec.text(spec, "spec"),
            "queue": _codec.text(queue, "queue"),
            "priority": _codec.bigint(priority, "priority"),
            "max_attempts": _codec.bigint(max_attempts, "max_attempts"),
            "expires": _codec.seconds(expires, "expires"),
            # None is "no payload" (the fired job says "payload": null either way).
            "payload": None if payload is None else _codec.payload(payload),
            "tz": _codec.text(tz, "tz"),
        }
        next_fire_at = await self.executor.value(_SCHEDULE, params, conn=conn, transactional=True)
        return None if next_fire_at is None else int(next_fire_at)

    async def get(self, name: str, *, conn: AsyncConnection | None = None) -> Schedule | None:
        """``alk.get_schedule``: the schedule, or None."""
        row = await self.executor.one(_GET, {"name": _codec.text(name, "name")}, conn=conn, transactional=True)
        return None if row is None else schedule_from_row(row)

    async def list(self, *, conn: AsyncConnection | None = None) -> builtins.list[Schedule]:
        """``alk.list_schedules``: every schedule, by name."""
        return [schedule_from_row(row) for row in await self.executor.rows(_LIST, {}, conn=conn, transactional=True)]

    async def remove(self, name: str, *, conn: AsyncConnection | None = None) -> bool:
        """``alk.unschedule``: True if the schedule existed."""
        params = {"name": _codec.text(name, "name")}
        return bool(await self.executor.value(_UNSCHEDULE, params, conn=conn, transactional=True))

    async def cron_next(self, spec: str, after: int | datetime, tz: str | None = None) -> int | None:
        """``alk.cron_next``: the first fire strictly after ``after`` (None:
        none up to 9999-12-31T23:59:59Z)."""
        params = {
            "spec": _codec.text(spec, "spec"), "after": _codec.instant(after, "after"), "tz": _codec.text(tz, "tz"),
        }
        value = await self.executor.value(_CRON_NEXT, params, transactional=True)
        return None if value is None else int(value)

    async def tick(
        self, now: int | datetime | None = None, *, conn: AsyncConnection | None = None
    ) -> builtins.list[Fired]:
        """``alk.tick``: fire every due schedule (at ``now``, default the
        clock); one :class:`Fired` per job, by schedule name then boundary."""
        rows = await self.executor.rows(_TICK, {"now": _codec.instant(now, "now")}, conn=conn, transactional=True)
        return [fired_from_row(row) for row in rows]

    async def scheduler_tick(self, owner: str, ttl: int) -> builtins.list[Fired]:
        """``alk.scheduler_tick``: take or renew the lease ``alk:scheduler``
        for ``owner`` (``ttl`` seconds) and tick at the clock, in one
        transaction. Raises :class:`~pyalk.LeadershipLost` (LK004), firing
        nothing, while another owner holds the lease."""
        params = {"owner": _codec.text(owner, "owner"), "ttl": _codec.bigint(ttl, "ttl")}
        return [fired_from_row(row) for row in await self.executor.rows(_SCHEDULER_TICK, params)]

    async def run(
        self,
        stop: AsyncStopToken,
        *,
        owner: str | None = None,
        lease_ttl: int | timedelta = 30,
        poll_interval: float = 5.0,
    ) -> None:
        """The leader loop: fire schedules on time while this process leads;
        see :func:`run_schedules`."""
        await run_schedules(self.executor, stop, owner=owner, lease_ttl=lease_ttl, poll_interval=poll_interval)


# the leader loop -------------------------------------------------------------


def _seconds_until(at: int, now: int, wall: float) -> float:
    if math.floor(wall) == now:  # the clock is the wall clock: to the sub-second
        return at - wall
    return float(at - now)  # a pinned clock: whole seconds


async def _due_in(executor: AsyncExecutor) -> float | None:
    """Seconds until the earliest boundary of any schedule (<= 0: due now);
    None when no schedule will fire."""
    rows = await executor.rows(_NEXT_DUE, {})
    at, now, wall = rows[0]
    return None if at is None else _seconds_until(at, now, wall)


async def _standby_pause(executor: AsyncExecutor, owner: str, poll_interval: float) -> float:
    """How long a standby waits before its next attempt: ``poll_interval``,
    or until the leader's lease runs out if that is sooner."""
    rows = await executor.rows(_LEASE, {"name": SCHEDULER_LOCK})
    if not rows:  # released between our attempt and this read
        return _MIN_PAUSE
    holder, expires_at, now, wall = rows[0]
    pause = max(min(poll_interval, _seconds_until(expires_at, now, wall)), _MIN_PAUSE)
    logger.debug("scheduler %s: standby, %s leads until %s; next attempt in %.2fs", owner, holder, expires_at,
                 pause, extra={"owner": owner, "leader": holder})
    return pause


async def run_schedules(
    executor: AsyncExecutor,
    stop: AsyncStopToken,
    *,
    owner: str | None = None,
    lease_ttl: int | timedelta = 30,
    poll_interval: float = 5.0,
) -> None:
    """Fire schedules on time while this process leads; return when ``stop``
    is cancelled.

    One leader at a time holds the lease ``alk:scheduler`` for ``lease_ttl``
    seconds and renews it every ``lease_ttl / 3``; the others wait as
    standbys and take over when it is released (a clean stop) or lapses (a
    crash). ``owner`` names this contender (default ``host:pid:random``);
    give every loop its own. ``poll_interval`` bounds every sleep: how soon a
    standby retries, and how soon a leader notices a schedule registered
    while it sleeps.

    Raises :class:`~pyalk.LeadershipLost` when ``alk.scheduler_tick`` finds
    the lease taken by another owner after this loop led (it paused longer
    than the lease, or someone released it by hand). Connection errors are
    retried with a backoff.
    """
    owner = default_owner() if owner is None else _codec.text(owner, "owner")
    assert owner is not None
    ttl = _codec.seconds(lease_ttl, "lease_ttl")  # the server refuses a ttl <= 0 (LK002) at the first attempt
    if isinstance(poll_interval, bool) or not isinstance(poll_interval, int | float) or not poll_interval > 0:
        raise InvalidArgument(f"poll_interval must be a number of seconds > 0, got {poll_interval!r}")
    assert ttl is not None
    schedules = AsyncSchedules(executor)
    renew_every = ttl / 3
    extra = {"owner": owner}
    leading = False
    lost = False
    failures = 0
    try:
        renew_at = 0.0
        ticked = False
        while not stop.is_cancelled():
            try:
                due = True  # a contender ticks at once when it takes the lease
                if leading:
                    due_in = await _due_in(executor)
                    if ticked and due_in is not None and due_in <= 0:
                        # Still due right after our tick: a concurrent tick holds it.
                        due_in = min(_STALLED_PAUSE, poll_interval)
                    ticked = False
                    due = due_in is not None and due_in <= 0
                    if not due and time.monotonic() < renew_at:
                        failures = 0
                        pause = min(renew_at - time.monotonic(), poll_interval, math.inf if due_in is None else due_in)
                        logger.debug("scheduler %s: leading, next wake in %.2fs", owner, pause, extra=extra)
                        await stop.wait(pause)
                        continue
                started = time.monotonic()
                try:
                    fired = await schedules.scheduler_tick(owner, ttl)
                except LeadershipLost:
                    if leading:  # the SQL's LK004: the lease is someone else's now
                        lost = True
                        raise
                    pause = await _standby_pause(executor, owner, poll_interval)
                    failures = 0
                    await stop.wait(pause)
                    continue
                if not leading:
                    leading = True
                    logger.info("scheduler %s: leading (lease %ds)", owner, ttl, extra=extra)
                renew_at = started + renew_every
                ticked = due
                failures = 0
                for job in fired:
                    logger.info("scheduler %s: fired %s at %d into %s as job %d", owner, job.schedule_name,
                                job.fire_at, job.queue, job.job_id, extra={**extra, "job_id": job.job_id})
            except TRANSIENT_ERRORS as error:
                failures += 1
                pause = min(0.1 * 2 ** min(failures - 1, 10), 5.0, poll_interval, renew_every)
                logger.warning("scheduler %s: database unavailable (%s); trying again in %.1fs", owner,
                               str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__,
                               pause, extra=extra)
                await stop.wait(pause)
    finally:
        if leading and not lost:
            try:
                released = await AsyncLock(executor, SCHEDULER_LOCK, owner, reserved=True).release()
            except Exception as error:  # the lease lapses on its own; report, never mask the exit
                logger.warning("scheduler %s: could not release the lease (%s); it lapses in %ds", owner, error, ttl,
                               extra=extra)
            else:
                logger.info("scheduler %s: stopped, %s", owner,
                            "lease released" if released else "the lease was no longer ours", extra=extra)
