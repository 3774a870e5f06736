"""The queue's rules (docs/contract.md#ground-rules, #queue), checked through alk.* alone."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import pin_clock
from tests.helpers import one, sqlstate_of

NOW = 1_700_000_000
MAX = 2**63 - 1
MIN = -(2**63)


def job(db: psycopg.Connection, job_id: int, queue: str = "q") -> dict[str, Any] | None:
    cur = db.execute("SELECT * FROM alk.get_job(%s, %s) WHERE id IS NOT NULL", [queue, job_id])
    row = cur.fetchone()
    if row is None:
        return None
    assert cur.description is not None
    return dict(zip([c.name for c in cur.description], row, strict=True))


def enqueue(db: psycopg.Connection, queue: str = "q", payload: str = "{}", **options: Any) -> int:
    named = "".join(f", {name} => %({name})s" for name in options)
    return one(
        db, f"SELECT alk.enqueue(%(queue)s, %(payload)s::jsonb{named})", queue=queue, payload=payload, **options
    )


def claim(db: psycopg.Connection, n: int | None = 1, worker: str = "w1", queue: str = "q") -> list[dict[str, Any]]:
    cur = db.execute("SELECT * FROM alk.claim(%s, %s, %s)", [queue, worker, n])
    assert cur.description is not None
    names = [c.name for c in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def count_jobs(db: psycopg.Connection) -> int:
    return one(db, "SELECT count(*) FROM alk.jobs")


@pytest.fixture
def clocked(db: psycopg.Connection) -> psycopg.Connection:
    pin_clock(db, NOW)
    return db


# clock -----------------------------------------------------------------------


def test_clock_is_pinned_by_session_setting_and_unpinned_by_reset(db):
    pin_clock(db, 42)
    assert one(db, "SELECT alk.now()") == 42
    db.execute("RESET alk.now")
    wall = one(db, "SELECT extract(epoch FROM clock_timestamp())::bigint")
    assert abs(one(db, "SELECT alk.now()") - wall) <= 2


@pytest.mark.parametrize("setting", ["abc", "1.5", "99999999999999999999"])
def test_clock_setting_that_is_not_an_integer_is_an_error(db, setting):
    db.execute("SELECT set_config('alk.now', %s, false)", [setting])
    code, message = sqlstate_of(db, "SELECT alk.now()")
    assert code == "LK002"
    assert "alk.now" in message


def test_one_clock_read_per_call(db):
    # With the wall clock, every stamp an enqueue writes is the same instant.
    job_id = enqueue(db, expires=0, delay=0)
    row = job(db, job_id)
    assert row is not None
    assert row["created_at"] == row["run_at"] == row["expires_at"]


# enqueue ---------------------------------------------------------------------


def test_ready_time_delay_wins_over_run_at(clocked):
    both = enqueue(clocked, delay=30, run_at=5)
    only_run_at = enqueue(clocked, run_at=5)
    neither = enqueue(clocked)
    assert job(clocked, both)["run_at"] == NOW + 30
    assert job(clocked, only_run_at)["run_at"] == 5
    assert job(clocked, neither)["run_at"] == NOW


def test_expires_is_relative_to_the_enqueue_instant(clocked):
    assert job(clocked, enqueue(clocked, expires=60))["expires_at"] == NOW + 60
    assert job(clocked, enqueue(clocked))["expires_at"] is None


def test_stamps_default_and_override(clocked):
    row = job(clocked, enqueue(clocked))
    assert (
        row["visibility_timeout_s"],
        row["max_attempts"],
        row["backoff_base_s"],
        row["dead_letter_retention_s"],
    ) == (300, 3, 5, None)
    assert row["state"] == "pending" and row["attempts"] == 0 and row["priority"] == 0
    assert row["created_at"] == NOW and row["died_at"] is None and row["worker_id"] is None
    custom = job(
        clocked,
        enqueue(
            clocked,
            visibility_timeout_s=10,
            max_attempts=7,
            backoff_base_s=2,
            dead_letter_retention_s=3600,
            priority=-4,
        ),
    )
    assert (
        custom["visibility_timeout_s"],
        custom["max_attempts"],
        custom["backoff_base_s"],
        custom["dead_letter_retention_s"],
        custom["priority"],
    ) == (10, 7, 2, 3600, -4)


def test_explicit_nulls_take_the_defaults(clocked):
    row = job(
        clocked, enqueue(clocked, priority=None, max_attempts=None, visibility_timeout_s=None, backoff_base_s=None)
    )
    assert (row["priority"], row["max_attempts"], row["visibility_timeout_s"], row["backoff_base_s"]) == (0, 3, 300, 5)


def test_payload_round_trips_as_json(clocked):
    payload = '{"a": [1, 2.5, null, true, "é\\"x"], "big": 123456789012345678901234567890}'
    row = job(clocked, enqueue(clocked, payload=payload))
    assert row["payload"] == {"a": [1, 2.5, None, True, 'é"x'], "big": 123456789012345678901234567890}
    assert job(clocked, enqueue(clocked, payload="null"))["payload"] is None


def test_sql_null_payload_is_refused_and_nothing_written(clocked):
    code, message = sqlstate_of(clocked, "SELECT alk.enqueue('q', NULL)")
    assert code == "LK002" and "payload" in message
    code, message = sqlstate_of(clocked, "SELECT alk.enqueue_batch('q', ARRAY['1', NULL]::jsonb[])")
    assert code == "LK002" and "payload 2" in message
    assert count_jobs(clocked) == 0


@pytest.mark.parametrize("argument", ["priority", "max_attempts"])
@pytest.mark.parametrize("value", [2**31, -(2**31) - 1, MAX, MIN])
def test_priority_and_max_attempts_take_the_whole_bigint_range(clocked, argument, value):
    job_id = enqueue(clocked, **{argument: value})
    assert job(clocked, job_id)[argument] == value


def test_job_integer_columns_are_bigint_in_the_type_and_the_table(clocked):
    widths = dict(clocked.execute("""
        SELECT c.relname || '.' || a.attname, format_type(a.atttypid, a.atttypmod)
          FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
         WHERE c.relnamespace = 'alk'::regnamespace AND c.relname IN ('job', 'jobs') AND a.attnum > 0
           AND a.attname IN ('priority', 'attempts', 'max_attempts', 'attempts_refunded')""").fetchall())
    assert len(widths) == 8 and set(widths.values()) == {"bigint"}


def test_enqueue_batch_returns_ids_in_input_order(clocked):
    ids = [
        r[0]
        for r in clocked.execute(
            "SELECT * FROM alk.enqueue_batch('q', ARRAY['1', '2', '3', '4']::jsonb[], priority => 2)"
        ).fetchall()
    ]
    assert len(ids) == 4 and ids == sorted(ids)
    assert [job(clocked, i)["payload"] for i in ids] == [1, 2, 3, 4]
    assert {job(clocked, i)["priority"] for i in ids} == {2}
    assert clocked.execute("SELECT * FROM alk.enqueue_batch('q', ARRAY[]::jsonb[])").fetchall() == []


# claim -----------------------------------------------------------------------


def test_claim_order_is_priority_desc_run_at_asc_id_asc(clocked):
    late_high = enqueue(clocked, payload='"late_high"', priority=5, run_at=NOW - 1)
    early_high = enqueue(clocked, payload='"early_high"', priority=5, run_at=NOW - 10)
    low_first = enqueue(clocked, payload='"low_first"', priority=0, run_at=NOW - 5)
    low_second = enqueue(clocked, payload='"low_second"', priority=0, run_at=NOW - 5)
    future = enqueue(clocked, payload='"future"', priority=99, run_at=NOW + 1)
    claimed = [r["id"] for r in claim(clocked, 10)]
    assert claimed == [early_high, late_high, low_first, low_second]
    assert job(clocked, future)["state"] == "pending"


def test_claim_stamps_the_lease(clocked):
    job_id = enqueue(clocked, visibility_timeout_s=30)
    (row,) = claim(clocked, 1, worker="worker-α")
    assert row["id"] == job_id
    assert (row["state"], row["worker_id"], row["claimed_at"], row["claim_expires_at"], row["attempts"]) == (
        "processing",
        "worker-α",
        NOW,
        NOW + 30,
        1,
    )
    assert job(clocked, job_id) == row


@pytest.mark.parametrize("n", [0, -1, MIN, None])
def test_claim_extent_clamps_to_empty(clocked, n):
    for _ in range(3):
        enqueue(clocked)
    assert claim(clocked, n) == []
    assert one(clocked, "SELECT count(*) FROM alk.jobs WHERE state = 'pending'") == 3


def test_claim_never_claims_more_than_n(clocked):
    for _ in range(5):
        enqueue(clocked)
    assert len(claim(clocked, 2)) == 2
    assert len(claim(clocked, MAX)) == 3


def test_lease_boundary_second(db):
    pin_clock(db, NOW)
    job_id = enqueue(db, visibility_timeout_s=10)
    claim(db, 1, worker="a")
    pin_clock(db, NOW + 10)  # claim_expires_at == now: still held, not reclaimable
    assert claim(db, 1, worker="b") == []
    assert one(db, "SELECT alk.heartbeat(%s, 'a', 1, 0)", job_id) is True  # expires_at stays now
    assert one(db, "SELECT alk.ack(%s, 'a', 1)", job_id) is True


def test_lapsed_lease_is_reclaimable_from_the_next_second(db):
    pin_clock(db, NOW)
    job_id = enqueue(db, visibility_timeout_s=10)
    claim(db, 1, worker="a")
    pin_clock(db, NOW + 11)
    assert one(db, "SELECT alk.ack(%s, 'a', 1)", job_id) is False  # lapsed: refused
    (row,) = claim(db, 1, worker="b")
    assert (row["id"], row["worker_id"], row["attempts"]) == (job_id, "b", 2)


def test_fencing_token_refuses_a_stale_handler_with_the_same_worker_id(db):
    pin_clock(db, NOW)
    job_id = enqueue(db, visibility_timeout_s=10)
    claim(db, 1, worker="w")
    pin_clock(db, NOW + 11)
    (again,) = claim(db, 1, worker="w")
    assert again["attempts"] == 2
    for op in ("alk.ack(%s, 'w', 1)", "alk.retry(%s, 'w', 1)", "alk.fail(%s, 'w', 1)", "alk.heartbeat(%s, 'w', 1)"):
        assert one(db, f"SELECT {op}", job_id) is False
    assert job(db, job_id) == again  # nothing changed
    assert one(db, "SELECT alk.ack(%s, 'w', 2)", job_id) is True


def test_ops_refuse_another_worker_and_a_missing_job(clocked):
    job_id = enqueue(clocked)
    claim(clocked, 1, worker="a")
    assert one(clocked, "SELECT alk.ack(%s, 'b', 1)", job_id) is False
    assert one(clocked, "SELECT alk.ack(%s, 'a', 1, queue => 'other')", job_id) is False
    assert one(clocked, "SELECT alk.ack(%s, 'a', NULL)", job_id + 1000) is False
    assert one(clocked, "SELECT alk.ack(%s, 'a', NULL, queue => 'q')", job_id) is True


def test_exhausted_and_expired_due_rows_are_buried_by_claim(clocked):
    zero = enqueue(clocked, payload='"zero"', max_attempts=0, priority=9)
    expired = enqueue(clocked, payload='"expired"', expires=0, priority=8)
    live = enqueue(clocked, payload='"live"')
    claimed = claim(clocked, 1)
    assert [r["id"] for r in claimed] == [live]  # the loop looks past the buried rows
    assert (job(clocked, zero)["state"], job(clocked, zero)["last_error"]) == ("dead", "max attempts exceeded")
    assert (job(clocked, expired)["state"], job(clocked, expired)["last_error"]) == ("dead", "expired")
    assert job(clocked, zero)["died_at"] == NOW


def test_one_claim_buries_and_claims_from_the_same_pick_in_claim_order(clocked):
    # The pick splits its locked rows into buried and claimed ones: a batch
    # that holds both buries the dead, claims the live in claim order and
    # looks again for as many rows as were buried.
    dead = enqueue(clocked, payload='"dead"', max_attempts=0, priority=9)
    first = enqueue(clocked, payload='"first"', priority=8)
    expired = enqueue(clocked, payload='"expired"', expires=0, priority=7)
    second = enqueue(clocked, payload='"second"', priority=6)
    third = enqueue(clocked, payload='"third"', priority=5)
    claimed = claim(clocked, 3, worker="a")
    assert [r["id"] for r in claimed] == [first, second, third]
    assert [(r["state"], r["attempts"], r["worker_id"]) for r in claimed] == [("processing", 1, "a")] * 3
    for buried, error in ((dead, "max attempts exceeded"), (expired, "expired")):
        row = job(clocked, buried)
        assert (row["state"], row["last_error"], row["died_at"]) == ("dead", error, NOW)
        assert (row["attempts"], row["worker_id"], row["claimed_at"]) == (0, None, None)


def test_lapsed_lease_on_the_last_attempt_dies_on_the_next_claim(db):
    pin_clock(db, NOW)
    job_id = enqueue(db, max_attempts=1, visibility_timeout_s=5)
    claim(db, 1)
    pin_clock(db, NOW + 6)
    assert claim(db, 1) == []
    row = job(db, job_id)
    assert (row["state"], row["last_error"], row["died_at"]) == ("dead", "max attempts exceeded", NOW + 6)


# ack, retry, fail, heartbeat, cancel ---------------------------------------------


def test_ack_deletes_and_a_second_ack_is_refused(clocked):
    job_id = enqueue(clocked)
    claim(clocked)
    assert one(clocked, "SELECT alk.ack(%s, 'w1', 1)", job_id) is True
    assert one(clocked, "SELECT alk.ack(%s, 'w1', 1)", job_id) is False
    assert job(clocked, job_id) is None


def test_ack_batch_counts_validly_held_jobs(clocked):
    ids = [enqueue(clocked) for _ in range(4)]
    claim(clocked, 3, worker="a")
    acked = one(clocked, "SELECT alk.ack_batch(%s, 'a', %s)", ids, [1, 1, 2, 1])
    assert acked == 2  # third has the wrong token, fourth was never claimed
    assert [job(clocked, i) is None for i in ids] == [True, True, False, False]
    code, message = sqlstate_of(clocked, "SELECT alk.ack_batch(%s, 'a', %s)", ids, [1])
    assert code == "LK002" and "attempts" in message
    assert one(clocked, "SELECT alk.ack_batch(ARRAY[]::bigint[], 'a')") == 0


def test_ack_batch_applies_a_repeated_ids_first_entry_only(clocked):
    # ack_batch has its own statement (not _settle's): the same rule as
    # alk.settle for a repeated id, the first entry decides.
    a, b, c = (enqueue(clocked) for _ in range(3))
    claim(clocked, 3, worker="a")
    # a: the first entry's token is wrong, so the right one after it is refused too.
    assert one(clocked, "SELECT alk.ack_batch(%s, 'a', %s)", [a, a, b, b], [2, 1, 1, 1]) == 1
    assert [job(clocked, i) is None for i in (a, b, c)] == [False, True, False]
    assert one(clocked, "SELECT alk.ack_batch(%s, 'a', %s)", [c, c], [1, 1]) == 1
    assert one(clocked, "SELECT alk.ack_batch(%s, 'a')", [a, a]) == 1
    counted = one(clocked, "SELECT sum(acked) FROM alk.queue_throughput('q')")
    assert counted == 3


def test_ack_refuses_another_queue_and_names_a_bad_worker(clocked):
    job_id = enqueue(clocked)
    claim(clocked)
    assert one(clocked, "SELECT alk.ack(%s, 'w1', 1, 'other')", job_id) is False
    assert job(clocked, job_id)["state"] == "processing"
    code, message = sqlstate_of(clocked, "SELECT alk.ack(%s, '', 1)", job_id)
    assert code == "LK001" and "worker_id" in message
    assert one(clocked, "SELECT alk.ack(%s, 'w1', 1, 'q')", job_id) is True


def test_backoff_curve_then_exhaustion(db):
    pin_clock(db, NOW)
    job_id = enqueue(db, max_attempts=4, backoff_base_s=5)
    clock = NOW
    for attempt, backoff in [(1, 5), (2, 10), (3, 20)]:
        pin_clock(db, clock)
        (row,) = claim(db)
        assert row["attempts"] == attempt
        assert one(db, "SELECT alk.retry(%s, 'w1', %s, 'boom')", job_id, attempt) is True
        row = job(db, job_id)
        assert (row["state"], row["run_at"], row["worker_id"], row["last_error"], row["claim_expires_at"]) == (
            "pending",
            clock + backoff,
            None,
            None,
            None,
        )
        clock += backoff
        pin_clock(db, clock - 1)
        assert claim(db) == []  # not before its time
    pin_clock(db, clock)
    claim(db)
    assert one(db, "SELECT alk.retry(%s, 'w1', 4, NULL)", job_id) is True
    row = job(db, job_id)
    assert (row["state"], row["last_error"], row["died_at"]) == ("dead", "max attempts exceeded", clock)


def test_retry_exhaustion_records_the_error_given(clocked):
    job_id = enqueue(clocked, max_attempts=1)
    claim(clocked)
    assert one(clocked, "SELECT alk.retry(%s, 'w1', 1, 'smtp down', 0)", job_id) is True
    assert job(clocked, job_id)["last_error"] == "smtp down"


def test_retry_with_explicit_delay(clocked):
    job_id = enqueue(clocked)
    claim(clocked)
    assert one(clocked, "SELECT alk.retry(%s, 'w1', 1, NULL, 77)", job_id) is True
    assert job(clocked, job_id)["run_at"] == NOW + 77


def test_fail_buries_with_default_or_given_error(clocked):
    first, second = enqueue(clocked), enqueue(clocked)
    claim(clocked, 2)
    assert one(clocked, "SELECT alk.fail(%s, 'w1', 1)", first) is True
    assert one(clocked, "SELECT alk.fail(%s, 'w1', 1, 'bad input')", second) is True
    assert (job(clocked, first)["state"], job(clocked, first)["last_error"]) == ("dead", "failed")
    assert job(clocked, second)["last_error"] == "bad input"
    assert job(clocked, first)["died_at"] == NOW


def test_heartbeat_extends_and_a_negative_extend_voids_the_claim(db):
    pin_clock(db, NOW)
    job_id = enqueue(db, visibility_timeout_s=10)
    claim(db)
    assert one(db, "SELECT alk.heartbeat(%s, 'w1', 1, 100)", job_id) is True
    assert job(db, job_id)["claim_expires_at"] == NOW + 100
    assert one(db, "SELECT alk.heartbeat(%s, 'w1', 1)", job_id) is True  # NULL: the row's timeout
    assert job(db, job_id)["claim_expires_at"] == NOW + 10
    assert one(db, "SELECT alk.heartbeat(%s, 'w1', 1, -1)", job_id) is True  # valid at call time
    assert one(db, "SELECT alk.ack(%s, 'w1', 1)", job_id) is False  # voided on the next op
    assert claim(db, 1, worker="w2")[0]["attempts"] == 2


def test_cancel_deletes_live_jobs_only(clocked):
    processing = enqueue(clocked, priority=2)
    dead = enqueue(clocked, max_attempts=0, priority=1)
    pending = enqueue(clocked, run_at=NOW + 100)
    claim(clocked, 5)  # claims `processing`, buries `dead`
    assert [job(clocked, i)["state"] for i in (processing, dead, pending)] == ["processing", "dead", "pending"]
    assert one(clocked, "SELECT alk.cancel('q', %s)", pending) is True
    assert one(clocked, "SELECT alk.cancel('q', %s)", processing) is True
    assert one(clocked, "SELECT alk.cancel('q', %s)", dead) is False
    assert one(clocked, "SELECT alk.cancel('other', %s)", dead) is False
    assert one(clocked, "SELECT alk.cancel('q', 999999)") is False
    assert job(clocked, pending) is None and job(clocked, processing) is None
    assert job(clocked, dead) is not None


def test_get_job_of_another_queue_or_missing_is_null(clocked):
    job_id = enqueue(clocked)
    assert job(clocked, job_id, queue="other") is None
    # Zero rows in FROM form, NULL as a scalar subquery: never a row of NULLs.
    assert clocked.execute("SELECT * FROM alk.get_job('q', 424242)").fetchall() == []
    assert clocked.execute("SELECT * FROM alk.get_job('other', %s)", [job_id]).fetchall() == []
    assert one(clocked, "SELECT (SELECT alk.get_job('q', 424242)) IS NULL") is True
    assert one(clocked, "SELECT (SELECT alk.get_job('q', %s)) IS NULL", job_id) is False


# sweep ---------------------------------------------------------------------------


def test_sweep_buries_expired_waiting_rows_and_lapsed_expired_rows_only(db):
    pin_clock(db, NOW)
    waiting = enqueue(db, expires=5, run_at=NOW + 1000)
    held = enqueue(db, expires=5, priority=2, visibility_timeout_s=100)
    lapsed = enqueue(db, expires=5, priority=1, visibility_timeout_s=2)
    forever = enqueue(db, run_at=NOW + 1000)
    claim(db, 2)
    pin_clock(db, NOW + 5)
    assert one(db, "SELECT alk.sweep_expired('q')") == 2
    assert [job(db, i)["state"] for i in (waiting, held, lapsed, forever)] == ["dead", "processing", "dead", "pending"]
    assert job(db, waiting)["last_error"] == "expired"
    assert job(db, waiting)["died_at"] == NOW + 5


def test_sweep_purges_dead_rows_at_their_retention(db):
    pin_clock(db, NOW)
    kept = enqueue(db, max_attempts=0)
    purged = enqueue(db, max_attempts=0, dead_letter_retention_s=60)
    claim(db)  # buries both at NOW
    pin_clock(db, NOW + 59)
    assert one(db, "SELECT alk.sweep_expired('q')") == 0
    pin_clock(db, NOW + 60)  # died_at <= now - retention
    assert one(db, "SELECT alk.sweep_expired('q')") == 1
    assert job(db, purged) is None and job(db, kept)["state"] == "dead"


def test_sweep_touches_only_its_queue(db):
    pin_clock(db, NOW)
    other = enqueue(db, queue="other", expires=0)
    assert one(db, "SELECT alk.sweep_expired('q')") == 0
    assert job(db, other, queue="other")["state"] == "pending"


# saturating arithmetic -----------------------------------------------------------


@pytest.mark.parametrize(
    ("delay", "expected"),
    [(MAX, MAX), (MIN, NOW + MIN), (MAX - NOW, MAX), (MAX - NOW + 1, MAX), (-1, NOW - 1)],
)
def test_enqueue_delay_saturates(clocked, delay, expected):
    assert job(clocked, enqueue(clocked, delay=delay))["run_at"] == expected


def test_enqueue_expires_saturates_and_exact_sums_stay_exact(clocked):
    assert job(clocked, enqueue(clocked, expires=MAX))["expires_at"] == MAX
    assert job(clocked, enqueue(clocked, expires=MIN))["expires_at"] == NOW + MIN  # 1700000000 + (-2^63) is exact
    pin_clock(clocked, -5)
    assert job(clocked, enqueue(clocked, expires=MIN))["expires_at"] == MIN


def test_claim_deadline_saturates_and_the_row_poisons_nothing(db):
    pin_clock(db, NOW)
    extreme = enqueue(db, visibility_timeout_s=MAX, priority=1)
    negative = enqueue(db, visibility_timeout_s=MIN, priority=1)
    normal = enqueue(db)
    rows = {r["id"]: r for r in claim(db, 3)}
    assert rows[extreme]["claim_expires_at"] == MAX
    assert rows[negative]["claim_expires_at"] == NOW + MIN
    assert rows[normal]["claim_expires_at"] == NOW + 300
    # The negative-deadline row is lapsed at once; later claims, heartbeats and
    # sweeps keep working around both extremes.
    (again,) = claim(db, 5, worker="w2")
    assert again["id"] == negative
    assert one(db, "SELECT alk.heartbeat(%s, 'w1', 1, %s)", extreme, MAX) is True
    assert job(db, extreme)["claim_expires_at"] == MAX
    assert one(db, "SELECT alk.heartbeat(%s, 'w1', 1, %s)", normal, MIN) is True
    assert job(db, normal)["claim_expires_at"] == NOW + MIN
    assert one(db, "SELECT alk.sweep_expired('q')") == 0
    pin_clock(db, MAX)
    assert one(db, "SELECT alk.sweep_expired('q')") == 0
    assert one(db, "SELECT alk.ack(%s, 'w1', 1)", extreme) is True  # claim_expires_at = MAX >= now = MAX


@pytest.mark.parametrize(("delay", "expected"), [(MAX, MAX), (MIN, NOW + MIN)])
def test_retry_delay_saturates(clocked, delay, expected):
    job_id = enqueue(clocked)
    claim(clocked)
    assert one(clocked, "SELECT alk.retry(%s, 'w1', 1, NULL, %s)", job_id, delay) is True
    assert job(clocked, job_id)["run_at"] == expected


@pytest.mark.parametrize(
    ("base", "attempts", "expected"),
    [
        (MAX, 1, MAX),
        (MAX, 3, MAX),
        (2**62, 2, MAX),
        (MIN, 2, MIN),
        (-5, 3, -20),
        (1, 64, MAX),
        (7, 1, 7),
    ],
)
def test_backoff_product_saturates(db, base, attempts, expected):
    pin_clock(db, 0)
    job_id = enqueue(db, backoff_base_s=base, max_attempts=100, visibility_timeout_s=0)
    for attempt in range(1, attempts):  # reach the wanted attempt count through lapsed leases
        pin_clock(db, attempt * 10)
        claim(db)
    pin_clock(db, attempts * 10)
    (row,) = claim(db)
    assert row["attempts"] == attempts
    assert one(db, "SELECT alk.retry(%s, 'w1', %s)", job_id, attempts) is True
    clock = attempts * 10  # expected is the saturated product; the sum saturates again
    assert job(db, job_id)["run_at"] == max(MIN, min(MAX, clock + expected))


@pytest.mark.parametrize(("retention", "purged"), [(MIN, True), (MAX, False), (0, True), (-1, True)])
def test_retention_arithmetic_saturates(db, retention, purged):
    pin_clock(db, NOW)
    job_id = enqueue(db, max_attempts=0, dead_letter_retention_s=retention)
    claim(db)
    assert one(db, "SELECT alk.sweep_expired('q')") == (1 if purged else 0)
    assert (job(db, job_id) is None) is purged


def test_sweep_at_the_clock_edges_does_not_overflow(db):
    # The lowest clock: now + expires and now - retention saturate to MIN.
    pin_clock(db, MIN)
    purged = enqueue(db, "low", expires=MIN, dead_letter_retention_s=MAX)  # MIN - MAX: due for purge at once
    kept = enqueue(db, "low", expires=0)  # no retention: dead for ever
    later = enqueue(db, "low", expires=1)
    assert one(db, "SELECT alk.sweep_expired('low')") == 2 + 1  # two buried, one of them purged
    assert job(db, purged, "low") is None
    assert {k: job(db, kept, "low")[k] for k in ("state", "last_error", "died_at")} == {
        "state": "dead", "last_error": "expired", "died_at": MIN}
    assert job(db, later, "low")["state"] == "pending"
    assert one(db, "SELECT alk.sweep_expired('low')") == 0

    # The highest clock: expires, leases and purge instants saturate to MAX.
    pin_clock(db, MAX - 10)
    held = enqueue(db, expires=MAX, priority=2, visibility_timeout_s=MAX)  # lease ends at MAX: still valid
    lapsed = enqueue(db, expires=5, priority=1, visibility_timeout_s=1, dead_letter_retention_s=0)
    waiting = enqueue(db, expires=MAX, run_at=MAX, dead_letter_retention_s=1)  # MAX + 1: never purged
    negative = enqueue(db, expires=MAX, run_at=MAX, dead_letter_retention_s=MIN)  # MAX + MIN = -1: purged at once
    forever = enqueue(db, run_at=MAX)
    assert [c["id"] for c in claim(db, 2)] == [held, lapsed]
    pin_clock(db, MAX)
    assert one(db, "SELECT alk.sweep_expired('q')") == 3 + 2  # lapsed, waiting, negative buried; two purged
    assert job(db, lapsed) is None and job(db, negative) is None
    assert {k: job(db, waiting)[k] for k in ("state", "last_error", "died_at")} == {
        "state": "dead", "last_error": "expired", "died_at": MAX}
    assert job(db, held)["state"] == "processing"
    assert job(db, held)["claim_expires_at"] == MAX
    assert job(db, forever)["state"] == "pending"
    assert one(db, "SELECT alk.sweep_expired('q')") == 0
    assert job(db, kept, "low")["state"] == "dead"


@settings(max_examples=300, deadline=None)
@given(a=st.integers(MIN, MAX), b=st.integers(MIN, MAX))
def test_saturating_add_and_sub_match_clamped_integer_arithmetic(pg_server, template_db, a, b):
    with psycopg.connect(pg_server.dsn_for(template_db), autocommit=True) as conn:
        added, subtracted = conn.execute("SELECT alk._sat_add(%s, %s), alk._sat_sub(%s, %s)", [a, b, a, b]).fetchone()
    assert added == max(MIN, min(MAX, a + b))
    assert subtracted == max(MIN, min(MAX, a - b))


@settings(max_examples=300, deadline=None)
@given(
    died_at=st.one_of(st.integers(MIN, MAX), st.sampled_from([MIN, MIN + 1, -1, 0, 1, MAX - 1, MAX])),
    retention=st.one_of(st.integers(MIN, MAX), st.sampled_from([MIN, -1, 0, 1, MAX])),
    now=st.one_of(st.integers(MIN, MAX), st.sampled_from([MIN, 0, MAX])),
)
def test_purge_instant_matches_the_retention_rule(pg_server, template_db, died_at, retention, now):
    # The sweep deletes rows with purge_at <= now; the contract says died_at <= sat(now - retention).
    with psycopg.connect(pg_server.dsn_for(template_db), autocommit=True) as conn:
        purge_at = conn.execute("SELECT alk._purge_at(%s, %s)", [died_at, retention]).fetchone()[0]
    due = purge_at is not None and purge_at <= now
    assert due == (died_at <= max(MIN, min(MAX, now - retention)))


# names -----------------------------------------------------------------------------


HOSTILE_NAMES = [
    "it's",
    'say "hi"',
    "'; DROP TABLE alk.jobs; --",
    "x" * 1024,
    "очередь/队列/🚀",
    " ",
    "alk",
    "ALK:upper",
    "\\",
]


@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=lambda n: repr(n[:20]))
def test_hostile_names_are_plain_data(clocked, name):
    job_id = enqueue(clocked, queue=name)
    (row,) = claim(clocked, 1, worker=name, queue=name)
    assert (row["id"], row["queue"], row["worker_id"]) == (job_id, name, name)
    assert one(clocked, "SELECT alk.ack(%s, %s, 1, %s)", job_id, name, name) is True
    assert one(clocked, "SELECT to_regclass('alk.jobs') IS NOT NULL") is True


@pytest.mark.parametrize("name", ["", None, "alk:", "alk:outbox:x"])
@pytest.mark.parametrize(
    "call",
    [
        "SELECT alk.enqueue(%s, '1')",
        "SELECT alk.enqueue_batch(%s, ARRAY['1']::jsonb[])",
        "SELECT * FROM alk.claim(%s, 'w', 1)",
        "SELECT alk.cancel(%s, 1)",
        "SELECT alk.get_job(%s, 1)",
        "SELECT alk.sweep_expired(%s)",
    ],
)
def test_empty_and_reserved_queue_names_are_refused(clocked, name, call):
    code, message = sqlstate_of(clocked, call, name)
    assert code == "LK001"
    assert "queue" in message
    assert count_jobs(clocked) == 0


def test_long_name_error_message_is_shortened(clocked):
    code, message = sqlstate_of(clocked, "SELECT alk.enqueue(%s, '1')", "alk:" + "y" * 5000)
    assert code == "LK001" and "5004 characters" in message and len(message) < 300


def test_empty_worker_id_is_refused_but_a_reserved_one_is_allowed(clocked):
    enqueue(clocked)
    code, message = sqlstate_of(clocked, "SELECT * FROM alk.claim('q', '', 1)")
    assert code == "LK001" and "worker_id" in message
    assert len(claim(clocked, 1, worker="alk:scheduler")) == 1


# claim order as a property --------------------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    jobs=st.lists(st.tuples(st.integers(-3, 3), st.integers(NOW - 5, NOW + 2)), min_size=1, max_size=25),
    batch=st.integers(1, 7),
)
def test_claims_drain_due_jobs_in_priority_run_at_id_order(clocked, jobs, batch):
    queue = f"prop-{next(_queues)}"
    ids = [enqueue(clocked, queue=queue, priority=priority, run_at=run_at) for priority, run_at in jobs]
    due = [(-priority, run_at, job_id) for job_id, (priority, run_at) in zip(ids, jobs, strict=True) if run_at <= NOW]
    claimed: list[int] = []
    while rows := claim(clocked, batch, queue=queue):
        assert len(rows) <= batch
        claimed += [r["id"] for r in rows]
    assert claimed == [job_id for _, _, job_id in sorted(due)]


_queues = iter(range(10**9))


def test_names_over_1024_bytes_are_refused_before_they_reach_an_index(clocked):
    incompressible = "".join(f"{i:08x}" for i in range(1250))  # 10,000 characters
    code, message = sqlstate_of(clocked, "SELECT alk.enqueue(%s, '1')", incompressible)
    assert code == "LK001" and "queue must be at most 1024 bytes long, got 10000 bytes" in message
    code, _ = sqlstate_of(clocked, "SELECT alk.enqueue(%s, '1')", "é" * 513)  # 1026 bytes
    assert code == "LK001"
    assert enqueue(clocked, queue="é" * 512)  # exactly 1024 bytes
    assert count_jobs(clocked) == 1


# 0009: one name rule for worker ids -------------------------------------------------


WORKER_OPS = [
    "SELECT alk.ack(%s, %s, 1)",
    "SELECT alk.ack_batch(ARRAY[%s]::bigint[], %s)",
    "SELECT alk.retry(%s, %s, 1)",
    "SELECT alk.fail(%s, %s, 1)",
    "SELECT alk.heartbeat(%s, %s, 1)",
    "SELECT alk.release_jobs(ARRAY[%s]::bigint[], %s, ARRAY[1])",
    "SELECT alk.snooze(%s, %s, 1, 0)",
    "SELECT * FROM alk.settle(ARRAY[%s]::bigint[], %s)",
]


@pytest.mark.parametrize("op", WORKER_OPS)
@pytest.mark.parametrize("worker", [None, "", "x" * 1025])
def test_every_op_refuses_a_bad_worker_id_like_claim(clocked, op, worker):
    job_id = enqueue(clocked)
    claim(clocked)
    code, message = sqlstate_of(clocked, op, job_id, worker)
    assert code == "LK001" and "worker_id" in message
    assert job(clocked, job_id)["state"] == "processing"


# 0009: fencing tokens never come back ---------------------------------------------


def test_a_token_is_never_valid_again_after_requeue_dead(clocked):
    job_id = enqueue(clocked, max_attempts=1)
    assert claim(clocked)[0]["attempts"] == 1
    assert one(clocked, "SELECT alk.fail(%s, 'w1', 1)", job_id) is True
    assert one(clocked, "SELECT alk.requeue_dead('q')") == 1
    again = claim(clocked)[0]
    assert (again["attempts"], again["attempts_refunded"]) == (2, 1)
    # The first run's token stays dead; the new one works.
    assert one(clocked, "SELECT alk.heartbeat(%s, 'w1', 1)", job_id) is False
    assert one(clocked, "SELECT alk.ack(%s, 'w1', 1)", job_id) is False
    assert one(clocked, "SELECT alk.ack(%s, 'w1', 2)", job_id) is True


def test_release_gives_a_job_back_without_spending_an_attempt(clocked):
    first = enqueue(clocked, max_attempts=1, run_at=NOW - 5)
    second = enqueue(clocked, max_attempts=1)
    claimed = claim(clocked, 2)
    assert [c["id"] for c in claimed] == [first, second]
    assert one(clocked, "SELECT alk.release_jobs(%s, 'w1', %s)", [first, second, 424242], [1, 1, 1]) == 2
    row = job(clocked, first)
    assert (row["state"], row["worker_id"], row["claimed_at"], row["claim_expires_at"], row["run_at"]) == (
        "pending", None, None, None, NOW - 5)
    assert (row["attempts"], row["attempts_refunded"]) == (1, 1)
    # Its one attempt is still there (max_attempts 1), under a new token, and
    # it keeps its place in claim order.
    again = claim(clocked)[0]
    assert (again["id"], again["attempts"]) == (first, 2)
    assert one(clocked, "SELECT alk.ack(%s, 'w1', 1)", first) is False
    assert one(clocked, "SELECT alk.release_jobs(ARRAY[%s]::bigint[], 'w1', ARRAY[1])", first) == 0
    assert one(clocked, "SELECT alk.ack(%s, 'w1', 2)", first) is True


def test_release_refuses_invalid_claims_and_misaligned_tokens(clocked):
    job_id = enqueue(clocked)
    claim(clocked)
    assert one(clocked, "SELECT alk.release_jobs(ARRAY[%s]::bigint[], 'w2', ARRAY[1])", job_id) == 0
    code, message = sqlstate_of(clocked, "SELECT alk.release_jobs(ARRAY[%s]::bigint[], 'w1', ARRAY[1, 2])", job_id)
    assert code == "LK002" and "attempts" in message
    assert job(clocked, job_id)["state"] == "processing"


def test_backoff_and_burial_count_spent_attempts(clocked):
    job_id = enqueue(clocked, max_attempts=2, backoff_base_s=10)
    claim(clocked)
    assert one(clocked, "SELECT alk.release_jobs(ARRAY[%s]::bigint[], 'w1', ARRAY[1])", job_id) == 1
    claim(clocked)  # token 2, one attempt spent
    assert one(clocked, "SELECT alk.retry(%s, 'w1', 2)", job_id) is True
    assert job(clocked, job_id)["run_at"] == NOW + 10  # base * 2^(spent - 1), spent = 1
    pin_clock(clocked, NOW + 10)
    claim(clocked)  # token 3, two spent: a retry now buries it
    assert one(clocked, "SELECT alk.retry(%s, 'w1', 3, 'E: no')", job_id) is True
    assert (job(clocked, job_id)["state"], job(clocked, job_id)["last_error"]) == ("dead", "E: no")


# 0009: batch settlement and settle-and-claim ------------------------------------


def settle(db: psycopg.Connection, ids: list[int], tokens: list[int | None], outcomes: list[str] | None = None,
           errs: list[str | None] | None = None, delays: list[int | None] | None = None) -> list[tuple[Any, ...]]:
    return db.execute("SELECT * FROM alk.settle(%s::bigint[], 'w1', %s::bigint[], %s, %s, %s::bigint[])",
                      [ids, tokens, outcomes, errs, delays]).fetchall()


def test_settle_reports_the_state_each_outcome_led_to(clocked):
    acked, retried, failed, buried, stale = (enqueue(clocked, max_attempts=1 if i == 3 else 3) for i in range(5))
    claim(clocked, 5)
    assert settle(clocked, [acked, retried, failed, buried, stale, 424242], [1, 1, 1, 1, 7, 1],
                  ["ack", "retry", "fail", "retry", "ack", "fail"], [None, "E: a", "E: b", "E: c", None, None],
                  [None, 30, None, None, None, None]) == [
        (acked, 1, "acked"), (retried, 1, "pending"), (failed, 1, "dead"), (buried, 1, "dead"),
        (stale, 7, None), (424242, 1, None)]
    assert job(clocked, acked) is None
    assert (job(clocked, retried)["run_at"], job(clocked, retried)["last_error"]) == (NOW + 30, None)
    assert job(clocked, failed)["last_error"] == "E: b"
    assert job(clocked, buried)["last_error"] == "E: c"
    assert job(clocked, stale)["state"] == "processing"


def test_settle_defaults_to_ack_and_refuses_a_repeated_id(clocked):
    job_id = enqueue(clocked)
    claim(clocked)
    assert settle(clocked, [job_id, job_id], [1, 1]) == [(job_id, 1, "acked"), (job_id, 1, None)]
    assert settle(clocked, [], []) == []


def test_outcomes_all_ack_settle_as_the_default_does(clocked):
    # Every outcome 'ack' takes the all-ack statement (0020): the same rule as
    # NULL outcomes, errs and delays ignored, a repeated id and a stale token
    # refused, other queues untouched.
    first, stale, elsewhere = enqueue(clocked), enqueue(clocked), enqueue(clocked, "other")
    claim(clocked, 2)
    claim(clocked, queue="other")
    assert clocked.execute(
        "SELECT * FROM alk.settle(%s::bigint[], 'w1', ARRAY[1, 1, 9, 1], ARRAY['ack', 'ack', 'ack', 'ack'],"
        " ARRAY['E: a', NULL, 'E: c', NULL], ARRAY[5, NULL, 5, 5], 'q')",
        [[first, first, stale, elsewhere]]).fetchall() == [
        (first, 1, "acked"), (first, 1, None), (stale, 9, None), (elsewhere, 1, None)]
    assert job(clocked, first) is None
    assert (job(clocked, stale)["state"], job(clocked, stale)["last_error"]) == ("processing", None)
    assert job(clocked, elsewhere, "other")["state"] == "processing"
    # A mixed batch still settles each outcome as given.
    assert settle(clocked, [stale], [1], ["retry"], ["E: later"], [30]) == [(stale, 1, "pending")]
    assert (job(clocked, stale)["run_at"], job(clocked, stale)["last_error"]) == (NOW + 30, None)


@pytest.mark.parametrize(("query", "fragment"), [
    ("SELECT * FROM alk.settle(ARRAY[1, 2], 'w1', ARRAY[1])", "one entry per job id"),
    ("SELECT * FROM alk.settle(ARRAY[1], 'w1', NULL, ARRAY['ack', 'ack'])", "one entry per job id"),
    ("SELECT * FROM alk.settle(ARRAY[1], 'w1', NULL, ARRAY['done'])", "outcome 1"),
    ("SELECT * FROM alk.settle(ARRAY[1], 'w1', NULL, ARRAY[NULL]::text[])", "outcome 1"),
])
def test_settle_refuses_malformed_batches_and_writes_nothing(clocked, query, fragment):
    job_id = enqueue(clocked)
    claim(clocked)
    code, message = sqlstate_of(clocked, query)
    assert code == "LK002" and fragment in message
    assert job(clocked, job_id)["state"] == "processing"


def settle_and_claim(db: psycopg.Connection, n: int, ids: list[int], tokens: list[int], outcomes: list[str] | None
                     = None, worker: str = "w1") -> list[dict[str, Any]]:
    cur = db.execute("SELECT * FROM alk.settle_and_claim('q', %s, %s, %s::bigint[], %s::bigint[], %s)",
                     [worker, n, ids, tokens, outcomes])
    assert cur.description is not None
    names = [c.name for c in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def test_settle_and_claim_settles_then_claims_in_one_call(clocked):
    done, again = enqueue(clocked), enqueue(clocked)
    waiting = [enqueue(clocked) for _ in range(3)]
    claim(clocked, 2)
    rows = settle_and_claim(clocked, 2, [done, again, done], [1, 1, 1], ["ack", "retry", "ack"])
    assert [(r["kind"], r["id"], r["state"], r["attempts"]) for r in rows[:3]] == [
        ("settled", done, "acked", 1), ("settled", again, "pending", 1), ("settled", done, None, 1)]
    assert all(r["queue"] == "q" and r["payload"] is None for r in rows[:3])
    claimed = rows[3:]
    assert [(r["kind"], r["id"], r["state"], r["attempts"]) for r in claimed] == [
        ("claimed", waiting[0], "processing", 1), ("claimed", waiting[1], "processing", 1)]
    # A claimed row is a whole alk.job.
    assert {k: v for k, v in claimed[0].items() if k != "kind"} == job(clocked, waiting[0])
    # Nothing to settle: a plain claim.
    assert [r["id"] for r in settle_and_claim(clocked, 5, [], [])] == [waiting[2]]


def test_settle_and_claim_refuses_stale_tokens_and_other_queues(clocked):
    job_id = enqueue(clocked, visibility_timeout_s=10)
    other = enqueue(clocked, "other")
    claim(clocked)
    claim(clocked, queue="other")
    pin_clock(clocked, NOW + 11)
    # The lease lapsed and w2 reclaimed it: w1's token 1 is stale.
    assert claim(clocked, worker="w2")[0]["attempts"] == 2
    rows = settle_and_claim(clocked, 0, [job_id, other], [1, 1])
    assert [(r["kind"], r["id"], r["state"]) for r in rows] == [("settled", job_id, None), ("settled", other, None)]
    assert job(clocked, job_id)["worker_id"] == "w2"
    assert job(clocked, other, "other")["state"] == "processing"


def test_settle_and_claim_is_one_transaction(clocked):
    job_id = enqueue(clocked)
    claim(clocked)
    enqueue(clocked)
    code, _ = sqlstate_of(clocked, "SELECT * FROM alk.settle_and_claim('', 'w1', 1, ARRAY[%s]::bigint[], ARRAY[1])",
                          job_id)
    assert code == "LK001"
    assert job(clocked, job_id)["state"] == "processing"  # the ack rolled back with the failed claim


def test_concurrent_settle_and_claim_have_exactly_one_winner_per_job(connect):
    from concurrent.futures import ThreadPoolExecutor

    setup = connect()
    ids = [r[0] for r in setup.execute(
        "SELECT * FROM alk.enqueue_batch('q', array_fill('{}'::jsonb, ARRAY[200]))").fetchall()]
    conns = [connect() for _ in range(4)]

    def drain(i: int) -> list[int]:
        got: list[int] = []
        held: list[tuple[int, int]] = []
        while True:
            rows = conns[i].execute(
                "SELECT kind, id, attempts FROM alk.settle_and_claim('q', %s, 7, %s::bigint[], %s::bigint[])",
                [f"w{i}", [h[0] for h in held], [h[1] for h in held]]).fetchall()
            assert all(kind == "claimed" or True for kind, _, _ in rows)
            held = [(job_id, attempt) for kind, job_id, attempt in rows if kind == "claimed"]
            if not held:
                return got
            got += [h[0] for h in held]

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(drain, range(4)))
    everything = [job_id for result in results for job_id in result]
    assert sorted(everything) == ids  # each job claimed exactly once
    assert one(setup, "SELECT count(*) FROM alk.jobs") == 0  # and acked by its claimer


# 0009: dedup keys ------------------------------------------------------------------


def test_a_live_job_holds_its_dedup_key(clocked):
    first = enqueue(clocked, dedup_key="k")
    assert enqueue(clocked, payload='{"again": 1}', dedup_key="k") == first
    assert enqueue(clocked, "other", dedup_key="k") != first  # per queue
    assert one(clocked, "SELECT count(*) FROM alk.jobs WHERE queue = 'q'") == 1
    assert job(clocked, first)["dedup_key"] == "k" and job(clocked, first)["payload"] == {}
    claim(clocked)
    assert enqueue(clocked, dedup_key="k") == first  # processing still holds it
    assert enqueue(clocked) != enqueue(clocked)  # NULL: no dedup


@pytest.mark.parametrize("release", ["ack", "cancel", "fail"])
def test_acked_cancelled_or_dead_jobs_free_the_key(clocked, release):
    first = enqueue(clocked, dedup_key="k")
    claim(clocked)
    query = {"ack": "SELECT alk.ack(%s, 'w1', 1)", "cancel": "SELECT alk.cancel('q', %s)",
             "fail": "SELECT alk.fail(%s, 'w1', 1)"}[release]
    assert one(clocked, query, first) is True
    second = enqueue(clocked, dedup_key="k")
    assert second != first
    if release == "fail":
        # The dead row keeps its key for inspection, and a requeue of it
        # writes nothing while the new job holds the key.
        assert job(clocked, first)["dedup_key"] == "k"
        assert one(clocked, "SELECT alk.requeue_dead('q')") == 0
        assert job(clocked, first)["state"] == "dead"


def test_enqueue_batch_dedups_against_live_jobs_and_within_the_batch(clocked):
    held = enqueue(clocked, dedup_key="a")
    ids = [r[0] for r in clocked.execute(
        "SELECT * FROM alk.enqueue_batch('q', ARRAY['1', '2', '3', '4', '5']::jsonb[], "
        "dedup_keys => ARRAY['a', 'b', NULL, 'b', NULL])").fetchall()]
    assert ids[0] == held and ids[3] == ids[1] and len({ids[1], ids[2], ids[4], held}) == 4
    assert job(clocked, ids[1])["payload"] == 2  # the first occurrence wins
    assert one(clocked, "SELECT count(*) FROM alk.jobs") == 4
    code, message = sqlstate_of(clocked, "SELECT * FROM alk.enqueue_batch('q', ARRAY['1']::jsonb[], "
                                         "dedup_keys => ARRAY['x', 'y'])")
    assert code == "LK002" and "dedup_keys" in message


@pytest.mark.parametrize("key", ["", "x" * 1025])
def test_a_dedup_key_is_a_name(clocked, key):
    code, message = sqlstate_of(clocked, "SELECT alk.enqueue('q', '1', dedup_key => %s)", key)
    assert code == "LK001" and "dedup_key" in message
    code, _ = sqlstate_of(clocked, "SELECT * FROM alk.enqueue_batch('q', ARRAY['1']::jsonb[], dedup_keys => %s)",
                          [key])
    assert code == "LK001"
    assert count_jobs(clocked) == 0


def test_concurrent_enqueues_of_one_key_leave_one_row(connect):
    import threading

    conns = [connect() for _ in range(8)]
    barrier = threading.Barrier(len(conns))
    results: list[int] = []

    def go(conn: psycopg.Connection) -> None:
        barrier.wait()
        for _ in range(20):
            with conn.transaction():
                results.append(one(conn, "SELECT alk.enqueue('q', '1', dedup_key => 'same')"))

    threads = [threading.Thread(target=go, args=(c,)) for c in conns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 160 and len(set(results)) == 1
    assert one(conns[0], "SELECT count(*) FROM alk.jobs") == 1


# 0009: pause and resume --------------------------------------------------------------


def test_a_paused_queue_claims_nothing_until_resumed(clocked):
    job_id = enqueue(clocked)
    enqueue(clocked, "other")
    assert one(clocked, "SELECT alk.pause_queue('q')") is True
    assert one(clocked, "SELECT alk.pause_queue('q')") is False
    assert claim(clocked) == []
    assert settle_and_claim(clocked, 5, [], []) == []
    assert one(clocked, "SELECT alk.next_claim_at('q')") is None
    assert len(claim(clocked, queue="other")) == 1  # other queues go on
    assert enqueue(clocked) > job_id  # enqueue works
    assert one(clocked, "SELECT paused FROM alk.queue_stats('q')") is True
    assert one(clocked, "SELECT paused FROM alk.queue_stats('other')") is False
    assert one(clocked, "SELECT alk.resume_queue('q')") is True
    assert one(clocked, "SELECT alk.resume_queue('q')") is False
    assert [c["id"] for c in claim(clocked)] == [job_id]


def test_ops_on_claimed_jobs_work_while_paused(clocked):
    job_id = enqueue(clocked)
    claim(clocked)
    one(clocked, "SELECT alk.pause_queue('q')")
    assert one(clocked, "SELECT alk.heartbeat(%s, 'w1', 1)", job_id) is True
    assert one(clocked, "SELECT alk.retry(%s, 'w1', 1, NULL, 0)", job_id) is True
    assert one(clocked, "SELECT alk.sweep_expired('q')") == 0


@pytest.mark.parametrize("queue", ["", None, "alk:x"])
def test_pause_and_resume_take_a_queue_name(db, queue):
    assert sqlstate_of(db, "SELECT alk.pause_queue(%s)", queue)[0] == "LK001"
    assert sqlstate_of(db, "SELECT alk.resume_queue(%s)", queue)[0] == "LK001"


def test_resume_wakes_the_queues_listeners(db, connect):
    from psycopg import sql

    listener = connect()
    channel = one(db, "SELECT alk.queue_channel('q')")
    listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
    one(db, "SELECT alk.pause_queue('q')")
    one(db, "SELECT alk.resume_queue('q')")
    assert [n.channel for n in listener.notifies(timeout=5, stop_after=1)] == [channel]


# 0009: claim does not walk future rows --------------------------------------------------


def test_claim_skips_higher_priority_future_rows_without_reading_them(clocked):
    clocked.execute("SELECT alk.enqueue_batch('q', array_fill('{}'::jsonb, ARRAY[20000]), delay => 3600, "
                    "priority => 9)")
    due = enqueue(clocked, priority=0)
    clocked.execute("ANALYZE alk.jobs")
    assert [c["id"] for c in claim(clocked)] == [due]
    # The loose scan reads a handful of index pages, not the ~100 of the 20000 future rows.
    plan = clocked.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT * FROM alk._claim('q', 'w', 1)"
                           ).fetchone()
    assert plan is not None
    assert plan[0][0]["Plan"]["Shared Hit Blocks"] + plan[0][0]["Plan"].get("Shared Read Blocks", 0) < 50


# 0009: wake-ups only for idle workers, none lost --------------------------------------


class IdleWorker:
    """The idle protocol of alk.wait_for_jobs, step by step, on its own connection."""

    def __init__(self, conn: psycopg.Connection, queue: str = "q") -> None:
        from psycopg import sql

        self.conn, self.queue = conn, queue
        channel = one(conn, "SELECT alk.queue_channel(%s)", queue)
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))

    def go_idle(self) -> list[int]:
        one(self.conn, "SELECT alk.wait_for_jobs(%s, 'idle')", self.queue)
        fence: list[int] = one(self.conn, "SELECT alk.wake_fence()")
        return fence

    def claim(self) -> list[int]:
        return [r[0] for r in self.conn.execute("SELECT id FROM alk.claim(%s, 'idle', 100)", [self.queue])]

    def notified(self, timeout: float) -> bool:
        return any(True for _ in self.conn.notifies(timeout=timeout, stop_after=1))


def test_a_busy_queue_never_notifies(db, connect):
    worker = IdleWorker(connect())
    enqueue(db)
    assert not worker.notified(0.3)
    worker.go_idle()
    one(worker.conn, "SELECT alk.stop_waiting('q', 'idle')")
    enqueue(db)
    assert not worker.notified(0.3)


def test_an_enqueue_after_the_advert_notifies_at_commit(db, connect):
    worker = IdleWorker(connect())
    worker.go_idle()
    assert worker.claim() == []
    with db.transaction():
        job_id = enqueue(db)
        assert not worker.notified(0.2)  # not before commit
    assert worker.notified(5)
    assert worker.claim() == [job_id]


@pytest.mark.parametrize("isolation", ["read committed", "repeatable read"])
def test_an_enqueue_straddling_the_advert_is_in_the_fence(connect, isolation):
    """The enqueue inserts before the advert commits and commits after the
    worker's claim: it saw no advert, so it does not notify, but it is in the
    worker's fence, and the claim after the fence passes finds its job."""
    worker = IdleWorker(connect())
    enqueuer = connect(autocommit=False)
    enqueuer.execute(f"SET TRANSACTION ISOLATION LEVEL {isolation}")
    job_id = enqueue(enqueuer)  # in flight, advert not yet there
    xid = one(enqueuer, "SELECT pg_current_xact_id()::text::bigint")
    fence = worker.go_idle()
    assert xid in fence
    assert worker.claim() == []
    assert one(worker.conn, "SELECT alk.wake_fence(%s::bigint[])", fence) != []  # still in flight
    enqueuer.commit()
    assert xid not in one(worker.conn, "SELECT alk.wake_fence(%s::bigint[])", fence)
    assert worker.claim() == [job_id]


