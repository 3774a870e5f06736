"""Transactional forms (docs/contract.md#transactions): the caller's connection, the caller's
transaction. pyalk never commits or rolls back a connection it was given, a
rolled-back transaction leaves no trace, and claims refuse to join one.
SQLAlchemy users call alk.* through text() (docs/transactions.md)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Generator

import psycopg
import pytest
import sqlalchemy
from psycopg.pq import TransactionStatus
from sqlalchemy.orm import Session

import pyalk
from pyalk import AsyncAlk, AsyncJobHandle, ClaimInTransaction, InvalidName


class Rollback(Exception):
    """Raised inside a transaction block to roll it back."""


@pytest.fixture
async def alk(dsn: str) -> AsyncIterator[AsyncAlk]:
    async with AsyncAlk(dsn) as client:
        yield client


@pytest.fixture
async def business(dsn: str) -> AsyncIterator[psycopg.AsyncConnection]:
    """The application's own connection, transactions under its control."""
    conn = await psycopg.AsyncConnection.connect(dsn)
    yield conn
    await conn.close()


def jobs(db: psycopg.Connection) -> list[tuple[str, object]]:
    return db.execute("SELECT queue, payload FROM alk.jobs ORDER BY id").fetchall()


async def test_a_rolled_back_transaction_leaves_no_trace(alk, business, db):
    with pytest.raises(Rollback):
        async with business.transaction():
            await business.execute("CREATE TABLE public.orders (id int)")
            await alk.queue("emails").enqueue("one", conn=business)
            await alk.queue("emails").enqueue_batch(["two", "three"], conn=business)
            await alk.outbox("billing").enqueue("four", conn=business)
            await alk.outbox("billing").enqueue_batch(["five"], conn=business)
            raise Rollback
    assert jobs(db) == []
    assert db.execute("SELECT to_regclass('public.orders')").fetchone() == (None,)


async def test_a_committed_transaction_keeps_every_write(alk, business, db):
    async with business.transaction():
        await alk.queue("emails").enqueue("one", conn=business)
        await alk.outbox("billing").enqueue_batch(["two", "three"], conn=business)
    assert jobs(db) == [("emails", "one"), ("alk:outbox:billing", "two"), ("alk:outbox:billing", "three")]


async def test_the_wrapper_never_commits_or_rolls_back_the_callers_connection(alk, business, db):
    job_id = await alk.queue("emails").enqueue("mine", conn=business)
    await alk.outbox("billing").enqueue("mine too", conn=business)
    assert business.info.transaction_status == TransactionStatus.INTRANS
    # The caller's transaction sees its own writes; nobody else does yet.
    job = await alk.queue("emails").get_job(job_id, conn=business)
    assert job is not None and job.payload == "mine"
    assert await alk.queue("emails").get_job(job_id) is None
    assert jobs(db) == []
    # A refused call leaves the transaction failed, for the caller to end.
    with pytest.raises(InvalidName):
        await alk.outbox("alk:reserved").enqueue("x", conn=business)
    assert business.info.transaction_status == TransactionStatus.INERROR
    await business.rollback()
    assert jobs(db) == []
    await alk.outbox("billing").enqueue("after", conn=business)
    await business.commit()
    assert jobs(db) == [("alk:outbox:billing", "after")]


async def test_a_client_on_a_connection_in_a_transaction_joins_it_for_writes_and_refuses_claims(
    alk, business, db
):
    await alk.outbox("billing").enqueue("ready")
    await alk.queue("emails").enqueue("ready")
    await business.execute("SELECT 1")  # a business transaction is open
    inside = AsyncAlk(business)

    async def deliver(message: AsyncJobHandle) -> None:
        raise AssertionError("nothing may be claimed inside a business transaction")

    for claim in (
        lambda: inside.queue("emails").claim_one("w"),
        lambda: inside.outbox("billing").claim_one("w"),
        lambda: inside.outbox("billing").run_once("w", deliver),
        lambda: inside.try_lock("report", "w", 60),
    ):
        with pytest.raises(ClaimInTransaction):
            await claim()
    # Writes join the open transaction and go with it.
    await inside.outbox("billing").enqueue("joined")
    assert business.info.transaction_status == TransactionStatus.INTRANS
    await business.rollback()
    assert jobs(db) == [("alk:outbox:billing", "ready"), ("emails", "ready")]
    assert db.execute("SELECT count(*) FROM alk.jobs WHERE state = 'processing'").fetchone() == (0,)
    assert db.execute("SELECT count(*) FROM alk.locks").fetchone() == (0,)


