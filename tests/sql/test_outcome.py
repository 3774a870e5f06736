"""Job outcomes announced on alk.outcome_channel (sql/queue/65_outcome.sql,
docs/queue.md "Waiting for a result"), checked through alk.* and LISTEN alone."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest
from psycopg import sql

from tests.conftest import pin_clock
from tests.helpers import one, raises_lk
from tests.sql.test_queue import NOW, claim, enqueue

#: A payload nobody else sends: what came before it on the channel is everything that was announced.
END = "end"


@pytest.fixture
def clocked(db: psycopg.Connection) -> psycopg.Connection:
    pin_clock(db, NOW)
    return db


def listen(connect: Callable[..., psycopg.Connection], queue: str = "q") -> psycopg.Connection:
    listener = connect()
    channel = one(listener, "SELECT alk.outcome_channel(%s)", queue)
    listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
    return listener


def announced(db: psycopg.Connection, listener: psycopg.Connection, queue: str = "q") -> list[str]:
    """The payloads announced on ``queue``'s outcome channel so far (ended by a NOTIFY of our own)."""
    db.execute("SELECT pg_notify(alk.outcome_channel(%s), %s)", [queue, END])
    payloads = []
    for notify in listener.notifies(timeout=30):
        if notify.payload == END:
            return payloads
        payloads.append(notify.payload)
    raise AssertionError(f"our own NOTIFY never came; got {payloads}")


def keep(db: psycopg.Connection, queue: str = "q") -> None:
    db.execute("SELECT alk.set_queue_retention(%s, 3600)", [queue])


def test_the_channel_is_named_like_the_queue_channel_and_checks_the_name(clocked):
    channel = one(clocked, "SELECT alk.outcome_channel('emails')")
    assert channel.startswith("alk_o_") and len(channel) == 38
    assert channel[6:] == one(clocked, "SELECT alk.queue_channel('emails')")[6:]
    with raises_lk("LK001"):
        one(clocked, "SELECT alk.outcome_channel('')")


def test_an_ack_on_a_retention_queue_announces_completed(clocked, connect):
    keep(clocked)
    listener = listen(connect)
    [row] = (enqueue(clocked), claim(clocked))[1]
    assert one(clocked, "SELECT alk.ack(%s, 'w1', %s, result => '7')", row["id"], row["attempts"])
    assert announced(clocked, listener) == [f"{row['id']} completed"]


def test_batch_acks_and_settle_announce_each_job(clocked, connect):
    keep(clocked)
    listener = listen(connect)
    ids = [enqueue(clocked) for _ in range(4)]
    rows = claim(clocked, 4)
    assert one(clocked, "SELECT alk.ack_batch(%s, 'w1', %s)", [r["id"] for r in rows[:2]],
               [r["attempts"] for r in rows[:2]]) == 2
    clocked.execute("SELECT * FROM alk.settle(%s, 'w1', %s, ARRAY['ack', 'fail'], ARRAY[NULL, 'boom'])",
                    [[r["id"] for r in rows[2:]], [r["attempts"] for r in rows[2:]]])
    # One statement's rows in any order; the two statements in commit order.
    got = announced(clocked, listener)
    assert sorted(got[:2]) == [f"{ids[0]} completed", f"{ids[1]} completed"]
    assert sorted(got[2:]) == [f"{ids[2]} completed", f"{ids[3]} dead"]


def test_every_burial_announces_dead(clocked, connect):
    keep(clocked)
    listener = listen(connect)
    # fail
    failed = enqueue(clocked)
    [row] = claim(clocked)
    assert one(clocked, "SELECT alk.fail(%s, 'w1', %s, 'bad')", failed, row["attempts"])
    # a retry with its attempts spent
    spent = enqueue(clocked, max_attempts=1)
    [row] = claim(clocked)
    assert one(clocked, "SELECT alk.retry(%s, 'w1', %s, 'again')", spent, row["attempts"])
    # the claim's burial of a lapsed job out of attempts
    lapsed = enqueue(clocked, max_attempts=1, visibility_timeout_s=10)
    claim(clocked)
    pin_clock(clocked, NOW + 60)
    assert claim(clocked) == []
    # the sweep's burial of an expired job
    expired = enqueue(clocked, expires=5)
    pin_clock(clocked, NOW + 120)
    assert one(clocked, "SELECT alk.sweep_expired('q')") >= 1
    assert announced(clocked, listener) == [f"{failed} dead", f"{spent} dead", f"{lapsed} dead", f"{expired} dead"]


def test_cancel_announces_cancelled_and_a_retry_announces_nothing(clocked, connect):
    keep(clocked)
    listener = listen(connect)
    pending = enqueue(clocked)
    assert one(clocked, "SELECT alk.cancel('q', %s)", pending)
    retried = enqueue(clocked)
    [row] = claim(clocked)
    assert one(clocked, "SELECT alk.retry(%s, 'w1', %s, 'later')", retried, row["attempts"])
    assert announced(clocked, listener) == [f"{pending} cancelled"]


def test_a_queue_without_retention_announces_nothing(clocked, connect):
    keep(clocked, "other")  # another queue's setting changes nothing here
    listener = listen(connect)
    for outcome in ("ack", "fail"):
        job_id = enqueue(clocked)
        [row] = claim(clocked)
        clocked.execute(f"SELECT alk.{outcome}(%s, 'w1', %s)", [job_id, row["attempts"]])
    assert one(clocked, "SELECT alk.cancel('q', %s)", enqueue(clocked))
    assert announced(clocked, listener) == []


def test_the_announcement_comes_at_commit_and_not_after_a_rollback(clocked, connect):
    keep(clocked)
    listener = listen(connect)
    job_id = enqueue(clocked)
    [row] = claim(clocked)
    with pytest.raises(psycopg.errors.RaiseException), clocked.transaction():
        clocked.execute("SELECT alk.fail(%s, 'w1', %s)", [job_id, row["attempts"]])
        clocked.execute("DO $$ BEGIN RAISE EXCEPTION 'roll back'; END $$")
    assert announced(clocked, listener) == []
    assert one(clocked, "SELECT state FROM alk.get_job('q', %s)", job_id) == "processing"
