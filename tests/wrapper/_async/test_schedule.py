"""The scheduler wrapper: the bindings of every schedule function round-trip
and map the SQL's refusals; ``run_schedules`` fires due schedules while it
leads, stays idle as a standby, hands over on a clean stop or a lapsed lease,
raises LeadershipLost when its lease is taken, and returns at once when its
stop token is cancelled.

The loop under test runs in the foreground; a driver thread watches the
database (with deadlines) and the loop's log records, then acts (cancels a
token, steals the lease). Nothing synchronises by sleeping.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import psycopg
import pytest

import pyalk
from pyalk import (
    AsyncAlk,
    AsyncStopToken,
    CodecError,
    Fired,
    InvalidArgument,
    InvalidName,
    InvalidSchedule,
    LeadershipLost,
    Schedule,
)
from pyalk._async.schedule import SCHEDULER_LOCK
from tests.helpers import until

NOW = 1_700_000_000
DEADLINE = 30.0
APP = "pyalk-schedule-test"
# A stopped loop must return at once, not at the end of its sleep (which the
# tests make 30 s or more): this bound is generous for a loaded machine.
PROMPT = 2.0


# fixtures and helpers ------------------------------------------------------------------


@pytest.fixture
async def conn(dsn: str) -> AsyncIterator[psycopg.AsyncConnection]:
    """One autocommit connection whose clock the test pins."""
    connection = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    await connection.execute("SELECT set_config('alk.now', %s, false)", [str(NOW)])
    yield connection
    await connection.close()


@pytest.fixture
def pinned(conn: psycopg.AsyncConnection) -> AsyncAlk:
    """A client on the pinned connection: the bindings' numbers are exact."""
    return AsyncAlk(conn)


@pytest.fixture
async def alk(dsn: str) -> AsyncIterator[AsyncAlk]:
    """A client on its own pool, on the wall clock (what run_schedules uses)."""
    async with AsyncAlk(f"{dsn} application_name={APP}") as client:
        yield client


class Records(logging.Handler):
    """The scheduler's log records, from every thread, waitable."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.changed = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        with self.changed:
            self.records.append(record)
            self.changed.notify_all()

    def wait_for(self, owner: str, text: str, count: int = 1) -> None:
        def seen() -> bool:
            return sum(getattr(r, "owner", None) == owner and text in r.getMessage() for r in self.records) >= count

        with self.changed:
            if not self.changed.wait_for(seen, DEADLINE):
                raise AssertionError(f"timed out waiting for {owner} to log {text!r} ({count}x)")


@pytest.fixture
def records() -> Iterator[Records]:
    logger = logging.getLogger("pyalk.scheduler")
    handler = Records()
    level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


class Driver:
    """A thread that drives the test while the loop runs in the foreground.
    Whatever happens, it ends by calling ``finally_`` (cancelling the
    foreground loop's token), so a failed wait cannot hang the test."""

    def __init__(self, body: Callable[[], None], finally_: Callable[[], None]) -> None:
        self.errors: list[BaseException] = []

        def run() -> None:
            try:
                body()
            except BaseException as error:  # re-raised by join()
                self.errors.append(error)
            finally:
                finally_()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self) -> None:
        self.thread.join(DEADLINE)
        assert not self.thread.is_alive(), "the driver thread did not finish"
        if self.errors:
            raise self.errors[0]


def holder(db: psycopg.Connection) -> str | None:
    row = db.execute("SELECT owner FROM alk.get_lock(%s)", [SCHEDULER_LOCK]).fetchone()
    return None if row is None else row[0]


def jobs(db: psycopg.Connection, queue: str) -> list[tuple[int, Any]]:
    return db.execute("SELECT id, payload FROM alk.jobs WHERE queue = %s ORDER BY id", [queue]).fetchall()


def server_now(db: psycopg.Connection) -> int:
    return db.execute("SELECT alk.now()").fetchone()[0]  # type: ignore[index]


def seize(db: psycopg.Connection, owner: str, ttl: int) -> int:
    """Take the scheduler's lease by hand (as a crashed leader would have
    left it, or a thief): when it expires."""
    assert db.execute("SELECT alk._try_lock(%s, %s, %s)", [SCHEDULER_LOCK, owner, ttl]).fetchone() == (True,)
    return db.execute("SELECT expires_at FROM alk.get_lock(%s)", [SCHEDULER_LOCK]).fetchone()[0]  # type: ignore[index]


