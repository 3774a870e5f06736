"""Lease locks at the SQL level (docs/contract.md#locks, sql/lock.sql),
through alk.* only."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.conftest import pin_clock
from tests.helpers import raises_lk

NOW = 1_700_000_000
BIGINT_MAX = 2**63 - 1
BIGINT_MIN = -(2**63)


@pytest.fixture
def db_now(db: psycopg.Connection) -> psycopg.Connection:
    pin_clock(db, NOW)
    return db


def call(db: psycopg.Connection, function: str, *args: Any) -> Any:
    placeholders = ", ".join(["%s"] * len(args))
    return db.execute(f"SELECT alk.{function}({placeholders})", list(args)).fetchone()[0]  # type: ignore[index]


def lock_row(db: psycopg.Connection, name: str) -> tuple[Any, ...] | None:
    rows = db.execute("SELECT name, owner, acquired_at, expires_at FROM alk.get_lock(%s)", [name]).fetchall()
    assert len(rows) <= 1
    return rows[0] if rows else None


def table(db: psycopg.Connection) -> list[tuple[Any, ...]]:
    return db.execute("SELECT * FROM alk.locks ORDER BY name").fetchall()


# try_lock --------------------------------------------------------------------


def test_a_free_lock_is_taken(db_now: psycopg.Connection) -> None:
    assert lock_row(db_now, "report") is None
    assert call(db_now, "try_lock", "report", "a", 60) is True
    assert lock_row(db_now, "report") == ("report", "a", NOW, NOW + 60)


def test_a_held_lock_refuses_other_owners_and_changes_nothing(db_now: psycopg.Connection) -> None:
    call(db_now, "try_lock", "report", "a", 60)
    pin_clock(db_now, NOW + 59)
    assert call(db_now, "try_lock", "report", "b", 600) is False
    assert lock_row(db_now, "report") == ("report", "a", NOW, NOW + 60)


def test_the_holder_reacquiring_is_a_renew(db_now: psycopg.Connection) -> None:
    call(db_now, "try_lock", "report", "a", 60)
    pin_clock(db_now, NOW + 30)
    assert call(db_now, "try_lock", "report", "a", 10) is True
    # A new full window from now (shorter here), and the holding began at NOW.
    assert lock_row(db_now, "report") == ("report", "a", NOW, NOW + 40)
    # Locks do not count: one release frees it.
    assert call(db_now, "release_lock", "report", "a") is True
    assert call(db_now, "try_lock", "report", "b", 10) is True


def test_an_expired_lock_is_stolen_at_the_exact_expiry_second(db_now: psycopg.Connection) -> None:
    call(db_now, "try_lock", "report", "a", 60)
    pin_clock(db_now, NOW + 59)
    assert call(db_now, "try_lock", "report", "b", 60) is False
    pin_clock(db_now, NOW + 60)  # expires_at <= now
    assert call(db_now, "try_lock", "report", "b", 60) is True
    assert lock_row(db_now, "report") == ("report", "b", NOW + 60, NOW + 120)


def test_the_last_holder_retaking_an_expired_lock_starts_a_new_holding(db_now: psycopg.Connection) -> None:
    call(db_now, "try_lock", "report", "a", 60)
    pin_clock(db_now, NOW + 100)
    assert call(db_now, "try_lock", "report", "a", 60) is True
    assert lock_row(db_now, "report") == ("report", "a", NOW + 100, NOW + 160)


def test_locks_are_independent_by_name(db_now: psycopg.Connection) -> None:
    assert call(db_now, "try_lock", "one", "a", 60) is True
    assert call(db_now, "try_lock", "two", "b", 60) is True
    assert call(db_now, "try_lock", "one", "b", 60) is False


# the duration rule -----------------------------------------------------------


@pytest.mark.parametrize(("ttl", "shown"), [(0, "0"), (-1, "-1"), (BIGINT_MIN, str(BIGINT_MIN)), (None, "NULL")])
def test_non_positive_ttl_is_refused_and_nothing_is_written(
    db_now: psycopg.Connection, ttl: int | None, shown: str
) -> None:
    call(db_now, "try_lock", "held", "a", 60)
    before = table(db_now)
    for function, name in (("try_lock", "free"), ("try_lock", "held"), ("renew_lock", "held")):
        with raises_lk("LK002", f"ttl must be a positive number of seconds, got {shown}"):
            call(db_now, function, name, "a", ttl)
    assert table(db_now) == before


def test_ttl_max_saturates_the_expiry(db_now: psycopg.Connection) -> None:
    assert call(db_now, "try_lock", "forever", "a", BIGINT_MAX) is True
    assert lock_row(db_now, "forever") == ("forever", "a", NOW, BIGINT_MAX)
    assert call(db_now, "renew_lock", "forever", "a", BIGINT_MAX) is True
    assert lock_row(db_now, "forever") == ("forever", "a", NOW, BIGINT_MAX)
    pin_clock(db_now, BIGINT_MAX - 1)
    assert call(db_now, "try_lock", "forever", "b", 1) is False
    pin_clock(db_now, BIGINT_MAX)  # even "forever" ends at the end of time
    assert call(db_now, "try_lock", "forever", "b", 1) is True
    assert lock_row(db_now, "forever") == ("forever", "b", BIGINT_MAX, BIGINT_MAX)


def test_ttl_from_a_negative_clock_is_exact(db: psycopg.Connection) -> None:
    pin_clock(db, BIGINT_MIN)
    assert call(db, "try_lock", "early", "a", BIGINT_MAX) is True
    assert lock_row(db, "early") == ("early", "a", BIGINT_MIN, -1)


# renew -----------------------------------------------------------------------


def test_renew_gives_a_new_full_window_from_now(db_now: psycopg.Connection) -> None:
    call(db_now, "try_lock", "report", "a", 60)
    pin_clock(db_now, NOW + 50)
    assert call(db_now, "renew_lock", "report", "a", 60) is True
    assert lock_row(db_now, "report") == ("report", "a", NOW, NOW + 110)
    pin_clock(db_now, NOW + 109)
    assert call(db_now, "try_lock", "report", "b", 60) is False


def test_renew_after_expiry_succeeds_while_nobody_took_the_lock(db_now: psycopg.Connection) -> None:
    call(db_now, "try_lock", "report", "a", 60)
    pin_clock(db_now, NOW + 500)
    assert call(db_now, "renew_lock", "report", "a", 60) is True
    assert lock_row(db_now, "report") == ("report", "a", NOW, NOW + 560)


def test_the_loser_cannot_renew_or_release(db_now: psycopg.Connection) -> None:
    call(db_now, "try_lock", "report", "a", 60)
    pin_clock(db_now, NOW + 60)
    assert call(db_now, "try_lock", "report", "b", 60) is True
    assert call(db_now, "renew_lock", "report", "a", 60) is False
    assert call(db_now, "release_lock", "report", "a") is False
    assert call(db_now, "try_lock", "report", "a", 60) is False
    assert lock_row(db_now, "report") == ("report", "b", NOW + 60, NOW + 120)


def test_renew_of_a_released_or_never_taken_lock_is_false(db_now: psycopg.Connection) -> None:
    assert call(db_now, "renew_lock", "report", "a", 60) is False
    call(db_now, "try_lock", "report", "a", 60)
    call(db_now, "release_lock", "report", "a")
    assert call(db_now, "renew_lock", "report", "a", 60) is False
    assert table(db_now) == []


# release ---------------------------------------------------------------------


def test_release_is_true_once_and_frees_the_lock(db_now: psycopg.Connection) -> None:
    call(db_now, "try_lock", "report", "a", 60)
    assert call(db_now, "release_lock", "report", "a") is True
    assert call(db_now, "release_lock", "report", "a") is False
    assert lock_row(db_now, "report") is None
    assert call(db_now, "try_lock", "report", "b", 60) is True


def test_release_by_another_owner_leaves_the_lock_alone(db_now: psycopg.Connection) -> None:
    call(db_now, "try_lock", "report", "a", 60)
    assert call(db_now, "release_lock", "report", "b") is False
    assert lock_row(db_now, "report") == ("report", "a", NOW, NOW + 60)


def test_release_of_an_expired_untaken_lock_is_its_owners(db_now: psycopg.Connection) -> None:
    call(db_now, "try_lock", "report", "a", 60)
    pin_clock(db_now, NOW + 61)
    assert call(db_now, "release_lock", "report", "a") is True
    assert table(db_now) == []


# names -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("", "name must be a non-empty name"),
        (None, "got NULL"),
        ("alk:scheduler", "reserved prefix"),
        ("é" * 513, "name must be at most 1024 bytes long, got 1026 bytes"),
    ],
)
def test_public_functions_validate_the_lock_name(db_now: psycopg.Connection, name: str | None, fragment: str) -> None:
    for function, args in (
        ("try_lock", (name, "a", 60)),
        ("renew_lock", (name, "a", 60)),
        ("release_lock", (name, "a")),
    ):
        with raises_lk("LK001", fragment):
            call(db_now, function, *args)
    assert table(db_now) == []


def test_a_name_of_1024_bytes_is_a_lock_name(db_now: psycopg.Connection) -> None:
    assert call(db_now, "try_lock", "é" * 512, "a", 60) is True


@pytest.mark.parametrize(("owner", "fragment"), [("", "owner must be a non-empty name"), (None, "owner")])
def test_the_owner_must_be_non_empty(db_now: psycopg.Connection, owner: str | None, fragment: str) -> None:
    for function, args in (
        ("try_lock", ("l", owner, 60)),
        ("renew_lock", ("l", owner, 60)),
        ("release_lock", ("l", owner)),
    ):
        with raises_lk("LK001", fragment):
            call(db_now, function, *args)
    assert table(db_now) == []


def test_owners_are_identities_and_may_use_the_prefix(db_now: psycopg.Connection) -> None:
    assert call(db_now, "try_lock", "report", "alk:host-a", 60) is True
    assert call(db_now, "release_lock", "report", "alk:host-a") is True


def test_the_name_is_checked_before_the_owner_and_the_ttl(db_now: psycopg.Connection) -> None:
    with raises_lk("LK001", "name"):
        call(db_now, "try_lock", "", "", 0)
    with raises_lk("LK001", "owner"):
        call(db_now, "try_lock", "l", "", 0)


def test_the_internal_forms_admit_reserved_names(db_now: psycopg.Connection) -> None:
    assert call(db_now, "_try_lock", "alk:scheduler", "host-a", 30) is True
    assert call(db_now, "_try_lock", "alk:scheduler", "host-b", 30) is False
    assert lock_row(db_now, "alk:scheduler") == ("alk:scheduler", "host-a", NOW, NOW + 30)
    assert call(db_now, "_renew_lock", "alk:scheduler", "host-a", 45) is True
    assert lock_row(db_now, "alk:scheduler") == ("alk:scheduler", "host-a", NOW, NOW + 45)
    # The public forms cannot touch it.
    with raises_lk("LK001", "reserved prefix"):
        call(db_now, "release_lock", "alk:scheduler", "host-a")
    assert call(db_now, "_release_lock", "alk:scheduler", "host-a") is True
    # The same rules otherwise: empty names and durations.
    with raises_lk("LK001", "name"):
        call(db_now, "_try_lock", "", "host-a", 30)
    with raises_lk("LK002", "ttl"):
        call(db_now, "_try_lock", "alk:scheduler", "host-a", 0)


# get_lock --------------------------------------------------------------------


def test_get_lock_shows_an_expired_lock_until_it_is_taken(db_now: psycopg.Connection) -> None:
    call(db_now, "try_lock", "report", "a", 60)
    pin_clock(db_now, NOW + 60)
    row = db_now.execute("SELECT owner, expires_at <= alk.now() AS expired FROM alk.get_lock('report')").fetchone()
    assert row == ("a", True)
    with raises_lk("LK001", "name"):
        db_now.execute("SELECT * FROM alk.get_lock('')")


def test_get_lock_of_a_free_name_is_no_row_and_a_null_scalar(db_now: psycopg.Connection) -> None:
    for state in ("never taken", "released"):
        assert db_now.execute("SELECT * FROM alk.get_lock('report')").fetchall() == [], state
        assert db_now.execute("SELECT alk.get_lock('report')::text").fetchall() == [], state
        assert db_now.execute("SELECT (SELECT alk.get_lock('report')) IS NOT DISTINCT FROM NULL").fetchone() == (True,)
        call(db_now, "try_lock", "report", "a", 60)
        assert lock_row(db_now, "report") == ("report", "a", NOW, NOW + 60)
        assert call(db_now, "release_lock", "report", "a") is True


# transactions and the catalogue ----------------------------------------------


def test_a_lock_taken_in_a_rolled_back_transaction_was_never_taken(connect: Any) -> None:
    conn = connect(autocommit=False)
    assert call(conn, "try_lock", "report", "a", 60) is True
    conn.rollback()
    assert call(conn, "try_lock", "report", "b", 60) is True
    conn.commit()


LOCK_FUNCTIONS = ["try_lock", "renew_lock", "release_lock", "get_lock"]


def test_public_functions_are_documented_definer_functions_with_a_pinned_path(db: psycopg.Connection) -> None:
    rows = db.execute(
        "SELECT p.proname, p.prosecdef, p.proconfig, obj_description(p.oid, 'pg_proc'), p.proacl"
        " FROM pg_proc p WHERE p.pronamespace = 'alk'::regnamespace AND p.proname = ANY(%s)",
        [LOCK_FUNCTIONS],
    ).fetchall()
    assert sorted(r[0] for r in rows) == sorted(LOCK_FUNCTIONS)
    for name, definer, config, comment, acl in rows:
        assert definer, name
        assert config == ["search_path=pg_catalog, pg_temp"], name
        assert comment and "Example: SELECT" in comment, name
        assert acl is not None and not any(str(entry).startswith("=") for entry in acl), name
