"""A settle that frees a max_running slot wakes the queue's idle workers
(alk._wake_freed, docs/queue.md "Limits and serial groups"): a worker that
waits idle (alk.wait_for_jobs, LISTEN on its own connection) is notified when
an ack, ack_batch, settle, retry, fail, settle_and_claim or cancel frees a
slot while a due job waits, and is not when the queue has no max_running,
nothing waits, settle_and_claim's own claim took the slot or its caller is
the only worker idle. Without an idle advert nothing is notified at all."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest
from psycopg import sql

from tests.helpers import one
from tests.sql.test_limits import limit
from tests.sql.test_queue import claim, enqueue
from tests.sql.test_worker import Listener, channel_of

#: Each settle form, freeing the slot of the held job (id, token).
SETTLES: dict[str, str] = {
    "ack": "SELECT alk.ack(%(id)s, 'w1', %(attempt)s)",
    "ack with its queue": "SELECT alk.ack(%(id)s, 'w1', %(attempt)s, 'q')",
    "ack_batch": "SELECT alk.ack_batch(ARRAY[%(id)s]::bigint[], 'w1', ARRAY[%(attempt)s]::bigint[])",
    "settle": "SELECT * FROM alk.settle(ARRAY[%(id)s]::bigint[], 'w1', ARRAY[%(attempt)s]::bigint[])",
    "settle with its queue": "SELECT * FROM alk.settle(ARRAY[%(id)s]::bigint[], 'w1', ARRAY[%(attempt)s]::bigint[],"
                             " queue => 'q')",
    "retry": "SELECT alk.retry(%(id)s, 'w1', %(attempt)s, 'later', 3600)",
    "fail": "SELECT alk.fail(%(id)s, 'w1', %(attempt)s, 'bad')",
    "settle_and_claim of none": "SELECT * FROM alk.settle_and_claim('q', 'w1', 0, ARRAY[%(id)s]::bigint[],"
                                " ARRAY[%(attempt)s]::bigint[])",
    "cancel": "SELECT alk.cancel('q', %(id)s)",
}


@pytest.fixture
def listen(connect: Callable[..., psycopg.Connection]) -> Callable[..., Listener]:
    return lambda *queues: Listener(connect(), *queues)


def full_queue(db: psycopg.Connection, waiting: int = 1) -> dict[str, int]:
    """Queue q at max_running 1: one job held by w1, ``waiting`` due behind it."""
    limit(db, max_running=1)
    held = enqueue(db)
    for _ in range(waiting):
        enqueue(db)
    [job] = claim(db, 10)
    assert job["id"] == held
    return {"id": held, "attempt": job["attempts"]}


@pytest.mark.parametrize("form", list(SETTLES))
def test_a_settle_that_frees_a_slot_wakes_the_idle_workers(db, listen, form):
    held = full_queue(db)
    listener = listen("q")  # waits idle from here: the enqueues above woke nobody
    db.execute(SETTLES[form], held)
    assert listener.heard(db) == [("q", "")]


def test_a_job_claimed_before_max_running_was_set_wakes_them_too(db, listen):
    held = enqueue(db)
    enqueue(db)
    [job] = claim(db)
    assert job["id"] == held
    limit(db, max_running=1)  # marks the running job: it holds the one slot
    listener = listen("q")
    assert one(db, SETTLES["ack"], id=held, attempt=1) is True
    assert listener.heard(db) == [("q", "")]


def test_an_ack_kept_as_completed_wakes_them_too(db, listen):
    db.execute("SELECT alk.set_queue_retention('q', 3600)")
    held = full_queue(db)
    listener = listen("q")
    assert one(db, SETTLES["ack"], **held) is True
    assert listener.heard(db) == [("q", "")]


@pytest.mark.parametrize("form", ["ack", "settle", "cancel"])
def test_without_max_running_a_settle_wakes_nobody(db, listen, form):
    limit(db, rate=100, rate_period_s=60)  # a limits row, but no max_running
    held = enqueue(db)
    enqueue(db)
    [job] = claim(db)
    assert job["id"] == held
    listener = listen("q")
    db.execute(SETTLES[form], {"id": held, "attempt": 1})
    assert listener.heard(db) == []


def test_without_limits_a_settle_wakes_nobody(db, listen):
    held = enqueue(db)
    enqueue(db)
    claim(db)
    listener = listen("q")
    assert one(db, SETTLES["ack"], id=held, attempt=1) is True
    assert listener.heard(db) == []


def test_a_freed_slot_with_no_due_job_wakes_nobody(db, listen):
    held = full_queue(db, waiting=0)
    enqueue(db, delay=3600)  # waits for its run_at, not for the slot
    listener = listen("q")
    assert one(db, SETTLES["ack"], **held) is True
    assert listener.heard(db) == []


def test_a_slot_that_settle_and_claim_fills_again_wakes_nobody(db, listen):
    held = full_queue(db, waiting=2)
    listener = listen("q")
    rows = db.execute("SELECT kind, id FROM alk.settle_and_claim('q', 'w1', 10, ARRAY[%(id)s]::bigint[],"
                      " ARRAY[%(attempt)s]::bigint[])", held).fetchall()
    assert [kind for kind, _ in rows] == ["settled", "claimed"]  # max_running 1: one claimed
    assert listener.heard(db) == []


@pytest.mark.parametrize(("idle", "woken"), [("w2", True), ("w1", False)])
def test_settle_and_claim_wakes_the_other_idle_workers_not_its_caller(db, connect, idle, woken):
    """A slot stays free after the caller's claim (it asked for one of two),
    and a due job waits: another idle worker is woken, the caller's own
    advert is not (its claim, after its settle, took what it asked for)."""
    limit(db, max_running=2)
    for _ in range(4):
        enqueue(db)
    held = claim(db, 2)
    listener = Listener(connect(), "q", worker_id=idle)
    rows = db.execute("SELECT kind FROM alk.settle_and_claim('q', 'w1', 1, %s::bigint[], %s::bigint[])",
                      [[j["id"] for j in held], [j["attempts"] for j in held]]).fetchall()
    assert [kind for (kind,) in rows] == ["settled", "settled", "claimed"]
    assert listener.heard(db) == ([("q", "")] if woken else [])


def test_an_idle_worker_of_another_queue_is_not_woken(db, listen):
    held = full_queue(db)
    listener = listen("other")
    assert one(db, SETTLES["ack"], **held) is True
    assert listener.heard(db) == []


def test_without_an_idle_advert_nothing_is_notified(db, connect):
    """A busy system pays no NOTIFY: a LISTEN with no advert hears nothing."""
    held = full_queue(db)
    ear = connect()
    for queue in ("q", "sentinel"):
        ear.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel_of(queue))))
    assert one(db, SETTLES["ack"], **held) is True
    db.execute("SELECT pg_notify(%s, '')", [channel_of("sentinel")])  # delivered after anything the ack sent
    heard = [n.channel for n in ear.notifies(timeout=10, stop_after=1)]
    assert heard == [channel_of("sentinel")]


def test_the_woken_worker_claims_the_freed_slot(db, connect, listen):
    """The whole round with two connections: the idle worker, notified,
    claims the job that waited for the slot."""
    held = full_queue(db)
    worker = connect()
    listener = listen("q")
    assert one(db, SETTLES["ack"], **held) is True
    assert listener.heard(db) == [("q", "")]
    assert len(claim(worker, 10, worker="w2")) == 1