def test_a_repeatable_read_enqueue_whose_snapshot_predates_the_advert_notifies(connect):
    """Its snapshot is older than the advert, its insert newer than the fence:
    only a notification can reach the worker, so it always sends one."""
    worker = IdleWorker(connect())
    enqueuer = connect(autocommit=False)
    enqueuer.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    enqueuer.execute("SELECT 1")  # the transaction snapshot, before the advert
    fence = worker.go_idle()
    job_id = enqueue(enqueuer)
    enqueuer.commit()
    assert worker.notified(5)
    assert worker.claim() == [job_id]
    assert fence == [] or isinstance(fence, list)


@pytest.mark.parametrize("rollback_share", [0.0, 0.3])
def test_no_wake_up_is_lost_under_concurrent_enqueues(connect, rollback_share):
    """Enqueuers commit (or roll back: a consuming enqueue that rolls back
    gives its advert back) at random moments around a worker that keeps
    going idle; the worker only claims after a notification or when its fence
    shrinks, never on a blind poll, and still gets every committed job."""
    import random
    import threading
    import time

    total = 300
    worker = IdleWorker(connect())
    enqueuers = [connect(autocommit=False) for _ in range(4)]
    committed: list[int] = []

    def produce(conn: psycopg.Connection, seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(total // len(enqueuers)):
            job_id = enqueue(conn)
            time.sleep(rng.random() * 0.004)
            if rng.random() < rollback_share:
                conn.rollback()
            else:
                conn.commit()
                committed.append(job_id)
            time.sleep(rng.random() * 0.004)

    threads = [threading.Thread(target=produce, args=(c, i)) for i, c in enumerate(enqueuers)]
    for t in threads:
        t.start()
    got: list[int] = []
    deadline = time.monotonic() + 60
    got += worker.claim()
    settled = False
    while not settled and time.monotonic() < deadline:
        # Every wait starts from a fresh advert and fence: a notification
        # consumed the last one, even when the claim after it was empty.
        fence = worker.go_idle()
        claimed = worker.claim()
        while not claimed and time.monotonic() < deadline:
            if worker.notified(0.005):
                claimed = worker.claim()
                break  # the advert is gone: advertise again before waiting again
            smaller = one(worker.conn, "SELECT alk.wake_fence(%s::bigint[])", fence)
            if len(smaller) < len(fence):
                claimed = worker.claim()
            fence = smaller
            if not fence and not claimed and all(not t.is_alive() for t in threads):
                claimed = worker.claim()
                if not claimed:
                    settled = True  # everything committed was claimed: nothing can be missing
                    break
        if claimed:
            one(worker.conn, "SELECT alk.stop_waiting('q', 'idle')")
        got += claimed
    for t in threads:
        t.join()
    assert sorted(got) == sorted(committed) and len(set(got)) == len(got)
    assert rollback_share or len(got) == total


# 0014: an advert is consumed by the enqueue that uses it --------------------------------


def adverts(db: psycopg.Connection, queue: str = "q") -> int:
    return int(one(db, "SELECT count(*) FROM alk.idle_workers WHERE queue = %s", queue))


def test_an_enqueue_consumes_the_advert_and_notifies_once(db, connect):
    worker = IdleWorker(connect())
    other = IdleWorker(connect())
    worker.go_idle()
    one(other.conn, "SELECT alk.wait_for_jobs('q', 'other')")
    first = enqueue(db)
    assert adverts(db) == 0  # one enqueue takes every advert of the queue
    assert worker.notified(5) and other.notified(5)  # NOTIFY reaches every listener anyway
    second = enqueue(db)
    assert not worker.notified(0.3)  # no advert: no NOTIFY, no notify lock
    assert worker.claim() == [first, second]
    worker.go_idle()  # advertised again: the next enqueue notifies again
    third = enqueue(db)
    assert worker.notified(5)
    assert worker.claim() == [third]


@pytest.mark.parametrize("wake", ["enqueue", "enqueue_batch", "release", "snooze", "requeue"])
def test_every_wake_path_consumes_the_advert(db, connect, wake):
    worker = IdleWorker(connect())
    job_id = enqueue(db)
    attempt = one(db, "SELECT attempts FROM alk.claim('q', 'w1', 1)")
    if wake == "requeue":
        assert one(db, "SELECT alk.fail(%s, 'w1', %s, 'x')", job_id, attempt) is True
    worker.go_idle()
    if wake == "enqueue":
        enqueue(db)
    elif wake == "enqueue_batch":
        db.execute("SELECT alk.enqueue_batch('q', ARRAY['{}'::jsonb, '{}'::jsonb])")
    elif wake == "release":
        assert one(db, "SELECT alk.release_jobs(ARRAY[%s]::bigint[], 'w1', ARRAY[%s]::bigint[])", job_id, attempt) == 1
    elif wake == "snooze":
        assert one(db, "SELECT alk.snooze(%s, 'w1', %s, 60)", job_id, attempt) is True
    else:
        assert one(db, "SELECT alk.requeue_dead('q')") == 1
    assert worker.notified(5)
    assert adverts(db) == 0


def test_concurrent_enqueues_never_wait_for_each_other_on_an_advert(db, connect):
    """One enqueue consumed the advert and keeps its transaction open: others
    wait for it at most alk._wake_held's 20 ms (statement_timeout would fail
    them otherwise), then notify themselves: the holder may never commit. The
    worker withdraws and advertises without waiting at all."""
    worker = IdleWorker(connect())
    worker.go_idle()
    holder = connect(autocommit=False)
    held = enqueue(holder)  # took the advert, holds its row lock until commit
    others = [connect() for _ in range(3)]
    for conn in others:
        conn.execute("SET statement_timeout = '2s'")
    worker.conn.execute("SET lock_timeout = '2s'")
    quick = [enqueue(conn) for conn in others]  # each would raise 57014 had it waited for the holder
    assert worker.notified(5)  # they saw the held advert: their own commits wake the worker
    assert sorted(worker.claim()) == sorted(quick)
    assert one(worker.conn, "SELECT alk.stop_waiting('q', 'idle')") is True  # held, not waited for
    assert one(worker.conn, "SELECT alk.wait_for_jobs('q', 'idle')")
    holder.commit()
    assert worker.notified(5)
    assert worker.claim() == [held]


def test_an_enqueue_beside_a_consuming_enqueue_that_rolls_back_still_wakes_the_worker(db, connect):
    """The advert's consumer rolls back: the advert is back and it sent
    nothing, but the enqueue that committed meanwhile notified."""
    worker = IdleWorker(connect())
    worker.go_idle()
    holder = connect(autocommit=False)
    enqueue(holder)  # takes the advert
    other = connect()
    other.execute("SET lock_timeout = '2s'")
    committed = enqueue(other)
    holder.rollback()
    assert adverts(db) == 1  # the consumer's delete rolled back with it
    assert worker.notified(5)
    assert worker.claim() == [committed]


# 0021: an enqueue that meets a held advert waits for its holder -------------------------


def wait_for_holders(db: psycopg.Connection, lock_timeout: str) -> None:
    """How long alk._wake_held waits for a holder (20 ms as installed): long
    here so the test, not the machine's speed, decides when the holder ends."""
    db.execute(f"ALTER FUNCTION alk._wake_held(text) SET lock_timeout = '{lock_timeout}'")


def enqueue_in_thread(connect) -> tuple[Any, dict[str, int], int]:
    import threading

    conn = connect()
    pid = one(conn, "SELECT pg_backend_pid()")
    result: dict[str, int] = {}
    thread = threading.Thread(target=lambda: result.setdefault("id", enqueue(conn)), daemon=True)
    thread.start()
    return thread, result, pid


def blocked_on_a_lock(db: psycopg.Connection, pid: int) -> bool:
    return one(db, "SELECT wait_event_type IS NOT DISTINCT FROM 'Lock' FROM pg_stat_activity WHERE pid = %s", pid)


def notifications_before_a_marker(worker: IdleWorker, db: psycopg.Connection) -> int:
    """Empty-payload notifications the worker received, counted up to a
    marker sent after them: notifications arrive in commit order."""
    channel = one(db, "SELECT alk.queue_channel(%s)", worker.queue)
    db.execute("SELECT pg_notify(%s, 'marker')", [channel])
    for before, note in enumerate(worker.conn.notifies(timeout=60)):
        if note.payload == "marker":
            return before
    raise AssertionError("the marker never arrived")


def test_an_enqueue_beside_a_consuming_enqueue_that_commits_waits_and_does_not_notify(db, connect):
    """The holder's commit covers the enqueue that waited for it: the holder
    notifies after the waiter's insert, so one notification (not two) reaches
    the worker, and its claim after it finds both jobs."""
    from tests.helpers import until

    wait_for_holders(db, "60s")
    worker = IdleWorker(connect())
    worker.go_idle()
    holder = connect(autocommit=False)
    held = enqueue(holder)  # took the advert
    thread, result, pid = enqueue_in_thread(connect)
    until(lambda: blocked_on_a_lock(db, pid), "the second enqueue waiting for the holder")
    holder.commit()
    thread.join(60)
    assert "id" in result
    assert notifications_before_a_marker(worker, db) == 1  # the holder's only
    assert worker.claim() == [held, result["id"]]


def test_an_enqueue_beside_a_consuming_enqueue_that_rolls_back_takes_the_advert(db, connect):
    """The holder rolls back: the advert comes back to the enqueue waiting for
    it, which consumes it and notifies at its own commit."""
    from tests.helpers import until

    wait_for_holders(db, "60s")
    worker = IdleWorker(connect())
    worker.go_idle()
    holder = connect(autocommit=False)
    enqueue(holder)
    thread, result, pid = enqueue_in_thread(connect)
    until(lambda: blocked_on_a_lock(db, pid), "the second enqueue waiting for the holder")
    holder.rollback()
    thread.join(60)
    assert "id" in result
    assert adverts(db) == 0  # consumed by the waiter, not left for the next enqueue
    assert notifications_before_a_marker(worker, db) == 1
    assert worker.claim() == [result["id"]]


def test_a_session_waits_once_for_a_holder_that_stays_open(db, connect):
    """A holder that outlasts the wait is an open transaction: the enqueue
    notifies, and its session's later enqueues notify at once for that holder
    instead of waiting again."""
    worker = IdleWorker(connect())
    worker.go_idle()
    holder = connect(autocommit=False)
    held = enqueue(holder)
    other = connect()
    wait_for_holders(db, "50ms")
    first = enqueue(other)  # waited 50 ms, then notified
    assert worker.notified(5)
    worker.go_idle()  # its advert is still the held one: nothing new to consume
    wait_for_holders(db, "60s")
    other.execute("SET statement_timeout = '5s'")
    second = enqueue(other)  # would wait 60 s (57014 after 5) for the same holder
    assert notifications_before_a_marker(worker, db) == 1
    assert worker.claim() == [first, second]
    holder.commit()
    assert worker.notified(5)
    assert worker.claim() == [held]
