"""The queue's rules (CONTRACT.md §0, §1), checked through alk.* alone."""

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
def test_int4_columns_refuse_out_of_range_values(clocked, argument, value):
    code, message = sqlstate_of(clocked, f"SELECT alk.enqueue('q', '1', {argument} => %s)", value)
    assert code == "LK002"
    assert argument in message and str(value) in message
    assert count_jobs(clocked) == 0


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
    assert one(clocked, "SELECT alk.get_job('q', 424242) IS NULL") is True


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