class Background:
    """A second contender: the threaded run_schedules on its own client, in
    a thread (in the async tests too: the two forms share the lease)."""

    def __init__(self, dsn: str, owner: str, **options: Any) -> None:
        self.stop = pyalk.StopToken()
        self.errors: list[BaseException] = []
        self.client = pyalk.Alk(dsn)

        def run() -> None:
            try:
                self.client.schedules.run(self.stop, owner=owner, **options)
            except BaseException as error:
                self.errors.append(error)
            finally:
                self.client.close()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def finish(self) -> None:
        self.stop.cancel()
        self.thread.join(DEADLINE)
        assert not self.thread.is_alive(), "the background loop did not stop"
        if self.errors:
            raise self.errors[0]


# bindings ------------------------------------------------------------------------------


async def test_schedule_get_list_unschedule_round_trip(pinned):
    assert await pinned.schedule("nightly-report", "0 2 * * *", "reports", payload={"kind": "daily"},
                                 tz="Europe/Berlin") == 1_700_010_000
    assert await pinned.schedule("heartbeat", "@every 30s", "pings", priority=5, expires=60) == NOW + 10
    report = await pinned.get_schedule("nightly-report")
    assert report == Schedule(name="nightly-report", spec="0 2 * * *", queue="reports", priority=0, max_attempts=3,
                              expires=None, payload={"kind": "daily"}, tz="Europe/Berlin", next_fire_at=1_700_010_000)
    assert await pinned.get_schedule("heartbeat") == Schedule("heartbeat", "@every 30s", "pings", 5, 3, 60, None,
                                                              "UTC", NOW + 10)
    assert await pinned.get_schedule("nope") is None
    assert [s.name for s in await pinned.list_schedules()] == ["heartbeat", "nightly-report"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.spec = "x"  # type: ignore[misc]

    # Replacing: every option takes the new value.
    assert await pinned.schedule("heartbeat", "@every 30s", "pings", max_attempts=7, payload=[1, "two"]) == NOW + 10
    replaced = await pinned.get_schedule("heartbeat")
    assert replaced is not None and (replaced.priority, replaced.max_attempts, replaced.expires,
                                     replaced.payload) == (0, 7, None, [1, "two"])

    assert await pinned.unschedule("heartbeat") is True
    assert await pinned.unschedule("heartbeat") is False
    assert [s.name for s in await pinned.list_schedules()] == ["nightly-report"]


async def test_tick_fires_due_boundaries(pinned, conn, db):
    await pinned.schedule("heartbeat", "@every 30s", "pings", priority=5, expires=60, payload={"n": 1})
    assert await pinned.tick() == []  # nothing due at NOW
    fired = await pinned.tick(NOW + 100)
    assert fired == [Fired("heartbeat", "pings", at, fired[i].job_id)
                     for i, at in enumerate((NOW + 10, NOW + 40, NOW + 70, NOW + 100))]
    assert all(isinstance(f, Fired) for f in fired)
    assert await pinned.tick(NOW + 100) == []  # the same instant again fires nothing
    rows = db.execute("SELECT id, priority, run_at, expires_at, payload FROM alk.jobs WHERE queue = 'pings' "
                      "ORDER BY id").fetchall()
    assert rows == [(f.job_id, 5, NOW + 100, NOW + 160, {"schedule": "heartbeat", "fire_at": f.fire_at,
                                                          "payload": {"n": 1}}) for f in fired]

    # tick() reads the clock: the pinned session's.
    await conn.execute("SELECT set_config('alk.now', %s, false)", [str(NOW + 130)])
    assert [f.fire_at for f in await pinned.tick()] == [NOW + 130]
    schedule = await pinned.get_schedule("heartbeat")
    assert schedule is not None and schedule.next_fire_at == NOW + 160


async def test_scheduler_tick_leads_fires_and_maps_lk004(pinned, conn, db):
    await pinned.schedule("heartbeat", "@every 30s", "pings")
    await conn.execute("SELECT set_config('alk.now', %s, false)", [str(NOW + 30)])
    fired = await pinned.schedules.scheduler_tick("a", 60)
    assert [(f.schedule_name, f.queue, f.fire_at) for f in fired] == [("heartbeat", "pings", NOW + 10)]
    assert [f.fire_at for f in await pinned.schedules.scheduler_tick("a", 60)] == []
    assert db.execute("SELECT owner, expires_at FROM alk.get_lock('alk:scheduler')").fetchone() == ("a", NOW + 90)
    await conn.execute("SELECT set_config('alk.now', %s, false)", [str(NOW + 60)])
    with pytest.raises(LeadershipLost, match="'a'"):  # the SQL's LK004, naming the holder
        await pinned.schedules.scheduler_tick("b", 60)
    assert db.execute("SELECT count(*) FROM alk.jobs WHERE queue = 'pings'").fetchone() == (1,)  # b fired nothing
    with pytest.raises(InvalidArgument, match="ttl"):
        await pinned.schedules.scheduler_tick("a", 0)


async def test_cron_next(pinned):
    assert await pinned.cron_next("30 9 * * mon-fri", NOW, "Europe/Berlin") == 1_700_037_000
    assert await pinned.cron_next("*/10 * * * * *", NOW) == NOW + 10
    assert await pinned.cron_next("@every 90s", NOW, None) == NOW + 10
    assert await pinned.cron_next("0 0 1 1 *", -(2**63)) == -62_135_596_800
    assert await pinned.cron_next("0 0 1 1 *", 253_402_300_799) is None  # no fire after 9999-12-31


async def test_refusals_map_to_pyalk_errors_and_store_nothing(pinned, db):
    with pytest.raises(InvalidSchedule, match="minute field '61'"):
        await pinned.schedule("s", "61 * * * *", "q")
    with pytest.raises(InvalidSchedule, match="case-sensitive: 'America/New_York'"):
        await pinned.schedule("s", "0 0 * * *", "q", tz="america/new_york")
    with pytest.raises(InvalidSchedule, match="never fires"):
        await pinned.schedule("s", "0 0 30 2 *", "q")
    with pytest.raises(InvalidSchedule):
        await pinned.cron_next("0 0 L * *", NOW)
    with pytest.raises(InvalidSchedule):
        await pinned.cron_next("0 0 * * *", NOW, "UTC+3")
    for name, queue in (("", "q"), ("alk:s", "q"), ("s", "alk:q"), ("s", "")):
        with pytest.raises(InvalidName):
            await pinned.schedule(name, "@hourly", queue)
    with pytest.raises(InvalidName):
        await pinned.get_schedule("")
    with pytest.raises(InvalidName):
        await pinned.unschedule("alk:scheduler")
    with pytest.raises(InvalidArgument, match="priority"):
        await pinned.schedule("s", "@hourly", "q", priority=2**63)  # outside bigint
    with pytest.raises(InvalidArgument, match="expires"):
        await pinned.schedule("s", "@hourly", "q", expires=2**63)
    with pytest.raises(InvalidArgument, match="after"):
        await pinned.cron_next("@hourly", 2**63)
    with pytest.raises(InvalidArgument, match="now"):
        await pinned.tick(1.5)  # type: ignore[arg-type]
    with pytest.raises(CodecError):
        await pinned.schedule("s", "@hourly", "q", payload=float("nan"))
    assert db.execute("SELECT count(*) FROM alk.schedules").fetchone() == (0,)


async def test_transactional_forms_join_the_callers_transaction(alk, dsn, db):
    business = await psycopg.AsyncConnection.connect(dsn)
    try:
        async with business.transaction():
            await alk.schedule("s", "@hourly", "q", conn=business)
            assert [s.name for s in await alk.list_schedules(conn=business)] == ["s"]
            assert db.execute("SELECT count(*) FROM alk.schedules").fetchone() == (0,)  # not committed yet
            raise psycopg.Rollback()
        assert await alk.get_schedule("s") is None
        async with business.transaction():
            await alk.schedule("s", "@hourly", "q", conn=business)
        assert await alk.get_schedule("s", conn=business) is not None
        assert await alk.unschedule("s", conn=business) is True
        assert await alk.tick(conn=business) == []
    finally:
        await business.close()


# run_schedules ---------------------------------------------------------------------------


async def test_run_schedules_fires_a_due_schedule_and_releases_on_stop(alk, db, records):
    await alk.schedule("beat", "@every 1s", "beats", payload="hi")
    stop = AsyncStopToken()
    seen: dict[str, Any] = {}

    def drive() -> None:
        until(lambda: len(jobs(db, "beats")) >= 2, "two fired jobs")
        seen["holder"] = holder(db)
        seen["cancelled_at"] = time.monotonic()

    driver = Driver(drive, stop.cancel)
    await alk.run_schedules(stop, owner="leader", poll_interval=30)
    returned_at = time.monotonic()
    driver.join()
    assert seen["holder"] == "leader"
    assert returned_at - seen["cancelled_at"] < PROMPT
    assert holder(db) is None  # released on a clean stop
    fired = [payload for _, payload in jobs(db, "beats")]
    assert {(p["schedule"], p["payload"]) for p in fired} == {("beat", "hi")}
    boundaries = [p["fire_at"] for p in fired]
    assert boundaries == sorted(set(boundaries))  # each boundary once, in order
    records.wait_for("leader", "lease released")


async def test_a_cancelled_token_returns_before_contending(alk, db):
    stop = AsyncStopToken()
    stop.cancel()
    assert stop.is_cancelled()
    await alk.schedules.run(stop, owner="never")
    assert holder(db) is None


async def test_stop_wakes_a_sleeping_leader_at_once(alk, db, records):
    await alk.schedule("yearly", "0 0 1 1 *", "q")
    stop = AsyncStopToken()
    cancelled: list[float] = []

    def drive() -> None:
        records.wait_for("sleeper", "next wake in")  # asleep: up to poll_interval
        assert holder(db) == "sleeper"
        cancelled.append(time.monotonic())

    driver = Driver(drive, stop.cancel)
    await alk.schedules.run(stop, owner="sleeper", lease_ttl=600, poll_interval=60)
    returned_at = time.monotonic()
    driver.join()
    assert returned_at - cancelled[0] < PROMPT
    assert holder(db) is None
    assert jobs(db, "q") == []


async def test_a_standby_never_ticks_and_stop_wakes_it_at_once(alk, db, records):
    expires_at = seize(db, "crashed", 3600)
    next_fire_at = await alk.schedule("beat", "@every 1s", "beats")
    assert next_fire_at is not None
    # Due before the standby starts: a leader would fire it at once.
    until(lambda: server_now(db) > next_fire_at, "a due boundary")
    stop = AsyncStopToken()
    cancelled: list[float] = []

    def drive() -> None:
        records.wait_for("standby", "standby")  # tried, lost, asleep for poll_interval
        assert jobs(db, "beats") == []
        cancelled.append(time.monotonic())

    driver = Driver(drive, stop.cancel)
    await alk.schedules.run(stop, owner="standby", poll_interval=60)
    returned_at = time.monotonic()
    driver.join()
    assert returned_at - cancelled[0] < PROMPT
    assert jobs(db, "beats") == []
    # The standby left the crashed leader's lease alone.
    assert db.execute("SELECT owner, expires_at FROM alk.get_lock(%s)", [SCHEDULER_LOCK]).fetchone() == (
        "crashed", expires_at)


async def test_a_standby_takes_over_at_once_when_the_leader_stops(alk, db, dsn, records):
    await alk.schedule("beat", "@every 1s", "beats")
    first = Background(dsn, "first", lease_ttl=600, poll_interval=0.2)
    stop = AsyncStopToken()
    seen: dict[str, Any] = {}

    def drive() -> None:
        records.wait_for("second", "standby", count=2)  # the second is waiting
        assert holder(db) == "first"
        first.finish()  # a clean stop releases the lease...
        stopped_at = time.monotonic()
        until(lambda: holder(db) == "second", "the second loop to lead")
        seen["takeover_s"] = time.monotonic() - stopped_at  # ...so no waiting for its 600 s to lapse
        handed_over = server_now(db)
        until(lambda: any(p["fire_at"] > handed_over for _, p in jobs(db, "beats")), "a boundary fired by the second")

    try:
        until(lambda: holder(db) == "first", "the first loop to lead")
        driver = Driver(drive, stop.cancel)
        await alk.schedules.run(stop, owner="second", lease_ttl=600, poll_interval=0.2)
        driver.join()
    finally:
        first.finish()
    assert seen["takeover_s"] < PROMPT
    assert holder(db) is None
    boundaries = [p["fire_at"] for _, p in jobs(db, "beats")]
    assert boundaries == sorted(set(boundaries))  # no boundary twice across the handover


async def test_a_standby_takes_over_when_the_leaders_lease_lapses(alk, db, records):
    expires_at = seize(db, "crashed", 1)  # a leader that died without releasing
    await alk.schedule("beat", "@every 1s", "beats")
    stop = AsyncStopToken()
    seen: dict[str, Any] = {}

    def drive() -> None:
        until(lambda: holder(db) == "heir", "the standby to take over")
        seen["acquired_at"] = db.execute(
            "SELECT acquired_at FROM alk.get_lock(%s)", [SCHEDULER_LOCK]).fetchone()[0]  # type: ignore[index]
        until(lambda: jobs(db, "beats") != [], "a fired job")

    driver = Driver(drive, stop.cancel)
    # poll_interval is long: the standby wakes when the lease runs out.
    await alk.schedules.run(stop, owner="heir", lease_ttl=600, poll_interval=60)
    driver.join()
    assert expires_at <= seen["acquired_at"] <= expires_at + 2
    records.wait_for("heir", "standby")  # it did wait first


async def test_leadership_lost_when_the_lease_is_taken(alk, db, records):
    await alk.schedule("beat", "@every 1s", "beats")
    stop = AsyncStopToken()
    finished = threading.Event()
    seen: dict[str, Any] = {}

    def drive() -> None:
        until(lambda: holder(db) == "victim", "the loop to lead")
        records.wait_for("victim", "fired beat")
        # Take the lease from under it, as an expiry and a new leader would.
        assert db.execute("SELECT alk._release_lock(%s, 'victim')", [SCHEDULER_LOCK]).fetchone() == (True,)
        seize(db, "thief", 600)
        seen["jobs"] = jobs(db, "beats")
        seen["stolen_at"] = time.monotonic()
        # The loop must notice on its own; cancel only if it never does.
        finished.wait(DEADLINE)

    driver = Driver(drive, stop.cancel)
    with pytest.raises(LeadershipLost, match="victim"):
        await alk.schedules.run(stop, owner="victim", lease_ttl=3, poll_interval=30)
    raised_at = time.monotonic()
    finished.set()
    driver.join()
    assert raised_at - seen["stolen_at"] < 1 + PROMPT  # renewed every second (the ticks), at least every ttl/3
    assert holder(db) == "thief"  # not released by the loser
    assert jobs(db, "beats") == seen["jobs"]  # and nothing ticked after the theft


async def test_the_loop_survives_its_connections_being_terminated(alk, db, records):
    await alk.schedule("beat", "@every 1s", "beats")
    stop = AsyncStopToken()

    def drive() -> None:
        records.wait_for("survivor", "fired beat")
        killed = db.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                            "WHERE application_name = %s", [APP]).fetchone()[0]  # type: ignore[index]
        assert killed >= 1
        after = server_now(db)
        until(lambda: any(p["fire_at"] > after for _, p in jobs(db, "beats")), "a boundary fired after the kill")
        # No "database unavailable" is needed: the pool drops a terminated idle
        # connection at checkout (pyalk/_async/pool.py), so the loop never meets it.

    driver = Driver(drive, stop.cancel)
    await alk.schedules.run(stop, owner="survivor", lease_ttl=600, poll_interval=0.5)
    driver.join()
    assert holder(db) is None


async def test_run_schedules_arguments(alk, db):
    stop = AsyncStopToken()
    for bad in (0, -1.0, True, "1"):
        with pytest.raises(InvalidArgument, match="poll_interval"):
            await alk.schedules.run(stop, poll_interval=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="ttl"):
        await alk.schedules.run(stop, lease_ttl=0)  # the server's LK002
    with pytest.raises(InvalidArgument, match="lease_ttl"):
        await alk.schedules.run(stop, lease_ttl=2.5)  # type: ignore[arg-type]
    with pytest.raises(InvalidName):
        await alk.schedules.run(stop, owner="")
    assert holder(db) is None
