"""alk.snooze (docs/contract.md#claimed-jobs): a claimed job back to pending
at now + delay, its attempt refunded, its token dead for good; checked
through alk.* alone, on a pinned clock."""

from __future__ import annotations

import psycopg
import pytest

from tests.conftest import pin_clock
from tests.helpers import one
from tests.sql.test_queue import MAX, MIN, NOW, claim, enqueue, job

SNOOZE = "SELECT alk.snooze(%s, %s, %s, %s)"


@pytest.fixture
def clocked(db: psycopg.Connection) -> psycopg.Connection:
    pin_clock(db, NOW)
    return db


def test_snooze_returns_the_job_to_pending_later_without_spending_its_attempt(clocked):
    job_id = enqueue(clocked, max_attempts=1, run_at=NOW - 5)
    claim(clocked)
    assert one(clocked, SNOOZE, job_id, "w1", 1, 30) is True
    row = job(clocked, job_id)
    assert row is not None
    assert (row["state"], row["worker_id"], row["claimed_at"], row["claim_expires_at"], row["run_at"]) == (
        "pending", None, None, None, NOW + 30)
    # The token stays issued (attempts only grows), its attempt is refunded:
    # spent = attempts - attempts_refunded is back to 0.
    assert (row["attempts"], row["attempts_refunded"], row["last_error"]) == (1, 1, None)
    assert claim(clocked) == []  # not due before now + delay
    pin_clock(clocked, NOW + 30)
    again = claim(clocked)[0]  # max_attempts 1 and not buried: the attempt came back
    assert (again["id"], again["attempts"], again["attempts_refunded"]) == (job_id, 2, 1)
    assert one(clocked, "SELECT alk.ack(%s, 'w1', 2)", job_id) is True


def test_the_old_token_is_refused_after_a_snooze_and_after_the_next_claim(clocked):
    job_id = enqueue(clocked)
    claim(clocked)
    assert one(clocked, SNOOZE, job_id, "w1", 1, 0) is True
    for op in ("alk.ack(%s, 'w1', 1)", "alk.retry(%s, 'w1', 1)", "alk.fail(%s, 'w1', 1)",
               "alk.heartbeat(%s, 'w1', 1)", "alk.snooze(%s, 'w1', 1, 0)"):
        assert one(clocked, f"SELECT {op}", job_id) is False, op  # pending: nobody holds it
    assert claim(clocked)[0]["attempts"] == 2
    for op in ("alk.ack(%s, 'w1', 1)", "alk.snooze(%s, 'w1', 1, 0)"):
        assert one(clocked, f"SELECT {op}", job_id) is False, op  # held again, under token 2
    assert job(clocked, job_id)["state"] == "processing"
    assert one(clocked, SNOOZE, job_id, "w1", 2, 0) is True
    assert (job(clocked, job_id)["attempts"], job(clocked, job_id)["attempts_refunded"]) == (2, 2)


def test_snooze_refuses_a_claim_that_is_not_valid_and_changes_nothing(db):
    pin_clock(db, NOW)
    job_id = enqueue(db, visibility_timeout_s=10)
    claim(db, worker="a")
    held = job(db, job_id)
    assert one(db, SNOOZE, job_id, "b", 1, 0) is False  # another worker
    assert one(db, SNOOZE, job_id, "a", 2, 0) is False  # a token never issued
    assert one(db, "SELECT alk.snooze(%s, 'a', 1, 0, queue => 'other')", job_id) is False
    assert one(db, SNOOZE, job_id + 1000, "a", 1, 0) is False  # no such job
    assert job(db, job_id) == held
    pin_clock(db, NOW + 11)  # the lease lapsed
    assert one(db, SNOOZE, job_id, "a", 1, 0) is False
    assert job(db, job_id) == held
    again = claim(db, worker="a")[0]  # the same worker id, a new token
    assert one(db, SNOOZE, job_id, "a", 1, 0) is False  # the stale handler
    assert job(db, job_id) == again


def test_snooze_at_the_lease_boundary_second_is_still_valid(db):
    pin_clock(db, NOW)
    job_id = enqueue(db, visibility_timeout_s=10)
    claim(db)
    pin_clock(db, NOW + 10)  # claim_expires_at == now: still held
    assert one(db, SNOOZE, job_id, "w1", 1, 5) is True
    assert job(db, job_id)["run_at"] == NOW + 15


def test_a_dead_job_is_not_snoozed(clocked):
    job_id = enqueue(clocked)
    claim(clocked)
    assert one(clocked, "SELECT alk.fail(%s, 'w1', 1)", job_id) is True
    assert one(clocked, SNOOZE, job_id, "w1", 1, 0) is False
    assert job(clocked, job_id)["state"] == "dead"


def test_a_null_attempt_skips_the_token_check_only(clocked):
    job_id = enqueue(clocked)
    claim(clocked)
    assert one(clocked, SNOOZE, job_id, "w2", None, 0) is False  # worker still checked
    assert one(clocked, SNOOZE, job_id, "w1", None, 0) is True


@pytest.mark.parametrize(("delay", "run_at"), [(0, NOW), (None, NOW), (-5, NOW - 5), (MIN, NOW + MIN)])
def test_a_zero_null_or_negative_delay_is_due_at_once(clocked, delay, run_at):
    job_id = enqueue(clocked)
    claim(clocked)
    assert one(clocked, SNOOZE, job_id, "w1", 1, delay) is True
    assert job(clocked, job_id)["run_at"] == run_at
    assert claim(clocked)[0]["id"] == job_id


def test_a_snoozed_job_takes_its_new_place_in_claim_order(clocked):
    first = enqueue(clocked, run_at=NOW - 10)
    second = enqueue(clocked, run_at=NOW - 5)
    claim(clocked)
    assert one(clocked, SNOOZE, first, "w1", 1, 0) is True  # run_at now: behind second
    assert [c["id"] for c in claim(clocked, 2)] == [second, first]


@pytest.mark.parametrize(
    ("clock", "delay", "run_at"),
    [
        (NOW, MAX, MAX),
        (MAX - 1, 2, MAX),
        (MAX, MAX, MAX),
        (MIN + 1, -2, MIN),
        (MIN, MIN, MIN),
        (MIN, MAX, MIN + MAX),  # sums that fit stay exact
    ],
)
def test_snooze_delay_saturates_at_the_bigint_edges(db, clock, delay, run_at):
    pin_clock(db, clock)
    job_id = enqueue(db, visibility_timeout_s=0)  # lease until the claim's own second: no overflow
    claim(db)
    assert one(db, SNOOZE, job_id, "w1", 1, delay) is True
    assert job(db, job_id)["run_at"] == run_at
    assert one(db, "SELECT alk.next_claim_at('q')") == max(run_at, clock)  # due: now
