"""alk.cron_next against croniter (docs/contract.md#scheduler: its answers equal
croniter's on the same inputs).

The oracle is ``croniter(spec, datetime_in_zone, second_at_beginning=True)
.get_next(float)`` with croniter's defaults (``day_or=True``). Both sides must
read the same time zone data: Python's zoneinfo and the server each carry a
copy of the tz database, and copies of different releases disagree (Morocco's
rules after 2026, say). So each zone is first compared instant by instant over
the window the tests use, and a zone whose data differ is left out, with the
reason in the skip message when none is left.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from datetime import UTC, datetime
from importlib.metadata import version
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

croniter_module = pytest.importorskip("croniter")
croniter = croniter_module.croniter
if int(version("croniter").split(".")[0]) < 7:  # pragma: no cover - the pinned oracle is croniter 7
    pytest.skip(f"the oracle is croniter 7, found {version('croniter')}", allow_module_level=True)

# The window the tests draw instants from: 1970 up to 2038. Copies of the tz
# database of different releases differ most about the farther future (and
# about the years before 1970), so that is left out.
WINDOW = (0, 2_145_916_800)
ZONES = [
    "UTC",
    "America/New_York",
    "Europe/Berlin",
    "Australia/Lord_Howe",  # DST is 30 minutes
    "Europe/Dublin",  # "negative DST" in the source data
    "America/St_Johns",  # -03:30 / -02:30
    "Pacific/Chatham",  # +12:45 / +13:45
    "Antarctica/Troll",  # a two-hour DST jump
    "America/Sao_Paulo",  # southern hemisphere, DST until 2019
    "Asia/Kolkata",
]
BAD = "refused"


def oracle(spec: str, afters: list[int], zone: str) -> list[int] | str:
    """croniter's next fire after each instant, or BAD when croniter refuses
    the spec (as written, or at the first get_next: a spec that never fires)."""
    if len(spec.split()) == 7:
        # croniter also reads a seventh (year) field; the contract's cron has 5 or 6.
        return BAD
    tz = ZoneInfo(zone)
    try:
        cron = croniter(spec, datetime.fromtimestamp(afters[0], tz), second_at_beginning=True)
        return [int(cron.get_next(float, start_time=datetime.fromtimestamp(after, tz))) for after in afters]
    except (croniter_module.CroniterError, ValueError):
        return BAD


def ours(db: psycopg.Connection, spec: str, afters: list[int], zone: str) -> list[int | None] | str:
    """alk.cron_next for each instant, or BAD when it raises LK003."""
    try:
        rows = db.execute(
            "SELECT alk.cron_next(%s, a, %s) FROM unnest(%s::bigint[]) WITH ORDINALITY AS t(a, i) ORDER BY i",
            [spec, zone, afters],
        ).fetchall()
    except psycopg.Error as error:
        assert error.sqlstate == "LK003", error
        return BAD
    return [row[0] for row in rows]


def engine(db: psycopg.Connection, spec: str, afters: list[int], zone: str) -> list[int | None]:
    """The engine alk.cron_next and alk.tick share, with the spec parsed once
    (alk.cron_next re-parses per call, which the dense grids below need not)."""
    rows = db.execute(
        "SELECT alk._cron_next(p.c, a, %s) FROM (SELECT alk._cron_parse(%s) AS c) p,"
        " unnest(%s::bigint[]) WITH ORDINALITY AS t(a, i) ORDER BY i",
        [zone, spec, afters],
    ).fetchall()
    return [row[0] for row in rows]


# time zone data ------------------------------------------------------------------


def offset(zone: ZoneInfo, instant: int) -> int:
    delta = datetime.fromtimestamp(instant, zone).utcoffset()
    assert delta is not None
    return int(delta.total_seconds())


@functools.cache
def transitions(name: str) -> tuple[int, ...]:
    """Every instant in WINDOW where the zone's UTC offset changes (the first
    second of the new offset), found day by day and then bisected."""
    zone = ZoneInfo(name)
    found: list[int] = []
    day = WINDOW[0]
    before = offset(zone, day)
    while day < WINDOW[1]:
        after = offset(zone, day + 86_400)
        if after != before:
            lo, hi = day, day + 86_400
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if offset(zone, mid) == before:
                    lo = mid
                else:
                    hi = mid
            found.append(hi)
        before = after
        day += 86_400
    return tuple(found)


_agreement: dict[str, str | None] = {}


def disagreement(db: psycopg.Connection, name: str) -> str | None:
    """None when the server's copy of the zone agrees with Python's over
    WINDOW (at and just before every transition, and at monthly samples)."""
    if name not in _agreement:
        zone = ZoneInfo(name)
        probes = sorted({t - d for t in transitions(name) for d in (0, 1)} | set(range(*WINDOW, 86_400 * 30)))
        db.execute("SELECT set_config('TimeZone', %s, true)", [name])
        row = db.execute(
            "SELECT array_agg(date_part('timezone', to_timestamp(u))::bigint ORDER BY i)"
            " FROM unnest(%s::bigint[]) WITH ORDINALITY AS t(u, i)",
            [probes],
        ).fetchone()
        assert row is not None
        server = row[0]
        wrong = [u for u, got in zip(probes, server, strict=True) if got != offset(zone, u)]
        _agreement[name] = (
            None
            if not wrong
            else f"{name}: the server's tz data differ from Python's at {len(wrong)} instants, first at {wrong[0]}"
        )
    return _agreement[name]


@pytest.fixture
def zones(db: psycopg.Connection) -> Iterator[list[str]]:
    # A transaction so the TimeZone probes do not outlive the check.
    with db.transaction(force_rollback=True):
        usable = [name for name in ZONES if disagreement(db, name) is None]
    if len(usable) < 3:
        pytest.skip("; ".join(filter(None, (disagreement(db, name) for name in ZONES))))
    yield usable


# spec strategies -----------------------------------------------------------------

MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]


def cased(word: str) -> st.SearchStrategy[str]:
    return st.sampled_from([word, word.upper(), word.capitalize()])


def values(lo: int, hi: int, names: list[str] | None = None, first: int = 0) -> st.SearchStrategy[str]:
    numbers = st.integers(lo, hi).flatmap(lambda n: st.sampled_from([str(n), f"{n:02d}"]))
    if names is None:
        return numbers
    return st.one_of(numbers, st.sampled_from(names).flatmap(cased))


def steps() -> st.SearchStrategy[str]:
    return st.one_of(st.integers(1, 13).map(str), st.sampled_from(["15", "20", "30", "45", "61", "1000", "10" * 10]))


def field(lo: int, hi: int, names: list[str] | None = None) -> st.SearchStrategy[str]:
    value = values(lo, hi, names)
    element = st.one_of(
        st.just("*"),
        value,
        st.tuples(value, value).map("-".join),
        st.tuples(value, value, steps()).map(lambda t: f"{t[0]}-{t[1]}/{t[2]}"),
        steps().map(lambda s: f"*/{s}"),
        st.tuples(value, steps()).map(lambda t: f"{t[0]}/{t[1]}"),
    )
    return st.lists(element, min_size=1, max_size=3).map(",".join)


def restricted_or_star(strategy: st.SearchStrategy[str], star_weight: int) -> st.SearchStrategy[str]:
    return st.one_of(*([st.just("*")] * star_weight), strategy)


# The hours DST moves are 00:00-04:00 (02:00 mostly): weight them.
HOURS = st.one_of(field(0, 23), field(0, 4), st.sampled_from(["1", "2", "3", "1,2", "2-3", "0-3", "*/2", "1-3/2"]))
SPECS = st.one_of(
    st.tuples(
        field(0, 59),
        HOURS,
        restricted_or_star(field(1, 31), 3),
        restricted_or_star(field(1, 12, MONTHS), 4),
        restricted_or_star(field(0, 7, DAYS), 3),
    ).map(" ".join),
    st.tuples(
        st.one_of(field(0, 59), st.sampled_from(["0", "*", "*/15", "30"])),
        field(0, 59),
        HOURS,
        restricted_or_star(field(1, 31), 4),
        restricted_or_star(field(1, 12, MONTHS), 5),
        restricted_or_star(field(0, 7, DAYS), 4),
    ).map(" ".join),
    st.sampled_from(["@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"]).flatmap(cased),
)


def instants(zone: str) -> st.SearchStrategy[int]:
    """Mostly the hours and the week around a DST transition, else anywhere."""
    anywhere = st.integers(*WINDOW)
    if not transitions(zone):
        return anywhere
    hours = st.tuples(st.sampled_from(transitions(zone)), st.integers(-4 * 3600, 4 * 3600)).map(sum)
    week = st.tuples(st.sampled_from(transitions(zone)), st.integers(-7 * 86_400, 7 * 86_400)).map(sum)
    return st.one_of(hours, hours, week, anywhere)


SLOW_OK = settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@settings(SLOW_OK, max_examples=700)
@given(data=st.data(), spec=SPECS)
def test_cron_next_equals_croniter(db: psycopg.Connection, zones: list[str], data: Any, spec: str) -> None:
    zone = data.draw(st.sampled_from(zones), label="zone")
    afters = data.draw(st.lists(instants(zone), min_size=1, max_size=8), label="afters")
    assert ours(db, spec, afters, zone) == oracle(spec, afters, zone), (spec, zone, afters)


# Six fields put the seconds first (docs/schedule.md, alk.cron_next's
# comment): croniter's second_at_beginning=True. Specs whose two readings
# differ, so the comparison pins which one the engine implements.
SIX_FIELD = [
    "5 10 * * * *", "*/10 * * * * *", "30 0 12 * * mon", "0 */5 * * * *", "15,45 * 3 1 * *", "59 59 23 31 12 *",
]
SIX_FIELD_AFTERS = [0, 1_700_000_000, 1_700_000_005, 1_711_846_800, 2_000_000_000]


def croniter_default(spec: str, after: int) -> int | None:
    """croniter without the flag: a sixth field read as trailing seconds."""
    try:
        return int(croniter(spec, datetime.fromtimestamp(after, UTC)).get_next(float))
    except (croniter_module.CroniterError, ValueError):
        return None


@pytest.mark.parametrize("spec", SIX_FIELD)
def test_six_field_specs_read_the_seconds_first(db: psycopg.Connection, zones: list[str], spec: str) -> None:
    for zone in zones:
        assert ours(db, spec, SIX_FIELD_AFTERS, zone) == oracle(spec, SIX_FIELD_AFTERS, zone), (spec, zone)
    # The other reading gives other answers: the flag is what the engine matches.
    assert ours(db, spec, SIX_FIELD_AFTERS, "UTC") != [croniter_default(spec, a) for a in SIX_FIELD_AFTERS]
    first = ours(db, spec, [0], "UTC")
    assert first != BAD and first[0] is not None
    seconds_field = spec.split()[0]
    assert seconds_field == "*/10" or int(seconds_field.split(",")[0]) == datetime.fromtimestamp(first[0], UTC).second


# Specs from a looser grammar: out-of-range numbers, stray tokens, wrong field
# counts, near-miss macros. Whatever croniter refuses, cron_next refuses
# (LK003); whatever it accepts gets croniter's answer.
JUNK = st.sampled_from(
    ["", "-", "5-", "-5", "*-5", "/5", "5/", "*/", "**", "1-2-3", "*/0", "5/0", "1,,2", "x", "feb", "mon"]
)
LOOSE_FIELD = st.one_of(
    field(0, 59),
    st.integers(0, 70).map(str),
    st.tuples(st.integers(0, 70), st.integers(0, 70)).map(lambda t: f"{t[0]}-{t[1]}"),
    st.tuples(st.integers(0, 70), st.integers(0, 70), steps()).map(lambda t: f"{t[0]}-{t[1]}/{t[2]}"),
    st.tuples(st.integers(0, 70), steps()).map(lambda t: f"{t[0]}/{t[1]}"),
    field(0, 12, MONTHS),
    field(0, 8, DAYS),
    JUNK,
    st.just("?"),
)
LOOSE_SPECS = st.one_of(
    st.lists(LOOSE_FIELD, min_size=3, max_size=7).map(" ".join),
    st.lists(LOOSE_FIELD, min_size=5, max_size=5).map(" ".join),
    st.tuples(st.sampled_from([" ", "  ", "\t", " \n "]), st.lists(LOOSE_FIELD, min_size=5, max_size=6)).map(
        lambda t: t[0] + t[0].join(t[1]) + t[0]
    ),
    st.sampled_from(["@daily", "@weekly", "@reboot", "@every", " @daily", "@daily ", "@DAILY", "@Hourly", "@yearly x"]),
)


@settings(SLOW_OK, max_examples=500)
@given(spec=LOOSE_SPECS, after=st.integers(*WINDOW))
def test_cron_next_refuses_what_croniter_refuses(db: psycopg.Connection, spec: str, after: int) -> None:
    assert ours(db, spec, [after], "UTC") == oracle(spec, [after], "UTC"), spec


# DST transitions, densely --------------------------------------------------------

DST_SPECS = [
    "0 * * * *",
    "*/15 * * * *",
    "* * * * *",
    "30 2 * * *",
    "0 2 * * *",
    "30 1 * * *",
    "0 1-3 * * *",
    "*/20 2 * * *",
    "0 */2 * * *",
    "45 0,1,2,3 * * *",
    "0 0 * * *",
    "15 30 2 * * *",
    "*/30 * 1-2 * * *",
    "0 0 0 * * *",
    "0 2 * * sun",
    "30 2 8-14 3 *",
]


def dst_cases(zones: list[str]) -> Iterator[tuple[str, int]]:
    """The last transition each way per zone in 2016-2026."""
    for zone in zones:
        chosen = [t for t in transitions(zone) if 1_451_606_400 <= t < 1_798_761_600]
        forward = [t for t in chosen if offset(ZoneInfo(zone), t) > offset(ZoneInfo(zone), t - 1)]
        backward = [t for t in chosen if t not in forward]
        for t in forward[-1:] + backward[-1:]:
            yield zone, t


def test_every_instant_around_dst_transitions_matches_croniter(db: psycopg.Connection, zones: list[str]) -> None:
    cases = list(dst_cases(zones))
    assert len({zone for zone, _ in cases}) >= 3, cases
    for zone, t in cases:
        # Every 10 minutes from 3 hours before to 3 hours after, the seconds
        # around the transition itself, and then every answer (so walking
        # from fire to fire is covered too).
        grid = sorted({t + d for d in range(-3 * 3600, 3 * 3600 + 1, 600)} | {t - 61, t - 60, t - 1, t, t + 1, t + 59})
        for spec in DST_SPECS:
            want = oracle(spec, grid, zone)
            assert isinstance(want, list)
            walk = sorted(set(want) - set(grid))
            want_walk = oracle(spec, walk, zone) if walk else []
            assert engine(db, spec, grid + walk, zone) == want + want_walk, (zone, datetime.fromtimestamp(t, UTC), spec)
        # The public function agrees with the engine it wraps.
        assert ours(db, DST_SPECS[0], grid[:5], zone) == engine(db, DST_SPECS[0], grid[:5], zone)
