"""The outbox end to end, with real connections and threads: a message exists
if and only if its business transaction commits, and a committed message is
delivered exactly once by many concurrent runners."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import psycopg

from pyalk import Alk, JobHandle
from tests.conftest import pin_clock

NOW = 1_700_000_000
RUNNERS = 8


def _orders_table(db: psycopg.Connection) -> None:
    db.execute("CREATE TABLE public.orders (id bigint PRIMARY KEY, total numeric NOT NULL)")


def _drain(connect: Callable[..., psycopg.Connection], runners: int) -> list[int]:
    """Run ``runners`` threads, each on its own connection, calling run_once
    until it finds nothing; the order ids delivered, in delivery order."""
    clients = [Alk(connect()) for _ in range(runners)]
    delivered: list[int] = []
    guard = threading.Lock()
    barrier = threading.Barrier(runners)

    def deliver(message: JobHandle) -> None:
        with guard:
            delivered.append(message.payload["order"])

    def run(index: int) -> int:
        outbox = clients[index].outbox("orders")
        barrier.wait()
        runs = 0
        while outbox.run_once(f"relay-{index}", deliver):
            runs += 1
        return runs

    with ThreadPoolExecutor(runners) as pool:
        runs = list(pool.map(run, range(runners)))
    assert sum(runs) == len(delivered)
    return delivered


def test_a_rolled_back_business_transaction_delivers_nothing(
    db: psycopg.Connection, connect: Callable[..., psycopg.Connection]
) -> None:
    _orders_table(db)
    business = connect(autocommit=False)
    outbox = Alk(db).outbox("orders")
    with business.cursor() as cursor:
        cursor.execute("INSERT INTO public.orders VALUES (1, 9.50)")
        outbox.enqueue({"order": 1}, conn=business)
        outbox.enqueue_batch([{"order": 2}, {"order": 3}], conn=business)
    business.rollback()

    assert _drain(connect, RUNNERS) == []
    assert db.execute("SELECT count(*) FROM alk.jobs").fetchone() == (0,)
    assert db.execute("SELECT count(*) FROM public.orders").fetchone() == (0,)


def test_a_committed_business_transaction_delivers_each_message_exactly_once(
    db: psycopg.Connection, connect: Callable[..., psycopg.Connection]
) -> None:
    _orders_table(db)
    business = connect(autocommit=False)
    outbox = Alk(db).outbox("orders")
    orders = list(range(1, 301))
    with business.transaction():
        for order in orders[:20]:
            business.execute("INSERT INTO public.orders VALUES (%s, 1)", [order])
            outbox.enqueue({"order": order}, conn=business)
        outbox.enqueue_batch([{"order": order} for order in orders[20:]], conn=business)
        # Nothing is visible to the runners before the commit.
        assert _drain(connect, 2) == []

    delivered = _drain(connect, RUNNERS)
    assert Counter(delivered) == Counter(orders)  # all of them, none twice
    assert db.execute("SELECT count(*) FROM alk.jobs").fetchone() == (0,)  # every one acked


def test_a_failing_delivery_backs_off_5_10_20_40_then_dies(db: psycopg.Connection) -> None:
    pin_clock(db, NOW)
    outbox = Alk(db).outbox("orders")
    job_id = outbox.enqueue({"order": 1})
    attempts: list[int] = []

    def refuse(message: JobHandle) -> None:
        attempts.append(message.job.attempts)
        raise ConnectionError("upstream said 503")

    def row() -> tuple[str, int, str | None]:
        found = db.execute("SELECT state, run_at, last_error FROM alk.jobs WHERE id = %s", [job_id]).fetchone()
        assert found is not None
        return found

    now = NOW
    for backoff in (5, 10, 20, 40):
        pin_clock(db, now)
        assert outbox.run_once("relay", refuse) is True
        assert row() == ("pending", now + backoff, None)
        pin_clock(db, now + backoff - 1)
        assert outbox.run_once("relay", refuse) is False  # not due yet
        now += backoff
    pin_clock(db, now)
    assert outbox.run_once("relay", refuse) is True
    assert row()[0::2] == ("dead", "upstream said 503")
    assert attempts == [1, 2, 3, 4, 5]
    pin_clock(db, now + 10**6)
    assert outbox.run_once("relay", refuse) is False  # dead stays dead