async def test_a_client_on_an_idle_connection_claims_in_its_own_short_transaction(business, db):
    idle = AsyncAlk(business)
    await idle.outbox("billing").enqueue("hello")  # its own transaction, committed
    delivered = []

    async def deliver(message: AsyncJobHandle) -> None:
        delivered.append(message.payload)

    assert await idle.outbox("billing").run_once("w", deliver) is True
    assert delivered == ["hello"]
    assert business.info.transaction_status == TransactionStatus.IDLE
    assert jobs(db) == []


# SQLAlchemy (sync) -------------------------------------------------------------


@pytest.fixture
def engine(dsn: str) -> Generator[sqlalchemy.Engine, None, None]:
    engine = sqlalchemy.create_engine(
        "postgresql+psycopg://", creator=lambda: psycopg.connect(dsn), poolclass=sqlalchemy.NullPool
    )
    with engine.begin() as conn:
        conn.execute(sqlalchemy.text("CREATE TABLE public.invoices (id int PRIMARY KEY, paid boolean NOT NULL)"))
    yield engine
    engine.dispose()


OUTBOX_ENQUEUE = sqlalchemy.text("SELECT alk.outbox_enqueue(outbox => :outbox, payload => CAST(:payload AS jsonb))")


async def test_sqlalchemy_session_text_calls_join_the_session_transaction(alk, engine, db):
    with pytest.raises(Rollback), Session(engine) as session, session.begin():
        session.execute(sqlalchemy.text("INSERT INTO public.invoices VALUES (1, true)"))
        session.execute(OUTBOX_ENQUEUE, {"outbox": "billing", "payload": json.dumps({"invoice": 1})})
        raise Rollback
    assert jobs(db) == []

    with Session(engine) as session, session.begin():
        session.execute(sqlalchemy.text("INSERT INTO public.invoices VALUES (2, true)"))
        params = {"outbox": "billing", "payload": json.dumps({"invoice": 2})}
        job_id = session.execute(OUTBOX_ENQUEUE, params).scalar_one()
    assert isinstance(job_id, int)

    delivered = []

    async def deliver(message: AsyncJobHandle) -> None:
        delivered.append(message.payload)

    assert await alk.outbox("billing").run_once("relay", deliver) is True
    assert await alk.outbox("billing").run_once("relay", deliver) is False
    assert delivered == [{"invoice": 2}]


async def test_sqlalchemy_connection_text_calls_join_the_connection_transaction(alk, engine, db):
    with pytest.raises(Rollback), engine.begin() as conn:
        conn.execute(sqlalchemy.text("SELECT alk.enqueue(queue => :queue, payload => CAST(:payload AS jsonb))"),
                     {"queue": "emails", "payload": '"gone"'})
        raise Rollback
    with engine.begin() as conn:
        ids = conn.execute(sqlalchemy.text("SELECT * FROM alk.enqueue_batch(:queue, CAST(:payloads AS jsonb[]))"),
                           {"queue": "emails", "payloads": ['"a"', '"b"']}).scalars().all()
    assert len(ids) == 2
    handle = await alk.queue("emails").claim_one("w")
    assert handle is not None and handle.payload == "a"


# A sync SQLAlchemy Session lends its psycopg connection to the sync client only,
# so this test is written once, here, with pyalk.Alk; the generated twin skips
# defining it (it would be the same test).
if "._async." in f".{__name__}.":

    def test_sqlalchemy_session_lends_its_psycopg_connection_to_conn(engine, db):
        with pyalk.Alk(db) as client:
            with pytest.raises(Rollback), Session(engine) as session, session.begin():
                session.execute(sqlalchemy.text("UPDATE public.invoices SET paid = true"))
                raw = session.connection().connection.driver_connection
                assert isinstance(raw, psycopg.Connection)
                client.outbox("billing").enqueue({"invoice": 3}, conn=raw)
                raise Rollback
            assert jobs(db) == []
            with Session(engine) as session, session.begin():
                raw = session.connection().connection.driver_connection
                client.outbox("billing").enqueue({"invoice": 4}, conn=raw)
                client.queue("emails").enqueue({"invoice": 4}, conn=raw)
            assert jobs(db) == [("alk:outbox:billing", {"invoice": 4}), ("emails", {"invoice": 4})]
