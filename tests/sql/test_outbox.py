"""The outbox's rules at the SQL level (docs/contract.md#outbox, sql/outbox.sql),
through alk.* only, plus the claim refactor (alk.claim over alk._claim)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.conftest import pin_clock
from tests.helpers import raises_lk

NOW = 1_700_000_000
BACKING = "alk:outbox:billing"


def job(db: psycopg.Connection, job_id: int) -> dict[str, Any] | None:
    """The row as stored (the test role owns the tables)."""
    cursor = db.execute("SELECT * FROM alk.jobs WHERE id = %s", [job_id])
    row = cursor.fetchone()
    if row is None:
        return None
    assert cursor.description is not None
    return dict(zip([c.name for c in cursor.description], row, strict=True))


def count_jobs(db: psycopg.Connection) -> int:
    return db.execute("SELECT count(*) FROM alk.jobs").fetchone()[0]  # type: ignore[index]


@pytest.fixture
def clocked(db: psycopg.Connection) -> psycopg.Connection:
    pin_clock(db, NOW)
    return db


# enqueue ---------------------------------------------------------------------


def test_enqueue_writes_the_backing_queue_with_the_outbox_stamps(clocked: psycopg.Connection) -> None:
    job_id = clocked.execute("SELECT alk.outbox_enqueue('billing', '{\"invoice\": 7}')").fetchone()[0]  # type: ignore[index]
    row = job(clocked, job_id)
    assert row is not None
    assert row["queue"] == BACKING
    assert row["state"] == "pending"
    assert row["payload"] == {"invoice": 7}
    assert (row["visibility_timeout_s"], row["max_attempts"], row["backoff_base_s"]) == (60, 5, 5)
    assert row["dead_letter_retention_s"] is None
    assert (row["run_at"], row["created_at"], row["priority"], row["expires_at"]) == (NOW, NOW, 0, None)


def test_explicit_nulls_take_the_outbox_defaults(clocked: psycopg.Connection) -> None:
    job_id = clocked.execute(
        "SELECT alk.outbox_enqueue('billing', '1', priority => NULL, max_attempts => NULL,"
        " visibility_timeout_s => NULL, backoff_base_s => NULL)"
    ).fetchone()[0]  # type: ignore[index]
    row = job(clocked, job_id)
    assert row is not None
    assert (row["priority"], row["max_attempts"], row["visibility_timeout_s"], row["backoff_base_s"]) == (0, 5, 60, 5)


def test_enqueue_options_resolve_like_the_queue(clocked: psycopg.Connection) -> None:
    job_id = clocked.execute(
        "SELECT alk.outbox_enqueue(outbox => 'billing', payload => '[1]', delay => 30, run_at => 5, priority => 9,"
        " max_attempts => 2, expires => 600, visibility_timeout_s => 7, backoff_base_s => 3,"
        " dead_letter_retention_s => 86400)"
    ).fetchone()[0]  # type: ignore[index]
    row = job(clocked, job_id)
    assert row is not None
    assert row["run_at"] == NOW + 30  # delay wins over run_at
    assert row["expires_at"] == NOW + 600
    assert (row["priority"], row["max_attempts"], row["visibility_timeout_s"]) == (9, 2, 7)
    assert (row["backoff_base_s"], row["dead_letter_retention_s"]) == (3, 86400)


def test_enqueue_saturates_extreme_stamps(clocked: psycopg.Connection) -> None:
    job_id = clocked.execute(
        "SELECT alk.outbox_enqueue('billing', '1', delay => 9223372036854775807, expires => -9223372036854775808)"
    ).fetchone()[0]  # type: ignore[index]
    row = job(clocked, job_id)
    assert row is not None
    assert row["run_at"] == 9223372036854775807
    assert row["expires_at"] == NOW - 9223372036854775808


def test_batch_returns_ids_in_input_order_with_the_outbox_stamps(clocked: psycopg.Connection) -> None:
    ids = [
        r[0]
        for r in clocked.execute(
            "SELECT * FROM alk.outbox_enqueue_batch('billing', ARRAY['1', '\"two\"', 'null']::jsonb[], priority => 3)"
        )
    ]
    assert ids == sorted(ids) and len(ids) == 3
    rows = [job(clocked, i) for i in ids]
    assert [r["payload"] for r in rows if r] == [1, "two", None]
    assert all(r and r["queue"] == BACKING and r["max_attempts"] == 5 and r["priority"] == 3 for r in rows)


def test_empty_batch_enqueues_nothing(clocked: psycopg.Connection) -> None:
    assert clocked.execute("SELECT * FROM alk.outbox_enqueue_batch('billing', ARRAY[]::jsonb[])").fetchall() == []
    assert count_jobs(clocked) == 0


def test_sql_null_payloads_are_refused(clocked: psycopg.Connection) -> None:
    with raises_lk("LK002", "payload"):
        clocked.execute("SELECT alk.outbox_enqueue('billing', NULL)")
    with raises_lk("LK002", "payload 2"):
        clocked.execute("SELECT alk.outbox_enqueue_batch('billing', ARRAY['1', NULL]::jsonb[])")
    assert count_jobs(clocked) == 0


def test_enqueue_is_part_of_the_callers_transaction(connect: Any) -> None:
    conn = connect(autocommit=False)
    conn.execute("SELECT alk.outbox_enqueue('billing', '1')")
    conn.rollback()
    conn.execute("SELECT alk.outbox_enqueue('billing', '2')")
    conn.commit()
    payloads = conn.execute("SELECT payload FROM alk.outbox_claim('billing', 'relay', 10)").fetchall()
    conn.commit()
    assert payloads == [(2,)]


# names -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("outbox", "fragment"),
    [("", "outbox must be a non-empty name"), (None, "got NULL"), ("alk:x", "reserved prefix")],
)
def test_outbox_names_are_validated(clocked: psycopg.Connection, outbox: str | None, fragment: str) -> None:
    for statement in (
        "SELECT alk.outbox_enqueue(%s, '1')",
        "SELECT alk.outbox_enqueue_batch(%s, ARRAY['1']::jsonb[])",
        "SELECT * FROM alk.outbox_claim(%s, 'relay', 1)",
    ):
        with raises_lk("LK001", fragment):
            clocked.execute(statement, [outbox])
    assert count_jobs(clocked) == 0


def test_outbox_names_fit_their_backing_queue(clocked: psycopg.Connection) -> None:
    # Multi-byte characters: the cap is in bytes, what the index stores.
    longest = "é" * 512  # 1024 bytes
    job_id = clocked.execute("SELECT alk.outbox_enqueue(%s, '1')", [longest]).fetchone()[0]  # type: ignore[index]
    row = job(clocked, job_id)
    assert row is not None and row["queue"] == "alk:outbox:" + longest
    assert [r[0] for r in clocked.execute("SELECT id FROM alk.outbox_claim(%s, 'relay', 1)", [longest])] == [job_id]
    with raises_lk("LK001", "outbox must be at most 1024 bytes long, got 1025 bytes"):
        clocked.execute("SELECT alk.outbox_enqueue(%s, '1')", [longest + "x"])
    # Incompressible text far past the cap gets the same clear error, never a
    # raw "index row size" one.
    with raises_lk("LK001", "outbox must be at most 1024 bytes"):
        clocked.execute("SELECT alk.outbox_enqueue(string_agg(md5(i::text), ''), '1') FROM generate_series(1, 200) i")


@pytest.mark.parametrize(
    "statement",
    [
        "SELECT alk.enqueue(%(q)s, '1')",
        "SELECT alk.enqueue_batch(%(q)s, ARRAY['1']::jsonb[])",
        "SELECT * FROM alk.claim(%(q)s, 'w', 1)",
        "SELECT alk.cancel(%(q)s, %(id)s)",
        "SELECT * FROM alk.get_job(%(q)s, %(id)s)",
        "SELECT alk.sweep_expired(%(q)s)",
    ],
)
def test_plain_queue_functions_refuse_the_backing_queue(clocked: psycopg.Connection, statement: str) -> None:
    job_id = clocked.execute("SELECT alk.outbox_enqueue('billing', '1')").fetchone()[0]  # type: ignore[index]
    with raises_lk("LK001", "reserved prefix"):
        clocked.execute(statement, {"q": BACKING, "id": job_id})
    row = job(clocked, job_id)
    assert row is not None and row["state"] == "pending"


def test_outbox_and_queue_of_the_same_name_are_separate(clocked: psycopg.Connection) -> None:
    queued = clocked.execute("SELECT alk.enqueue('billing', '\"queue\"')").fetchone()[0]  # type: ignore[index]
    boxed = clocked.execute("SELECT alk.outbox_enqueue('billing', '\"outbox\"')").fetchone()[0]  # type: ignore[index]
    assert [r[0] for r in clocked.execute("SELECT id FROM alk.outbox_claim('billing', 'w', 10)")] == [boxed]
    assert [r[0] for r in clocked.execute("SELECT id FROM alk.claim('billing', 'w', 10)")] == [queued]


# claim -----------------------------------------------------------------------


def test_claim_leases_in_claim_order_with_the_outbox_visibility(clocked: psycopg.Connection) -> None:
    low = clocked.execute("SELECT alk.outbox_enqueue('billing', '1')").fetchone()[0]  # type: ignore[index]
    high = clocked.execute("SELECT alk.outbox_enqueue('billing', '2', priority => 5)").fetchone()[0]  # type: ignore[index]
    later = clocked.execute("SELECT alk.outbox_enqueue('billing', '3', delay => 1)").fetchone()[0]  # type: ignore[index]
    rows = clocked.execute(
        "SELECT id, queue, state, worker_id, attempts, claimed_at, claim_expires_at"
        " FROM alk.outbox_claim('billing', 'relay-1', 10)"
    ).fetchall()
    assert rows == [
        (high, BACKING, "processing", "relay-1", 1, NOW, NOW + 60),
        (low, BACKING, "processing", "relay-1", 1, NOW, NOW + 60),
    ]
    row = job(clocked, later)
    assert row is not None and row["state"] == "pending"


@pytest.mark.parametrize("n", [0, -1, -9223372036854775808, None])
def test_claim_extent_non_positive_claims_nothing(clocked: psycopg.Connection, n: int | None) -> None:
    clocked.execute("SELECT alk.outbox_enqueue('billing', '1')")
    assert clocked.execute("SELECT * FROM alk.outbox_claim('billing', 'relay', %s)", [n]).fetchall() == []


def test_claim_refuses_an_empty_worker_id(clocked: psycopg.Connection) -> None:
    with raises_lk("LK001", "worker_id"):
        clocked.execute("SELECT * FROM alk.outbox_claim('billing', '', 1)")


def test_a_lapsed_lease_is_claimed_again_and_fences_the_old_claim(clocked: psycopg.Connection) -> None:
    job_id = clocked.execute("SELECT alk.outbox_enqueue('billing', '1')").fetchone()[0]  # type: ignore[index]
    assert clocked.execute("SELECT attempts FROM alk.outbox_claim('billing', 'relay', 1)").fetchall() == [(1,)]
    pin_clock(clocked, NOW + 60)  # lease ends at NOW + 60: still valid, not claimable
    assert clocked.execute("SELECT * FROM alk.outbox_claim('billing', 'relay', 1)").fetchall() == []
    pin_clock(clocked, NOW + 61)
    assert clocked.execute("SELECT attempts FROM alk.outbox_claim('billing', 'relay', 1)").fetchall() == [(2,)]
    assert clocked.execute("SELECT alk.ack(%s, 'relay', 1)", [job_id]).fetchone() == (False,)
    assert clocked.execute("SELECT alk.ack(%s, 'relay', 2)", [job_id]).fetchone() == (True,)
    assert job(clocked, job_id) is None


def test_claim_buries_exhausted_and_expired_messages(clocked: psycopg.Connection) -> None:
    spent = clocked.execute("SELECT alk.outbox_enqueue('billing', '1', max_attempts => 0)").fetchone()[0]  # type: ignore[index]
    stale = clocked.execute("SELECT alk.outbox_enqueue('billing', '2', expires => 0)").fetchone()[0]  # type: ignore[index]
    good = clocked.execute("SELECT alk.outbox_enqueue('billing', '3')").fetchone()[0]  # type: ignore[index]
    assert [r[0] for r in clocked.execute("SELECT id FROM alk.outbox_claim('billing', 'relay', 1)")] == [good]
    for job_id, error in ((spent, "max attempts exceeded"), (stale, "expired")):
        row = job(clocked, job_id)
        assert row is not None
        assert (row["state"], row["last_error"], row["died_at"]) == ("dead", error, NOW)


def test_a_failing_message_backs_off_5_10_20_40_then_dies(clocked: psycopg.Connection) -> None:
    job_id = clocked.execute("SELECT alk.outbox_enqueue('billing', '1')").fetchone()[0]  # type: ignore[index]
    now = NOW
    for attempt, backoff in enumerate([5, 10, 20, 40], start=1):
        pin_clock(clocked, now)
        assert clocked.execute("SELECT attempts FROM alk.outbox_claim('billing', 'relay', 1)").fetchall() == [
            (attempt,)
        ]
        assert clocked.execute("SELECT alk.retry(%s, 'relay', %s, 'smtp down')", [job_id, attempt]).fetchone() == (
            True,
        )
        row = job(clocked, job_id)
        assert row is not None
        assert (row["state"], row["run_at"], row["last_error"]) == ("pending", now + backoff, None)
        pin_clock(clocked, now + backoff - 1)
        assert clocked.execute("SELECT * FROM alk.outbox_claim('billing', 'relay', 1)").fetchall() == []
        now += backoff
    pin_clock(clocked, now)
    assert clocked.execute("SELECT attempts FROM alk.outbox_claim('billing', 'relay', 1)").fetchall() == [(5,)]
    assert clocked.execute("SELECT alk.retry(%s, 'relay', 5, 'smtp down')", [job_id]).fetchone() == (True,)
    row = job(clocked, job_id)
    assert row is not None
    assert (row["state"], row["last_error"], row["died_at"], row["attempts"]) == ("dead", "smtp down", now, 5)


# inspection and upkeep -------------------------------------------------------


def test_get_job_shows_a_message_in_any_state(clocked: psycopg.Connection) -> None:
    job_id = clocked.execute("SELECT alk.outbox_enqueue('billing', '1', max_attempts => 1)").fetchone()[0]  # type: ignore[index]
    row = clocked.execute("SELECT id, queue, state FROM alk.outbox_get_job('billing', %s)", [job_id]).fetchone()
    assert row == (job_id, BACKING, "pending")
    clocked.execute("SELECT alk.retry(id, 'relay', attempts, 'gone wrong') FROM alk.outbox_claim('billing', 'relay')")
    row = clocked.execute("SELECT state, last_error FROM alk.outbox_get_job('billing', %s)", [job_id]).fetchone()
    assert row == ("dead", "gone wrong")
    # Another outbox's id, a delivered or a missing one: no row.
    assert clocked.execute("SELECT id FROM alk.outbox_get_job('other', %s)", [job_id]).fetchone() is None
    assert clocked.execute("SELECT id FROM alk.outbox_get_job('billing', -1)").fetchone() is None
    assert clocked.execute("SELECT (SELECT alk.outbox_get_job('billing', -1)) IS NULL").fetchone() == (True,)
    with raises_lk("LK001", "outbox"):
        clocked.execute("SELECT * FROM alk.outbox_get_job('', 1)")


def test_sweep_buries_expired_messages_and_purges_dead_ones_past_retention(clocked: psycopg.Connection) -> None:
    expiring = clocked.execute("SELECT alk.outbox_enqueue('billing', '1', expires => 10)").fetchone()[0]  # type: ignore[index]
    kept = clocked.execute("SELECT alk.outbox_enqueue('billing', '2')").fetchone()[0]  # type: ignore[index]
    other = clocked.execute("SELECT alk.outbox_enqueue('other', '3', expires => 10)").fetchone()[0]  # type: ignore[index]
    clocked.execute("UPDATE alk.jobs SET dead_letter_retention_s = 100 WHERE id = %s", [expiring])
    pin_clock(clocked, NOW + 10)
    assert clocked.execute("SELECT alk.outbox_sweep_expired('billing')").fetchone() == (1,)
    row = job(clocked, expiring)
    assert row is not None and (row["state"], row["last_error"], row["died_at"]) == ("dead", "expired", NOW + 10)
    pin_clock(clocked, NOW + 109)
    assert clocked.execute("SELECT alk.outbox_sweep_expired('billing')").fetchone() == (0,)
    pin_clock(clocked, NOW + 110)
    assert clocked.execute("SELECT alk.outbox_sweep_expired('billing')").fetchone() == (1,)
    assert job(clocked, expiring) is None
    assert job(clocked, kept) is not None
    other_row = job(clocked, other)
    assert other_row is not None and other_row["state"] == "pending"  # another outbox is left alone
    with raises_lk("LK001", "reserved prefix"):
        clocked.execute("SELECT alk.outbox_sweep_expired('alk:outbox:billing')")


# the claim, get_job and sweep refactor ---------------------------------------


@pytest.mark.parametrize(
    ("function", "signature", "implementation", "comment"),
    [
        ("claim(text, text, bigint)", "queue text, worker_id text, n bigint DEFAULT 1", "alk._claim(",
         "Claim up to n due jobs"),
        ("outbox_claim(text, text, bigint)", "outbox text, worker_id text, n bigint DEFAULT 1", "alk._claim(",
         "Claim up to n due messages"),
        ("get_job(text, bigint)", "queue text, job_id bigint", "alk._get_job(", "The whole job row"),
        ("outbox_get_job(text, bigint)", "outbox text, job_id bigint", "alk._get_job(", "The whole row"),
        ("sweep_expired(text)", "queue text", "alk._sweep_expired(", "Bury expired waiting jobs"),
        ("outbox_sweep_expired(text)", "outbox text", "alk._sweep_expired(", "alk.sweep_expired for an outbox"),
    ],
)
def test_each_shared_rule_has_one_implementation_behind_thin_wrappers(
    db: psycopg.Connection, function: str, signature: str, implementation: str, comment: str
) -> None:
    row = db.execute(
        "SELECT l.lanname, p.prosrc, pg_get_function_arguments(p.oid), obj_description(p.oid, 'pg_proc')"
        " FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang WHERE p.oid = %s::regprocedure",
        [f"alk.{function}"],
    ).fetchone()
    assert row is not None
    language, source, arguments, documentation = row
    assert language in ("sql", "plpgsql") and implementation in source
    assert "alk.jobs" not in source  # the rule is not written twice
    # 0002's signatures, defaults and documentation still stand.
    assert arguments == signature
    assert documentation.startswith(comment)


def test_plain_claim_keeps_its_behaviour(clocked: psycopg.Connection) -> None:
    first = clocked.execute("SELECT alk.enqueue('emails', '1')").fetchone()[0]  # type: ignore[index]
    second = clocked.execute("SELECT alk.enqueue('emails', '2', priority => 1)").fetchone()[0]  # type: ignore[index]
    spent = clocked.execute("SELECT alk.enqueue('emails', '3', max_attempts => 0, priority => 2)").fetchone()[0]  # type: ignore[index]
    rows = clocked.execute("SELECT id, attempts, claim_expires_at FROM alk.claim('emails', 'w')").fetchall()
    assert rows == [(second, 1, NOW + 300)]  # n defaults to 1; the spent job is buried on the way
    assert clocked.execute("SELECT id FROM alk.claim('emails', 'w', 5)").fetchall() == [(first,)]
    row = job(clocked, spent)
    assert row is not None and row["last_error"] == "max attempts exceeded"
    with raises_lk("LK001", "queue"):
        clocked.execute("SELECT * FROM alk.claim('', 'w', 1)")
    with raises_lk("LK001", "worker_id"):
        clocked.execute("SELECT * FROM alk.claim('emails', NULL, 1)")


# the catalogue ---------------------------------------------------------------

OUTBOX_FUNCTIONS = ["outbox_enqueue", "outbox_enqueue_batch", "outbox_claim", "outbox_get_job", "outbox_sweep_expired"]


def test_public_functions_are_documented_definer_functions_with_a_pinned_path(db: psycopg.Connection) -> None:
    rows = db.execute(
        "SELECT p.proname, p.prosecdef, p.proconfig, obj_description(p.oid, 'pg_proc'), p.proacl"
        " FROM pg_proc p WHERE p.pronamespace = 'alk'::regnamespace AND p.proname = ANY(%s)",
        [[*OUTBOX_FUNCTIONS, "claim", "get_job", "sweep_expired"]],
    ).fetchall()
    assert sorted(r[0] for r in rows) == sorted([*OUTBOX_FUNCTIONS, "claim", "get_job", "sweep_expired"])
    for name, definer, config, comment, acl in rows:
        assert definer, name
        assert config == ["search_path=pg_catalog, pg_temp"], name
        assert comment and "Example: " in comment, name
        assert acl is not None and not any(str(entry).startswith("=") for entry in acl), name  # no PUBLIC grant
