"""The scheduler's rules (docs/contract.md#scheduler, sql/schedule.sql),
checked through alk.* alone: the cron engine (cron_next), schedules
(schedule, get_schedule, list_schedules, unschedule) and tick.

tests/sql/test_cron_oracle.py holds the differential test against croniter;
the cron cases here are the ones worth reading as documentation."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
from psycopg.types.json import Jsonb
from pytest_postgresql.janitor import DatabaseJanitor

from tests.conftest import Server, pin_clock
from tests.helpers import one, raises_lk

NOW = 1_700_000_000  # 2023-11-14T22:13:20Z
MAX = 2**63 - 1
MIN = -(2**63)
FIRST_INSTANT = -62_135_596_800  # 0001-01-01T00:00:00Z
LAST_INSTANT = 253_402_300_799  # 9999-12-31T23:59:59Z
CAP = 100  # boundaries one tick fires per schedule


def at(local: str, zone: str = "UTC") -> int:
    """Unix seconds of an ISO wall time in a zone (or with its own offset)."""
    parsed = datetime.fromisoformat(local)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=ZoneInfo(zone))
    return int(parsed.timestamp())


def cron_next(db: psycopg.Connection, spec: str | None, after: int | None, tz: str | None = "UTC") -> int | None:
    return one(db, "SELECT alk.cron_next(%s, %s, %s)", spec, after, tz)


def schedule(db: psycopg.Connection, name: str, spec: str, queue: str = "q", **options: Any) -> int | None:
    named = "".join(f", {option} => %({option})s" for option in options)
    row = db.execute(
        f"SELECT alk.schedule(%(name)s, %(spec)s, %(queue)s{named})",
        {"name": name, "spec": spec, "queue": queue, **options},
    ).fetchone()
    assert row is not None
    return row[0]


def get_schedule(db: psycopg.Connection, name: str) -> dict[str, Any] | None:
    cur = db.execute("SELECT * FROM alk.get_schedule(%s)", [name])
    row = cur.fetchone()
    if row is None:
        return None
    assert cur.description is not None
    return dict(zip([c.name for c in cur.description], row, strict=True))


def next_fire(db: psycopg.Connection, name: str) -> int | None:
    found = get_schedule(db, name)
    assert found is not None
    return found["next_fire_at"]


def tick(db: psycopg.Connection, now: int | None = None) -> list[tuple[str, str, int, int]]:
    if now is None:
        return db.execute("SELECT * FROM alk.tick()").fetchall()
    return db.execute("SELECT * FROM alk.tick(%s)", [now]).fetchall()


def fired(rows: list[tuple[str, str, int, int]]) -> list[tuple[str, int]]:
    return [(name, fire_at) for name, _, fire_at, _ in rows]


def job(db: psycopg.Connection, queue: str, job_id: int) -> dict[str, Any]:
    cur = db.execute("SELECT * FROM alk.get_job(%s, %s)", [queue, job_id])
    row = cur.fetchone()
    assert row is not None and cur.description is not None
    return dict(zip([c.name for c in cur.description], row, strict=True))


def job_count(db: psycopg.Connection) -> int:
    return one(db, "SELECT count(*) FROM alk.jobs")


def schedule_count(db: psycopg.Connection) -> int:
    return one(db, "SELECT count(*) FROM alk.list_schedules()")


@pytest.fixture
def clocked(db: psycopg.Connection) -> psycopg.Connection:
    pin_clock(db, NOW)
    return db


@pytest.fixture(scope="module")
def ro(pg_server: Server, template_db: str) -> Iterator[psycopg.Connection]:
    """One database for the module's read-only cron_next cases: a fresh
    database per case would cost more than the cases themselves."""
    params = pg_server.params()
    janitor = DatabaseJanitor(
        user=params.get("user", "postgres"),
        host=params.get("host", "localhost"),
        port=params.get("port", "5432"),
        password=params.get("password"),
        dbname=f"pyalk_cron_{secrets.token_hex(6)}",
        template_dbname=template_db,
    )
    janitor.init()
    try:
        with psycopg.connect(pg_server.dsn_for(janitor.dbname), autocommit=True) as conn:
            yield conn
    finally:
        janitor.drop()


# cron_next: the engine -------------------------------------------------------------

# (spec, after, zone, expected): wall times in the zone unless an offset is given.
EXAMPLES = [
    ("0 0 * * *", "2025-01-01T10:00", "UTC", "2025-01-02T00:00"),
    ("*/15 * * * *", "2025-01-01T10:00", "UTC", "2025-01-01T10:15"),  # strictly after
    ("*/15 * * * *", "2025-01-01T10:07:59", "UTC", "2025-01-01T10:15"),
    ("0 9 * * mon-fri", "2025-03-28T12:00", "Europe/Berlin", "2025-03-31T09:00"),  # over a weekend and a DST change
    ("0 9 * * MON-FRI", "2025-03-28T12:00", "Europe/Berlin", "2025-03-31T09:00"),  # names in any case
    ("30 4 1 jan,Jul *", "2025-02-01T00:00", "UTC", "2025-07-01T04:30"),
    ("0 0 29 2 *", "2025-01-01T00:00", "UTC", "2028-02-29T00:00"),  # leap days only
    ("0 0 13 * fri", "2025-06-01T00:00", "UTC", "2025-06-06T00:00"),  # both day fields: either matches
    ("0 0 13 * fri", "2025-06-07T00:00", "UTC", "2025-06-13T00:00"),
    ("0 0 30 2 mon", "2025-01-01T00:00", "UTC", "2025-02-03T00:00"),  # an impossible day: the weekday decides
    ("0 0 1,15 * */2", "2025-01-01T10:00", "UTC", "2025-01-02T00:00"),  # */2 restricts: Thursday matches
    ("0 0 1-31 * 1", "2025-01-01T10:00", "UTC", "2025-01-02T00:00"),  # every day OR Monday
    ("0 0 * * 7", "2025-06-02T00:00", "UTC", "2025-06-08T00:00"),  # 7 is Sunday too
    ("0 0 * * fri-tue/3", "2025-01-01T10:00", "UTC", "2025-01-03T00:00"),  # a wrapping day range
    ("0 0 * * ?", "2025-06-02T00:00", "UTC", "2025-06-03T00:00"),  # ? is *
    ("*/10 * * * * *", "2025-01-01T10:00:05", "UTC", "2025-01-01T10:00:10"),  # 6 fields: seconds first
    ("0 30 9 * * *", "2025-01-01T09:30:00", "UTC", "2025-01-02T09:30:00"),
    ("@hourly", "2025-01-01T10:00", "UTC", "2025-01-01T11:00"),
    ("@DAILY", "2025-01-01T10:00", "Asia/Kolkata", "2025-01-02T00:00"),
    ("@midnight", "2025-01-01T10:00", "UTC", "2025-01-02T00:00"),
    ("@weekly", "2025-01-01T10:00", "UTC", "2025-01-05T00:00"),  # Sunday
    ("@monthly", "2025-01-01T10:00", "UTC", "2025-02-01T00:00"),
    ("@yearly", "2025-01-01T10:00", "UTC", "2026-01-01T00:00"),
    ("@annually", "2025-01-01T10:00", "UTC", "2026-01-01T00:00"),
    ("  0\t12 * *  *  ", "2025-01-01T10:00", "UTC", "2025-01-01T12:00"),  # any ASCII whitespace
    ("0 12 * * *", "2025-07-01T00:00", "CET", "2025-07-01T12:00"),  # the zone CET, with summer time
    ("0 12 * * *", "2025-07-01T00:00", "Etc/GMT+5", "2025-07-01T12:00"),
    # croniter's own readings, kept: an equal range is the whole field, and a
    # wrapping stepped range restarts one past the modular value.
    ("5-5 * * * *", "2025-01-01T10:00", "UTC", "2025-01-01T10:01"),
    ("50-10/7 * * * *", "2025-01-01T10:00", "UTC", "2025-01-01T10:05"),
    ("59/15 * * * *", "2025-01-01T10:00", "UTC", "2025-01-01T10:59"),
]


@pytest.mark.parametrize(("spec", "after", "zone", "expected"), EXAMPLES)
def test_cron_next_examples(ro: psycopg.Connection, spec: str, after: str, zone: str, expected: str) -> None:
    assert cron_next(ro, spec, at(after, zone), zone) == at(expected, zone)


def test_time_zone_defaults_to_utc(ro: psycopg.Connection) -> None:
    after = at("2025-01-01T10:00")
    assert one(ro, "SELECT alk.cron_next('0 12 * * *', %s)", after) == at("2025-01-01T12:00")
    assert cron_next(ro, "0 12 * * *", after, None) == at("2025-01-01T12:00")


def test_every_fires_at_multiples_of_the_period_since_the_epoch(ro: psycopg.Connection) -> None:
    assert cron_next(ro, "@every 90s", 100) == 180
    assert cron_next(ro, "@every 90s", 180) == 270  # strictly after
    assert cron_next(ro, "@every 90s", -100) == -90
    assert cron_next(ro, "@every 7m", 0) == 420
    assert cron_next(ro, "@EVERY  2H", 1) == 7200
    # Whole days are UTC days whatever the zone: @every measures elapsed time.
    assert cron_next(ro, "@every 1d", at("2025-01-01T10:00"), "America/New_York") == at("2025-01-02T00:00")
    assert cron_next(ro, "@every 3d", 0) == 3 * 86_400


# DST: what croniter does, pinned on known dates (2025) in three zones.


def test_spring_forward_moves_a_skipped_time_to_the_end_of_the_gap(ro: psycopg.Connection) -> None:
    ny, berlin = "America/New_York", "Europe/Berlin"
    # 2025-03-09 02:00 EST becomes 03:00 EDT: 02:30 does not exist that day.
    assert cron_next(ro, "30 2 * * *", at("2025-03-09T00:00", ny), ny) == at("2025-03-09T03:00-04:00")
    assert cron_next(ro, "30 2 * * *", at("2025-03-09T03:00-04:00"), ny) == at("2025-03-10T02:30", ny)
    # A skipped hour fires once, at its end, however many times it matches.
    assert cron_next(ro, "*/30 2 * * *", at("2025-03-09T00:00", ny), ny) == at("2025-03-09T03:00-04:00")
    assert cron_next(ro, "*/30 2 * * *", at("2025-03-09T03:00-04:00"), ny) == at("2025-03-10T02:00", ny)
    # Seconds ride along: the time moves in whole minutes.
    assert cron_next(ro, "15 30 2 * * *", at("2025-03-09T00:00", ny), ny) == at("2025-03-09T03:00:15-04:00")
    # With every hour allowed nothing moves: the next match after the gap.
    assert cron_next(ro, "0 * * * *", at("2025-03-09T01:30", ny), ny) == at("2025-03-09T03:00-04:00")
    assert cron_next(ro, "30 * * * *", at("2025-03-09T01:45", ny), ny) == at("2025-03-09T03:30-04:00")
    # 2025-03-30 02:00 CET becomes 03:00 CEST.
    assert cron_next(ro, "30 2 * * *", at("2025-03-30T00:00", berlin), berlin) == at("2025-03-30T03:00+02:00")
    assert cron_next(ro, "30 2 * * *", at("2025-03-30T03:00+02:00"), berlin) == at("2025-03-31T02:30", berlin)


def test_fall_back_fires_a_repeated_time_in_both_passes(ro: psycopg.Connection) -> None:
    ny, berlin = "America/New_York", "Europe/Berlin"
    # 2025-11-02 02:00 EDT becomes 01:00 EST: 01:00-01:59 happens twice.
    first, second = at("2025-11-02T01:30-04:00"), at("2025-11-02T01:30-05:00")
    assert cron_next(ro, "30 1 * * *", at("2025-11-02T00:00", ny), ny) == first
    assert cron_next(ro, "30 1 * * *", first, ny) == second
    assert cron_next(ro, "30 1 * * *", second, ny) == at("2025-11-03T01:30", ny)
    # Hourly: 01:00 EDT, 01:00 EST, 02:00 EST.
    hours = [at("2025-11-02T01:00-04:00"), at("2025-11-02T01:00-05:00"), at("2025-11-02T02:00-05:00")]
    assert [cron_next(ro, "0 * * * *", t - 1, ny) for t in hours] == hours
    # A time after the repeated hour still happens once.
    assert cron_next(ro, "0 2 * * *", at("2025-11-01T12:00", ny), ny) == at("2025-11-02T02:00-05:00")
    # 2025-10-26 03:00 CEST becomes 02:00 CET.
    first, second = at("2025-10-26T02:30+02:00"), at("2025-10-26T02:30+01:00")
    assert cron_next(ro, "30 2 * * *", at("2025-10-26T00:00", berlin), berlin) == first
    assert cron_next(ro, "30 2 * * *", first, berlin) == second
    assert cron_next(ro, "30 2 * * *", second, berlin) == at("2025-10-27T02:30", berlin)


def test_a_half_hour_dst_zone(ro: psycopg.Connection) -> None:
    lord_howe = "Australia/Lord_Howe"  # +11 in summer, +10:30 in winter
    # 2025-04-06 02:00 +11 becomes 01:30 +10:30: 01:45 happens twice.
    first, second = at("2025-04-06T01:45+11:00"), at("2025-04-06T01:45+10:30")
    assert cron_next(ro, "45 1 * * *", at("2025-04-06T00:00", lord_howe), lord_howe) == first
    assert cron_next(ro, "45 1 * * *", first, lord_howe) == second
    # 2025-10-05 02:00 +10:30 becomes 02:30 +11: 02:10 moves to 02:30.
    assert cron_next(ro, "10 2 * * *", at("2025-10-05T00:00", lord_howe), lord_howe) == at("2025-10-05T02:30+11:00")


def test_cron_next_leaves_the_session_time_zone_alone(db: psycopg.Connection) -> None:
    db.execute("SET TimeZone = 'Asia/Tokyo'")
    cron_next(db, "0 2 * * *", NOW, "America/New_York")
    assert one(db, "SHOW TimeZone") == "Asia/Tokyo"
    with db.transaction():
        cron_next(db, "0 2 * * *", NOW, "Europe/Berlin")
        assert one(db, "SHOW TimeZone") == "Asia/Tokyo"


# cron_next: what it refuses ---------------------------------------------------------

BAD_SPECS = [
    ("", ["is empty"]),
    ("   ", ["is empty"]),
    ("* * * *", ["has 4 fields", "expected 5 fields"]),
    ("* * * * * * *", ["has 7 fields"]),
    ("60 * * * *", ["minute field '60'", "value '60' is out of range 0-59"]),
    ("0 24 * * *", ["hour field '24'", "out of range 0-23"]),
    ("0 0 0 * *", ["day-of-month field '0'", "out of range 1-31"]),
    ("0 0 32 * *", ["day-of-month field '32'", "out of range 1-31"]),
    ("0 0 * 13 *", ["month field '13'", "out of range 1-12"]),
    ("0 0 * * 8", ["day-of-week field '8'", "out of range 0-6"]),
    ("0 0 0-5 * *", ["day-of-month field '0-5'", "value 0"]),
    ("50-70 * * * *", ["minute field '50-70'", "value 70"]),
    ("*/0 * * * *", ["minute field '*/0'", "step 0 must be positive"]),
    ("61 * * * * *", ["second field '61'", "out of range 0-59"]),
    ("0 0 * foo *", ["month field 'foo'", "'foo' is not a number or a month name"]),
    ("0 0 * * monday", ["day-of-week field 'monday'", "'monday' is not a number or a day name"]),
    ("0 0 * * jan", ["day-of-week field 'jan'", "not a number or a day name"]),
    ("x * * * *", ["minute field 'x'", "'x' is not a number"]),
    ("1,,2 * * * *", ["minute field '1,,2'", "empty list element"]),
    ("1-2-3 * * * *", ["minute field '1-2-3'", "'1-2-3' is not a number"]),
    ("-5 * * * *", ["minute field '-5'"]),
    ("? * * * *", ["minute field '?'", "only allowed in day-of-month and day-of-week"]),
    ("0 0 ?,1 * *", ["day-of-month field '?,1'", "must stand alone"]),
    ("0 0 L * *", ["day-of-month field 'L'", "croniter extension"]),
    ("0 0 15W * *", ["day-of-month field '15W'", "croniter extension"]),
    ("0 0 * * 5#2", ["day-of-week field '5#2'", "croniter extension"]),
    ("0 0 * * 5L", ["day-of-week field '5L'", "croniter extension"]),
    ("H * * * *", ["minute field 'H'", "croniter extension"]),
    ("0 0 30 2 *", ["never fires", "day-of-month '30'", "month '2'"]),
    ("0 0 31 apr,jun,sep,nov *", ["never fires"]),
    ("@reboot", ["'@reboot' is not a known macro"]),
    (" @daily", ["has 1 fields"]),
    ("@every", ["@every takes a whole number and a unit"]),
    ("@every 5", ["@every takes a whole number and a unit"]),
    ("@every 5w", ["@every takes a whole number and a unit"]),
    ("@every -5s", ["@every takes a whole number and a unit"]),
    ("@every 0s", ["the @every period must be positive"]),
    ("@every 999999999999999999999d", ["does not fit"]),
]


@pytest.mark.parametrize(("spec", "fragments"), BAD_SPECS, ids=[repr(s) for s, _ in BAD_SPECS])
def test_bad_specs_raise_lk003_naming_the_field_and_value(ro: psycopg.Connection, spec: str, fragments: list[str]):
    with raises_lk("LK003", f"spec {spec!r}" if "'" not in spec else "spec", *fragments):
        cron_next(ro, spec, NOW)


def test_a_null_spec_is_lk003_and_a_null_instant_lk002(ro: psycopg.Connection) -> None:
    with raises_lk("LK003", "spec must be a cron expression, got NULL"):
        cron_next(ro, None, NOW)
    with raises_lk("LK002", "after must not be NULL"):
        cron_next(ro, "* * * * *", None)


def test_a_long_spec_is_shortened_in_the_message(ro: psycopg.Connection) -> None:
    with raises_lk("LK003", "characters)"):
        cron_next(ro, "1," * 500 + "x * * * *", NOW)


BAD_ZONES = [
    ("Mars/Olympus_Mons", "is not a known IANA time zone name"),
    ("", "is not a known IANA time zone name"),
    ("america/new_york", "names are case-sensitive: 'America/New_York'"),
    ("UTC+3", "is a POSIX TZ string"),
    ("<+05>-5", "is a POSIX TZ string"),
    ("EST5", "is a POSIX TZ string"),
    ("5", "not a known IANA time zone name"),
]


@pytest.mark.parametrize(("zone", "fragment"), BAD_ZONES)
def test_bad_zones_raise_lk003(ro: psycopg.Connection, zone: str, fragment: str) -> None:
    with raises_lk("LK003", f"tz {zone!r}", fragment):
        cron_next(ro, "* * * * *", NOW, zone)


def test_zone_names_with_digits_from_the_tz_database_are_fine(ro: psycopg.Connection) -> None:
    for zone in ("EST5EDT", "Etc/GMT-14", "Etc/GMT+12"):
        assert cron_next(ro, "0 0 * * *", NOW, zone) is not None


# cron_next at the edges of time -------------------------------------------------------


def test_extreme_instants_never_overflow(ro: psycopg.Connection) -> None:
    for spec in ("* * * * *", "* * * * * *", "0 0 29 2 *", "@every 1s", "@every 1d", "@yearly"):
        for zone in ("UTC", "America/New_York", "Pacific/Kiritimati"):
            assert cron_next(ro, spec, MAX, zone) is None
            first = cron_next(ro, spec, MIN, zone)
            assert first is not None and first > MIN
    # The calendar runs from 0001-01-01 to 9999-12-31 (UTC), as Python's does:
    # before it, the first fire is the calendar's first match...
    assert cron_next(ro, "0 0 1 1 *", MIN) == FIRST_INSTANT
    assert cron_next(ro, "0 0 1 1 *", MIN, "America/New_York") == FIRST_INSTANT + 17_762  # local mean time, -4:56:02
    # ...and past its last second there is none.
    assert cron_next(ro, "* * * * * *", LAST_INSTANT - 1) == LAST_INSTANT
    assert cron_next(ro, "* * * * * *", LAST_INSTANT) is None
    assert cron_next(ro, "* * * * *", LAST_INSTANT - 59) is None
    assert cron_next(ro, "@every 1s", LAST_INSTANT - 1) == LAST_INSTANT
    assert cron_next(ro, "@every 1s", LAST_INSTANT) is None
    assert cron_next(ro, "@every 1s", MIN) == MIN + 1
    assert cron_next(ro, "0 0 29 2 *", at("9996-03-01T00:00")) is None  # 10000 is past the end


# schedules ------------------------------------------------------------------------------


def test_schedule_registers_and_returns_the_next_fire(clocked: psycopg.Connection) -> None:
    next_at = schedule(clocked, "report", "*/5 * * * *", "reports")
    assert next_at == NOW + 100  # 22:13:20 -> 22:15:00
    assert get_schedule(clocked, "report") == {
        "name": "report",
        "spec": "*/5 * * * *",
        "queue": "reports",
        "priority": 0,
        "max_attempts": 3,
        "expires": None,
        "payload": None,
        "tz": "UTC",
        "next_fire_at": NOW + 100,
    }


def test_schedule_keeps_every_option(clocked: psycopg.Connection) -> None:
    next_at = schedule(
        clocked,
        "nightly",
        "0 2 * * *",
        "reports",
        priority=-7,
        max_attempts=10,
        expires=3600,
        payload=Jsonb({"kind": "daily", "n": [1, 2]}),
        tz="Europe/Berlin",
    )
    assert next_at == at("2023-11-15T02:00", "Europe/Berlin")
    assert get_schedule(clocked, "nightly") == {
        "name": "nightly",
        "spec": "0 2 * * *",
        "queue": "reports",
        "priority": -7,
        "max_attempts": 10,
        "expires": 3600,
        "payload": {"kind": "daily", "n": [1, 2]},
        "tz": "Europe/Berlin",
        "next_fire_at": next_at,
    }


def test_null_options_take_the_defaults(clocked: psycopg.Connection) -> None:
    schedule(clocked, "s", "@hourly", priority=None, max_attempts=None, tz=None)
    found = get_schedule(clocked, "s")
    assert found is not None
    assert (found["priority"], found["max_attempts"], found["tz"]) == (0, 3, "UTC")


def test_get_schedule_of_an_unknown_name_is_no_row_and_a_null_scalar(clocked: psycopg.Connection) -> None:
    # Not a composite of NULL fields: no row at all, in either call form.
    assert clocked.execute("SELECT * FROM alk.get_schedule('nope')").fetchall() == []
    assert clocked.execute("SELECT alk.get_schedule('nope')").fetchall() == []
    assert clocked.execute("SELECT alk.get_schedule('nope')::text").fetchall() == []
    assert one(clocked, "SELECT (SELECT alk.get_schedule('nope')) IS NOT DISTINCT FROM NULL") is True
    schedule(clocked, "s", "@hourly")
    assert clocked.execute("SELECT count(*) FROM alk.get_schedule('s')").fetchone() == (1,)
    assert one(clocked, "SELECT (SELECT alk.get_schedule('s')) IS NOT DISTINCT FROM NULL") is False


def test_every_integer_of_a_schedule_is_bigint(clocked: psycopg.Connection) -> None:
    types = clocked.execute(
        "SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a"
        " JOIN pg_class c ON c.oid = a.attrelid WHERE c.relnamespace = 'alk'::regnamespace"
        " AND c.relname IN ('schedule', 'schedules') AND a.attnum > 0 AND a.atttypid IN ('int2'::regtype,"
        " 'int4'::regtype, 'int8'::regtype)").fetchall()
    assert {(rel, column) for rel, column, _ in types} >= {
        ("schedule", "priority"), ("schedule", "max_attempts"), ("schedules", "priority"),
        ("schedules", "max_attempts")}
    assert {kind for _, _, kind in types} == {"bigint"}
    big = 2**40
    schedule(clocked, "big", "@hourly", priority=big, max_attempts=big)
    found = get_schedule(clocked, "big")
    assert found is not None and (found["priority"], found["max_attempts"]) == (big, big)
    cur = clocked.execute("SELECT priority, max_attempts FROM alk.get_schedule('big')")
    assert [c.type_code for c in cur.description or []] == [20, 20]  # int8: one width for every client


def test_list_schedules_is_in_name_order(clocked: psycopg.Connection) -> None:
    for name in ("b", "c", "a"):
        schedule(clocked, name, "@daily")
    assert [row[0] for row in clocked.execute("SELECT name FROM alk.list_schedules()")] == ["a", "b", "c"]
    assert (
        one(clocked, "SELECT count(*) FROM alk.list_schedules() WHERE next_fire_at = %s", at("2023-11-15T00:00")) == 3
    )


def test_unschedule_removes_and_keeps_the_jobs_already_fired(clocked: psycopg.Connection) -> None:
    schedule(clocked, "s", "* * * * *")
    assert len(tick(clocked, NOW + 60)) == 1
    assert one(clocked, "SELECT alk.unschedule('s')") is True
    assert one(clocked, "SELECT alk.unschedule('s')") is False
    assert get_schedule(clocked, "s") is None
    assert job_count(clocked) == 1
    assert tick(clocked, NOW + 3600) == []


def test_replacing_with_the_same_spec_keeps_the_pending_boundary(clocked: psycopg.Connection) -> None:
    # An application registers its schedules at every start. A boundary that
    # came due before the next tick must still fire.
    first = schedule(clocked, "s", "0 0 * * *", payload=Jsonb(1))
    pin_clock(clocked, first + 30)
    assert schedule(clocked, "s", "@daily", "other", priority=3, payload=Jsonb(2)) == first  # the same spec, parsed
    found = get_schedule(clocked, "s")
    assert found is not None
    assert (found["spec"], found["queue"], found["priority"], found["payload"]) == ("@daily", "other", 3, 2)
    assert fired(tick(clocked)) == [("s", first)]


def test_a_new_spec_or_zone_counts_from_now(clocked: psycopg.Connection) -> None:
    first = schedule(clocked, "s", "0 0 * * *")
    pin_clock(clocked, first + 30)
    assert schedule(clocked, "s", "0 12 * * *") == first + 12 * 3600
    assert schedule(clocked, "s", "0 12 * * *", tz="Asia/Kolkata") == first + 12 * 3600 - 5 * 3600 - 1800
    assert tick(clocked) == []


@pytest.mark.parametrize("name", ["", None, "alk:", "alk:scheduler", "x" * 1025])
def test_empty_and_reserved_schedule_names_are_refused(clocked: psycopg.Connection, name: str | None) -> None:
    for call, args in [
        ("SELECT alk.schedule(%s, '@daily', 'q')", [name]),
        ("SELECT alk.get_schedule(%s)", [name]),
        ("SELECT alk.unschedule(%s)", [name]),
    ]:
        with raises_lk("LK001", "name"):
            clocked.execute(call, args)
    with raises_lk("LK001", "queue"):
        schedule(clocked, "s", "@daily", name)  # type: ignore[arg-type]
    assert schedule_count(clocked) == 0


@pytest.mark.parametrize("name", ["it's", "'; DROP TABLE alk.schedules; --", "расписание 🚀", "x" * 1024, "ALK:upper"])
def test_hostile_names_are_plain_data(clocked: psycopg.Connection, name: str) -> None:
    schedule(clocked, name, "* * * * *", name)
    ((schedule_name, queue, _, job_id),) = tick(clocked, NOW + 60)
    assert (schedule_name, queue) == (name, name)
    assert job(clocked, name, job_id)["payload"]["schedule"] == name
    assert one(clocked, "SELECT alk.unschedule(%s)", name) is True


@pytest.mark.parametrize(
    ("options", "code", "fragment"),
    [
        ({"spec": "61 * * * *"}, "LK003", "minute"),
        ({"tz": "Mars/Base"}, "LK003", "tz"),
    ],
)
def test_a_refused_registration_writes_nothing(
    clocked: psycopg.Connection, options: dict[str, Any], code: str, fragment: str
) -> None:
    options = dict(options)
    schedule(clocked, "s", "@daily", payload=Jsonb("old"))
    before = get_schedule(clocked, "s")
    spec = options.pop("spec", "@hourly")
    with raises_lk(code, fragment):
        schedule(clocked, "s", spec, **options)
    with raises_lk(code, fragment):
        schedule(clocked, "t", spec, **options)
    assert get_schedule(clocked, "s") == before
    assert schedule_count(clocked) == 1


def test_a_schedule_past_the_end_of_the_calendar_never_fires(db: psycopg.Connection) -> None:
    pin_clock(db, MAX)
    assert schedule(db, "s", "* * * * *") is None
    assert tick(db) == []
    # Registering again, in a sane present, recomputes.
    pin_clock(db, NOW)
    assert schedule(db, "s", "* * * * *") == NOW + 40


# tick ----------------------------------------------------------------------------------


def test_tick_fires_each_due_boundary_once(clocked: psycopg.Connection) -> None:
    first = schedule(clocked, "s", "* * * * *")
    assert first == NOW + 40
    assert tick(clocked, first - 1) == []
    assert fired(tick(clocked, first)) == [("s", first)]
    assert tick(clocked, first) == []  # the same instant again: nothing
    assert tick(clocked, first - 30) == []  # an earlier instant: nothing
    assert next_fire(clocked, "s") == first + 60
    assert fired(tick(clocked, first + 60)) == [("s", first + 60)]
    assert job_count(clocked) == 2


def test_tick_reads_the_clock_when_not_given_an_instant(clocked: psycopg.Connection) -> None:
    first = schedule(clocked, "s", "@every 10s")
    assert first == NOW + 10
    pin_clock(clocked, NOW + 25)
    assert fired(tick(clocked)) == [("s", NOW + 10), ("s", NOW + 20)]
    assert fired(clocked.execute("SELECT * FROM alk.tick(NULL)").fetchall()) == []


def test_a_fired_job_carries_its_schedule_and_boundary(clocked: psycopg.Connection) -> None:
    first = schedule(clocked, "s", "* * * * *", "jobs", payload=Jsonb({"k": [1, "x"]}))
    ((name, queue, fire_at, job_id),) = tick(clocked, first + 5)
    assert (name, queue, fire_at) == ("s", "jobs", first)
    found = job(clocked, "jobs", job_id)
    assert found["payload"] == {"schedule": "s", "fire_at": first, "payload": {"k": [1, "x"]}}


def test_fired_jobs_take_plain_queue_stamps_under_the_schedules_options(clocked: psycopg.Connection) -> None:
    first = schedule(clocked, "plain", "* * * * *", "jobs")
    schedule(clocked, "tuned", "* * * * *", "jobs", priority=7, max_attempts=9, expires=600)
    clock = first + 5
    rows = tick(clocked, clock)
    assert fired(rows) == [("plain", first), ("tuned", first)]
    plain, tuned = (job(clocked, "jobs", job_id) for _, _, _, job_id in rows)
    for found in (plain, tuned):
        assert found["state"] == "pending"
        assert (found["run_at"], found["created_at"]) == (clock, clock)  # the tick's instant
        assert (found["visibility_timeout_s"], found["backoff_base_s"], found["dead_letter_retention_s"]) == (
            300,
            5,
            None,
        )
    assert (plain["priority"], plain["max_attempts"], plain["expires_at"]) == (0, 3, None)
    assert (tuned["priority"], tuned["max_attempts"], tuned["expires_at"]) == (7, 9, clock + 600)
    assert plain["payload"] == {"schedule": "plain", "fire_at": first, "payload": None}


def test_fired_jobs_are_claimable_in_boundary_order(clocked: psycopg.Connection) -> None:
    first = schedule(clocked, "s", "* * * * *")
    tick(clocked, first + 300)
    pin_clock(clocked, first + 300)
    claimed = clocked.execute("SELECT payload->>'fire_at' FROM alk.claim('q', 'w', 10)").fetchall()
    assert [int(row[0]) for row in claimed] == [first + 60 * i for i in range(6)]


def test_tick_rows_come_by_schedule_name_then_boundary(clocked: psycopg.Connection) -> None:
    schedule(clocked, "b", "*/2 * * * *")
    schedule(clocked, "a", "* * * * *", "other")
    rows = tick(clocked, NOW + 160)  # 22:16:00
    assert [(name, queue) for name, queue, _, _ in rows] == [("a", "other")] * 3 + [("b", "q")] * 2
    assert [fire_at for _, _, fire_at, _ in rows] == [NOW + 40, NOW + 100, NOW + 160, NOW + 40, NOW + 160]
    ids = [job_id for _, _, _, job_id in rows]
    assert len(set(ids)) == 5


def test_catch_up_is_capped_oldest_first_then_skips_past_now(clocked: psycopg.Connection) -> None:
    first = schedule(clocked, "s", "* * * * *")
    now = first + 249 * 60 + 30  # 250 boundaries are due
    rows = tick(clocked, now)
    assert fired(rows) == [("s", first + 60 * i) for i in range(CAP)]
    assert next_fire(clocked, "s") == first + 250 * 60  # the first boundary after now
    assert tick(clocked, now) == []
    assert job_count(clocked) == CAP


@pytest.mark.parametrize("due", [1, 5, CAP - 1, CAP])
def test_a_backlog_within_the_cap_fires_entirely(clocked: psycopg.Connection, due: int) -> None:
    first = schedule(clocked, "s", "@every 1m")
    now = first + (due - 1) * 60
    assert fired(tick(clocked, now)) == [("s", first + 60 * i) for i in range(due)]
    assert next_fire(clocked, "s") == now + 60


def test_just_over_the_cap_skips_the_rest(clocked: psycopg.Connection) -> None:
    first = schedule(clocked, "s", "@every 1m")
    now = first + CAP * 60  # CAP + 1 boundaries are due
    assert len(tick(clocked, now)) == CAP
    assert next_fire(clocked, "s") == now + 60


def test_the_cap_is_per_schedule(clocked: psycopg.Connection) -> None:
    first = schedule(clocked, "a", "@every 1m")
    schedule(clocked, "b", "@every 1m")
    rows = tick(clocked, first + 500 * 60)
    assert [name for name, _ in fired(rows)] == ["a"] * CAP + ["b"] * CAP


def test_tick_follows_the_schedules_zone_through_fall_back(db: psycopg.Connection) -> None:
    ny = "America/New_York"
    pin_clock(db, at("2025-11-01T12:00", ny))
    schedule(db, "s", "30 1 * * *", tz=ny)
    assert fired(tick(db, at("2025-11-02T12:00", ny))) == [
        ("s", at("2025-11-02T01:30-04:00")),
        ("s", at("2025-11-02T01:30-05:00")),
    ]
    assert next_fire(db, "s") == at("2025-11-03T01:30", ny)


def test_tick_follows_the_schedules_zone_through_spring_forward(db: psycopg.Connection) -> None:
    berlin = "Europe/Berlin"
    pin_clock(db, at("2025-03-29T12:00", berlin))
    schedule(db, "s", "30 2 * * *", tz=berlin)
    assert fired(tick(db, at("2025-03-31T12:00", berlin))) == [
        ("s", at("2025-03-30T03:00+02:00")),
        ("s", at("2025-03-31T02:30+02:00")),
    ]


def test_a_failed_tick_changes_nothing(clocked: psycopg.Connection) -> None:
    first = schedule(clocked, "a", "* * * * *", "fine")
    schedule(clocked, "b", "* * * * *", "boom")
    clocked.execute(
        """
        CREATE FUNCTION public.boom() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'boom'; END $$;
        CREATE TRIGGER boom BEFORE INSERT ON alk.jobs FOR EACH ROW WHEN (NEW.queue = 'boom')
            EXECUTE FUNCTION public.boom();
        """
    )
    # "a" sorts first and fires before "b" fails: its jobs and advance go too.
    with pytest.raises(psycopg.errors.RaiseException, match="boom"):
        tick(clocked, first + 120)
    assert job_count(clocked) == 0
    assert (next_fire(clocked, "a"), next_fire(clocked, "b")) == (first, first)
    clocked.execute("DROP TRIGGER boom ON alk.jobs")
    assert fired(tick(clocked, first + 120)) == [("a", first + 60 * i) for i in range(3)] + [
        ("b", first + 60 * i) for i in range(3)
    ]


def test_a_tick_inside_a_transaction_is_part_of_it(clocked: psycopg.Connection) -> None:
    first = schedule(clocked, "s", "* * * * *")
    with clocked.transaction(force_rollback=True):
        assert len(tick(clocked, first)) == 1
    assert job_count(clocked) == 0
    assert next_fire(clocked, "s") == first
    assert len(tick(clocked, first)) == 1


def test_tick_at_the_edges_of_time(clocked: psycopg.Connection) -> None:
    first = schedule(clocked, "s", "@every 1s")
    assert first == NOW + 1
    # The bigint minimum: nothing is due, nothing moves.
    assert tick(clocked, MIN) == []
    assert next_fire(clocked, "s") == first
    # The bigint maximum: past the calendar, so the capped backlog fires and,
    # with no boundary after now to skip to, the schedule keeps its first
    # unfired boundary instead of being switched off.
    assert fired(tick(clocked, MAX)) == [("s", first + i) for i in range(CAP)]
    assert next_fire(clocked, "s") == first + CAP
    # Ordinary ticks afterwards still fire, from that boundary on.
    assert tick(clocked, first + CAP - 1) == []
    assert fired(tick(clocked, first + CAP + 1)) == [("s", first + CAP), ("s", first + CAP + 1)]
    # Extreme ticks again, in either order, never end it.
    assert len(tick(clocked, MAX)) == CAP
    assert tick(clocked, MIN) == []
    assert next_fire(clocked, "s") == first + 2 * CAP + 2


def test_a_tick_past_the_calendar_on_a_sparse_spec_keeps_it_alive(clocked: psycopg.Connection) -> None:
    first = schedule(clocked, "yearly", "@yearly")
    boundaries = [first]
    for _ in range(CAP):
        boundaries.append(cron_next(clocked, "@yearly", boundaries[-1]))  # type: ignore[arg-type]
    assert fired(tick(clocked, MAX)) == [("yearly", b) for b in boundaries[:CAP]]
    assert next_fire(clocked, "yearly") == boundaries[CAP]


def test_a_spec_that_runs_out_of_calendar_ends_only_at_its_last_boundary(clocked: psycopg.Connection) -> None:
    # A backlog within the cap that reaches the last representable boundary:
    # the spec itself has nothing left, which is the one way to NULL.
    last = at("9999-12-31T00:00")
    pin_clock(clocked, last - 3 * 86400)
    schedule(clocked, "daily", "@daily")
    assert fired(tick(clocked, MAX)) == [("daily", last - 2 * 86400), ("daily", last - 86400), ("daily", last)]
    assert next_fire(clocked, "daily") is None


# scheduler_tick ------------------------------------------------------------------------


def scheduler_tick(db: psycopg.Connection, owner: str | None, ttl: int | None = 30) -> list[tuple[str, str, int, int]]:
    return db.execute("SELECT * FROM alk.scheduler_tick(owner => %s, ttl => %s)", [owner, ttl]).fetchall()


def lease(db: psycopg.Connection) -> tuple[str, int] | None:
    row = db.execute("SELECT owner, expires_at FROM alk.get_lock('alk:scheduler')").fetchone()
    return None if row is None else (row[0], row[1])


def test_scheduler_tick_takes_the_lease_and_fires(clocked: psycopg.Connection) -> None:
    first = schedule(clocked, "s", "@every 10s")
    assert scheduler_tick(clocked, "a") == []
    assert lease(clocked) == ("a", NOW + 30)
    pin_clock(clocked, first + 10)
    rows = scheduler_tick(clocked, "a", 30)
    assert fired(rows) == [("s", first), ("s", first + 10)]
    assert rows == tick_shaped(rows)
    assert lease(clocked) == ("a", first + 40)  # renewed: a new full window from now


def tick_shaped(rows: list[tuple[str, str, int, int]]) -> list[tuple[str, str, int, int]]:
    return [(str(n), str(q), int(f), int(j)) for n, q, f, j in rows]


def test_scheduler_tick_returns_what_tick_returns(clocked: psycopg.Connection) -> None:
    tick_columns = clocked.execute("SELECT * FROM alk.tick(0) LIMIT 0").description
    leader_columns = clocked.execute("SELECT * FROM alk.scheduler_tick('a', 30) LIMIT 0").description
    assert [(c.name, c.type_code) for c in leader_columns or []] == [(c.name, c.type_code) for c in tick_columns or []]


def test_a_second_owner_gets_lk004_and_nothing_fires(clocked: psycopg.Connection) -> None:
    first = schedule(clocked, "s", "* * * * *")
    assert scheduler_tick(clocked, "a", 60) == []
    pin_clock(clocked, first)
    with raises_lk("LK004", "'b'", "alk:scheduler", "'a'", str(NOW + 60)):
        scheduler_tick(clocked, "b")
    assert job_count(clocked) == 0
    assert next_fire(clocked, "s") == first
    assert lease(clocked) == ("a", NOW + 60)
    assert fired(scheduler_tick(clocked, "a")) == [("s", first)]


def test_a_lapsed_lease_hands_over(clocked: psycopg.Connection) -> None:
    first = schedule(clocked, "s", "* * * * *")
    assert scheduler_tick(clocked, "a", 30) == []
    pin_clock(clocked, NOW + 29)
    with raises_lk("LK004"):
        scheduler_tick(clocked, "b", 30)
    pin_clock(clocked, NOW + 30)  # expires_at <= now: free for the taking
    assert scheduler_tick(clocked, "b", 30) == []
    assert lease(clocked) == ("b", NOW + 60)
    pin_clock(clocked, first)
    with raises_lk("LK004", "'a'", "'b'"):
        scheduler_tick(clocked, "a", 30)
    assert fired(scheduler_tick(clocked, "b", 30)) == [("s", first)]
    assert job_count(clocked) == 1


def test_a_released_lease_is_taken_at_once(clocked: psycopg.Connection) -> None:
    scheduler_tick(clocked, "a")
    assert one(clocked, "SELECT alk._release_lock('alk:scheduler', 'a')") is True
    assert scheduler_tick(clocked, "b") == []
    assert lease(clocked) == ("b", NOW + 30)


@pytest.mark.parametrize(("owner", "ttl", "code", "fragment"), [
    (None, 30, "LK001", "owner"), ("", 30, "LK001", "owner"), ("a", 0, "LK002", "ttl"), ("a", -1, "LK002", "ttl"),
    ("a", None, "LK002", "ttl"),
])
def test_scheduler_tick_refuses_bad_arguments_and_writes_nothing(
    clocked: psycopg.Connection, owner: str | None, ttl: int | None, code: str, fragment: str
) -> None:
    first = schedule(clocked, "s", "* * * * *")
    pin_clock(clocked, first)
    with raises_lk(code, fragment):
        scheduler_tick(clocked, owner, ttl)
    assert lease(clocked) is None
    assert job_count(clocked) == 0


def test_a_failed_scheduler_tick_leaves_neither_jobs_nor_lease(clocked: psycopg.Connection) -> None:
    first = schedule(clocked, "s", "* * * * *", "q")
    pin_clock(clocked, first)
    # A trigger that fails the enqueue stands in for any failure in the tick.
    clocked.execute("CREATE FUNCTION pg_temp.boom() RETURNS trigger LANGUAGE plpgsql AS"
                    " $$ BEGIN RAISE EXCEPTION 'boom'; END $$")
    clocked.execute("CREATE TRIGGER boom BEFORE INSERT ON alk.jobs FOR EACH ROW EXECUTE FUNCTION pg_temp.boom()")
    with pytest.raises(psycopg.errors.RaiseException):
        scheduler_tick(clocked, "a")
    clocked.execute("DROP TRIGGER boom ON alk.jobs")
    assert lease(clocked) is None
    assert next_fire(clocked, "s") == first


def test_concurrent_scheduler_ticks_elect_one_leader(connect: Callable[..., psycopg.Connection]) -> None:
    conns = [connect() for _ in range(TICKERS)]
    pin_clock(conns[0], NOW)
    first = schedule(conns[0], "s", "* * * * *")
    for conn in conns:
        pin_clock(conn, first)
    barrier = threading.Barrier(TICKERS)

    def run(index: int) -> str:
        barrier.wait()
        try:
            rows = conns[index].execute("SELECT * FROM alk.scheduler_tick(%s, 30)", [f"owner-{index}"]).fetchall()
        except psycopg.Error as error:
            return error.sqlstate or "?"
        return f"fired {len(rows)}"

    with ThreadPoolExecutor(TICKERS) as pool:
        outcomes = list(pool.map(run, range(TICKERS)))
    assert sorted(outcomes) == ["LK004"] * (TICKERS - 1) + ["fired 1"]
    assert job_count(conns[0]) == 1


# the catalogue ---------------------------------------------------------------------------

SCHEDULE_FUNCTIONS = [
    "cron_next", "schedule", "get_schedule", "unschedule", "list_schedules", "tick", "scheduler_tick"]


def test_public_functions_are_documented_definer_functions_with_a_pinned_path(ro: psycopg.Connection) -> None:
    rows = ro.execute(
        "SELECT p.proname, p.prosecdef, p.proconfig, obj_description(p.oid, 'pg_proc'), p.proacl"
        " FROM pg_proc p WHERE p.pronamespace = 'alk'::regnamespace AND p.proname = ANY(%s)",
        [SCHEDULE_FUNCTIONS],
    ).fetchall()
    assert sorted(r[0] for r in rows) == sorted(SCHEDULE_FUNCTIONS)
    for name, definer, config, comment, acl in rows:
        assert definer, name
        assert config == ["search_path=pg_catalog, pg_temp"], name
        assert comment and "Example: SELECT" in comment, name
        assert acl is not None and not any(str(entry).startswith("=") for entry in acl), name  # no PUBLIC grant


def test_internal_functions_pin_their_path_and_run_as_the_caller(ro: psycopg.Connection) -> None:
    rows = ro.execute(
        "SELECT p.proname, p.prosecdef, p.proconfig, obj_description(p.oid, 'pg_proc')"
        " FROM pg_proc p WHERE p.pronamespace = 'alk'::regnamespace AND p.proname ~ '^_(cron|tick)'"
    ).fetchall()
    assert len(rows) >= 10
    for name, definer, config, comment in rows:
        assert not definer, name
        assert config[0] == "search_path=pg_catalog, pg_temp", name
        assert comment.startswith("internal: "), name


def test_the_parsed_form_and_the_table_stay_private(ro: psycopg.Connection) -> None:
    assert one(ro, "SELECT has_table_privilege('public', 'alk.schedules', 'SELECT')") is False


# concurrency -----------------------------------------------------------------------------

TICKERS = 8


def test_a_tick_skips_schedules_another_tick_holds_without_waiting(connect: Callable[..., psycopg.Connection]) -> None:
    a, b = connect(), connect()
    pin_clock(a, NOW)
    first = schedule(a, "held", "* * * * *")
    schedule(a, "free", "* * * * *")
    with a.transaction():
        # a fires both and holds their rows until it commits.
        assert fired(tick(a, first)) == [("free", first), ("held", first)]
        b.execute("SET lock_timeout = '5s'")  # a wait would fail the test, not hang it
        assert tick(b, first) == []
    assert tick(b, first) == []
    assert job_count(b) == 2


def test_concurrent_ticks_fire_each_boundary_exactly_once(connect: Callable[..., psycopg.Connection]) -> None:
    conns = [connect() for _ in range(TICKERS)]
    pin_clock(conns[0], NOW)
    names = [f"s{i:02d}" for i in range(12)]
    for name in names:
        schedule(conns[0], name, "* * * * *", f"q{name[-1]}")
    first = NOW + 40
    expected: set[tuple[str, int]] = set()
    for round_ in range(6):
        now = first + round_ * 5 * 60 + 60  # every round: 5 or 6 more boundaries per schedule
        for conn in conns:
            pin_clock(conn, now)
        barrier = threading.Barrier(TICKERS)

        def run(conn: psycopg.Connection, barrier: threading.Barrier = barrier) -> list[Any]:
            barrier.wait()
            return conn.execute("SELECT * FROM alk.tick()").fetchall()

        with ThreadPoolExecutor(TICKERS) as pool:
            results = list(pool.map(run, conns))
        pairs = fired([row for result in results for row in result])
        assert len(pairs) == len(set(pairs)), "a boundary fired twice"
        expected |= {(name, t) for name in names for t in range(first, now + 1, 60)}
        assert set(pairs) <= expected
        for name in names:
            assert next_fire(conns[0], name) == first + ((now - first) // 60 + 1) * 60
    jobs = conns[0].execute("SELECT payload->>'schedule', (payload->>'fire_at')::bigint FROM alk.jobs").fetchall()
    assert len(jobs) == len(expected)
    assert set(jobs) == expected
