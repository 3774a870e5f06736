"""Dependencies (alk.enqueue's after) and serial groups (group_key) together:
a job is claimable only when both allow it, its after jobs done and its group
with room; a job still waiting on its after jobs holds no place in its group
(docs/queue.md, "Limits and serial groups")."""

from __future__ import annotations

import psycopg
import pytest

from tests.conftest import pin_clock
from tests.helpers import one
from tests.sql.test_limits import ids, limit, next_claim_at
from tests.sql.test_queue import NOW, claim, enqueue


@pytest.fixture
def clocked(db: psycopg.Connection) -> psycopg.Connection:
    pin_clock(db, NOW)
    return db


def ack(db: psycopg.Connection, job_id: int, attempt: int = 1) -> bool:
    return one(db, "SELECT alk.ack(%s, 'w1', %s)", job_id, attempt)


def test_a_waiting_job_ahead_in_its_group_does_not_hold_back_the_job_it_waits_for(clocked):
    # child is ahead of parent in claim order (higher priority) and in the same
    # group: counted as ahead, it would block its own parent for ever.
    parent = enqueue(clocked, group_key="g")
    child = enqueue(clocked, group_key="g", priority=5, after=[parent])
    assert next_claim_at(clocked) == NOW
    assert ids(claim(clocked, 10)) == [parent]
    assert claim(clocked, 10) == []
    assert ack(clocked, parent) is True
    assert ids(claim(clocked, 10)) == [child]


def test_a_released_job_still_waits_for_room_in_its_group(clocked):
    parent = enqueue(clocked)
    running = enqueue(clocked, group_key="g")
    child = enqueue(clocked, group_key="g", after=[parent])
    assert ids(claim(clocked, 10)) == [parent, running]
    assert ack(clocked, parent) is True  # child's after jobs are done, but g is full
    assert claim(clocked, 10) == []
    assert next_claim_at(clocked) == NOW + 301  # not due-and-claimable: the lease's end
    assert ack(clocked, running) is True
    assert ids(claim(clocked, 10)) == [child]


def test_per_group_room_counts_neither_waiting_jobs_nor_lets_them_through(clocked):
    limit(clocked, per_group=2)
    parent = enqueue(clocked)
    waiting = [enqueue(clocked, group_key="g", priority=9, after=[parent]) for _ in range(3)]
    free = [enqueue(clocked, group_key="g") for _ in range(3)]
    # Three waiting jobs ahead of the free ones hold no place: two free ones run.
    assert ids(claim(clocked, 10)) == [parent, *free[:2]]
    assert ack(clocked, parent) is True
    assert claim(clocked, 10) == []  # released, ahead now, but g has 2 running
    assert ack(clocked, free[0]) is True
    assert ids(claim(clocked, 10)) == [waiting[0]]  # one place freed; claim order among the due
