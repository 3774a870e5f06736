"""The queue wrapper: binding, decoding and refusing bad input before sending."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import AsyncIterator
from datetime import timedelta

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from pyalk import AsyncAlk, CodecError, InvalidArgument, InvalidName, Job, QueueLimits, QueueOpts
from tests.conftest import pin_clock


@pytest.fixture
async def alk(dsn: str) -> AsyncIterator[AsyncAlk]:
    async with AsyncAlk(dsn) as client:
        yield client


def jobs_in(db: psycopg.Connection) -> int:
    return db.execute("SELECT count(*) FROM alk.jobs").fetchone()[0]


async def test_enqueue_claim_ack_round_trip(alk, db):
    queue = alk.queue("emails")
    job_id = await queue.enqueue({"to": "ada", "n": [1, 2.5, None]}, priority=3)
    handle = await queue.claim_one("worker-1")
    assert handle is not None
    assert handle.id == job_id
    assert handle.payload == {"to": "ada", "n": [1, 2.5, None]}
    assert isinstance(handle.job, Job)
    assert (handle.job.state, handle.job.attempts, handle.job.priority, handle.job.worker_id) == (
        "processing", 1, 3, "worker-1")
    assert await handle.ack() is True
    assert await handle.ack() is False
    assert await queue.get_job(job_id) is None
    assert await queue.claim_one("worker-1") is None


async def test_job_is_frozen(alk):
    queue = alk.queue("q")
    job = await queue.get_job(await queue.enqueue(1))
    assert job is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.state = "dead"  # type: ignore[misc]


async def test_queue_opts_stamp_every_enqueue_and_call_options_win(alk):
    queue = alk.queue("q", QueueOpts(visibility_timeout_s=30, max_attempts=9, backoff_base_s=2,
                                     dead_letter_retention_s=60))
    job = await queue.get_job(await queue.enqueue("x"))
    assert job is not None
    assert (job.visibility_timeout_s, job.max_attempts, job.backoff_base_s, job.dead_letter_retention_s) == (
        30, 9, 2, 60)
    job = await queue.get_job(await queue.enqueue("x", max_attempts=1))
    assert job is not None and job.max_attempts == 1
    plain = await alk.queue("p").get_job(await alk.queue("p").enqueue("x"))
    assert plain is not None
    assert (plain.visibility_timeout_s, plain.max_attempts, plain.backoff_base_s) == (300, 3, 5)


async def test_enqueue_options_reach_the_row(alk, db):
    pin_clock(db, 0)  # the wrapper's pool connections run on the wall clock
    queue = alk.queue("q")
    job = await queue.get_job(await queue.enqueue(1, run_at=123, expires=50))
    assert job is not None
    assert job.run_at == 123
    assert job.expires_at is not None and job.expires_at - job.created_at == 50
    job = await queue.get_job(await queue.enqueue(1, delay=10, run_at=5))
    assert job is not None and job.run_at == job.created_at + 10


async def test_enqueue_batch_returns_ids_in_order(alk):
    queue = alk.queue("q")
    ids = await queue.enqueue_batch([{"i": i} for i in range(50)], priority=1)
    assert len(ids) == 50
    handles = await queue.claim_batch("w", 100)
    assert [h.id for h in handles] == ids
    assert [h.payload["i"] for h in handles] == list(range(50))
    assert await queue.enqueue_batch([]) == []


async def test_claim_batch_extent_and_ack_batch(alk):
    queue = alk.queue("q")
    await queue.enqueue_batch([1, 2, 3, 4])
    assert await queue.claim_batch("w", 0) == []
    assert await queue.claim_batch("w", -1) == []
    handles = await queue.claim_batch("w", 3)
    assert len(handles) == 3
    assert await queue.ack_batch("w", [handles[0], handles[1].job, handles[2].id]) == 3
    assert await queue.ack_batch("w", handles) == 0


async def test_retry_fail_heartbeat_through_the_handle(alk):
    queue = alk.queue("q")
    first, second = await queue.enqueue_batch(["a", "b"])
    handles = {h.id: h for h in await queue.claim_batch("w", 2)}
    assert await handles[first].heartbeat(600) is True
    assert await handles[first].retry("temporary", delay=0) is True
    job = await queue.get_job(first)
    assert job is not None and (job.state, job.last_error, job.worker_id) == ("pending", None, None)
    assert await handles[second].fail("permanent") is True
    job = await queue.get_job(second)
    assert job is not None and (job.state, job.last_error) == ("dead", "permanent")
    assert await handles[second].retry() is False  # dead: the claim is gone


async def test_snooze_through_the_handle_refunds_the_attempt_and_fences_the_token(dsn):
    connection = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    pin = "SELECT set_config('alk.now', %s, false)"
    await connection.execute(pin, ["1700000000"])
    try:
        queue = AsyncAlk(connection).queue("q", QueueOpts(max_attempts=1))
        job_id = await queue.enqueue("x")
        handle = await queue.claim_one("w")
        assert handle is not None
        assert await handle.snooze(timedelta(seconds=29, milliseconds=1)) is True  # rounds up, as every duration
        job = await queue.get_job(job_id)
        assert job is not None
        assert (job.state, job.worker_id, job.run_at, job.attempts, job.attempts_refunded, job.attempts_spent) == (
            "pending", None, 1_700_000_030, 1, 1, 0)
        assert await handle.snooze(0) is False  # its token is dead
        assert await handle.ack() is False
        assert await queue.claim_one("w") is None  # not due yet
        await connection.execute(pin, ["1700000030"])
        again = await queue.claim_one("w")  # max_attempts 1, and not buried: the attempt came back
        assert again is not None and (again.id, again.job.attempts) == (job_id, 2)
        assert await handle.snooze(-10) is False  # the old handle, after the next claim
        assert await again.snooze(-10) is True  # due at once
        with pytest.raises(InvalidArgument, match="seconds"):
            await again.snooze(1.5)  # type: ignore[arg-type]
    finally:
        await connection.close()


async def test_stale_handle_is_fenced_off_after_a_reclaim(alk):
    queue = alk.queue("q")
    await queue.enqueue("x")
    stale = await queue.claim_one("same-worker")
    assert stale is not None
    assert await stale.heartbeat(-5) is True  # voids its own lease
    fresh = await queue.claim_one("same-worker")
    assert stale is not None and fresh is not None
    assert (stale.id, stale.job.attempts, fresh.job.attempts) == (fresh.id, 1, 2)
    assert await fresh.heartbeat(60) is True
    assert await stale.ack() is False
    assert await stale.heartbeat(60) is False
    assert await fresh.ack() is True


async def test_cancel_get_job_and_sweep(alk):
    queue = alk.queue("q")
    job_id = await queue.enqueue("x")
    assert await queue.cancel(job_id) is True
    assert await queue.cancel(job_id) is False
    expired = await queue.enqueue("y", expires=-1)
    assert await queue.sweep_expired() == 1
    job = await queue.get_job(expired)
    assert job is not None and (job.state, job.last_error) == ("dead", "expired")
    assert job.died_at is not None


@pytest.mark.parametrize("payload", [
    math.nan, math.inf, -math.inf, {1, 2}, b"bytes", object(), {"k": "nul\x00"}, {"nul\x00key": 1}, ["\x00"],
])
async def test_unencodable_payloads_are_refused_before_sending(alk, db, payload):
    with pytest.raises(CodecError, match="payload"):
        await alk.queue("q").enqueue(payload)
    with pytest.raises(CodecError, match=r"payloads\[1\]"):
        await alk.queue("q").enqueue_batch([1, payload])
    assert jobs_in(db) == 0


async def test_backslash_u0000_text_is_not_mistaken_for_nul(alk):
    queue = alk.queue("q")
    job = await queue.get_job(await queue.enqueue({"s": "\\u0000"}))
    assert job is not None and job.payload == {"s": "\\u0000"}


@pytest.mark.parametrize(("argument", "value"), [
    ("delay", 2**63), ("delay", -(2**63) - 1), ("priority", True), ("expires", 1.5), ("run_at", "10"),
])
async def test_bad_integers_are_refused_with_the_argument_named(alk, db, argument, value):
    with pytest.raises(InvalidArgument, match=argument):
        await alk.queue("q").enqueue(1, **{argument: value})
    assert jobs_in(db) == 0


async def test_server_side_refusals_map_to_pyalk_errors(alk, db):
    with pytest.raises(InvalidName, match="reserved prefix") as caught:
        await alk.queue("alk:mine").enqueue(1)
    assert caught.value.sqlstate == "LK001"
    assert isinstance(caught.value.__cause__, psycopg.Error)
    with pytest.raises(InvalidName, match="non-empty"):
        await alk.queue("").claim_one("w")
    with pytest.raises(CodecError, match="queue"):
        alk.queue("nul\x00name")
    assert jobs_in(db) == 0


async def test_a_pool_or_a_connection_can_back_the_client(dsn):
    async with AsyncConnectionPool(dsn, kwargs={"autocommit": True}, min_size=1, max_size=2) as pool:
        job_id = await AsyncAlk(pool).queue("q").enqueue("from pool")
        assert not pool.closed
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    try:
        job = await AsyncAlk(conn).queue("q").get_job(job_id)
        assert job is not None and job.payload == "from pool"
    finally:
        await conn.close()


async def test_dead_jobs_can_be_listed_and_requeued_through_the_queue(alk):
    queue = alk.queue("q")
    job_id = await queue.enqueue("x", max_attempts=1)
    handle = await queue.claim_one("w")
    assert handle is not None and await handle.fail("boom") is True
    assert [job.id for job in await queue.list_jobs("dead")] == [job_id]
    assert await queue.next_claim_at() is None
    assert await queue.requeue_dead() == 1
    job = await queue.get_job(job_id)
    # A fresh life: every spent attempt refunded, the fencing token (attempts) kept.
    assert job is not None and (job.state, job.attempts_spent, job.last_error) == ("pending", 0, None)
    assert (await queue.channel()).startswith("alk_q_")
    assert await queue.next_claim_at() is not None


async def test_completed_jobs_keep_their_result_while_the_queue_keeps_them(alk):
    queue = alk.queue("q")
    assert await queue.retention() == 0
    assert await queue.set_retention(60) is True
    assert await queue.retention() == 60
    job_id = await queue.enqueue({"to": "ada"})
    handle = await queue.claim_one("w")
    assert handle is not None and await handle.ack({"sent": True, "n": [1, 2.5]}) is True
    job = await queue.get_job(job_id)
    assert job is not None
    assert (job.state, job.result, job.worker_id) == ("completed", {"sent": True, "n": [1, 2.5]}, "w")
    assert job.completed_at is not None
    assert [j.id for j in await queue.list_jobs("completed")] == [job_id]
    assert (await queue.stats()).completed == 1
    assert await queue.claim_one("w") is None
    # Off again: the next ack deletes, whatever its result.
    assert await queue.set_retention(0) is True
    await queue.enqueue(1)
    handle = await queue.claim_one("w")
    assert handle is not None and await handle.ack("ignored") is True
    assert await queue.get_job(handle.id) is None


async def test_retention_and_result_are_checked(alk):
    queue = alk.queue("q")
    with pytest.raises(InvalidArgument):
        await queue.set_retention(-1)
    with pytest.raises(InvalidArgument):
        await queue.set_retention(1.5)  # type: ignore[arg-type]
    await queue.enqueue(1)
    handle = await queue.claim_one("w")
    assert handle is not None
    with pytest.raises(CodecError):
        await handle.ack(math.nan)
    assert (await queue.get_job(handle.id)).state == "processing"


async def test_after_holds_a_job_until_the_jobs_it_lists_are_acked(alk, db):
    queue = alk.queue("q")
    first = await queue.enqueue("first")
    second = await queue.enqueue("second", after=[first])
    batch = await queue.enqueue_batch(["third", "fourth"], after=(second,))
    handle = await queue.claim_one("w")
    assert handle is not None and handle.id == first
    assert await queue.claim_one("w") is None  # second waits for first
    assert (await queue.get_job(second)).state == "pending"
    assert await handle.ack() is True
    handle = await queue.claim_one("w")
    assert handle is not None and handle.id == second
    assert await handle.fail("boom") is True
    dead = [await queue.get_job(i) for i in batch]
    assert [(j.state, j.last_error) for j in dead] == [("dead", f"after job {second} died")] * 2
    with pytest.raises(InvalidArgument):
        await queue.enqueue("x", after=[2**63])
    with pytest.raises(InvalidArgument, match="after"):
        await queue.enqueue("x", after=[await alk.queue("other").enqueue("elsewhere")])
    assert jobs_in(db) == 4


async def test_headers_travel_with_the_job(alk, db):
    queue = alk.queue("q")
    headers = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    job_id = await queue.enqueue("x", headers=headers)
    batch = await queue.enqueue_batch(["y", "z"], headers={"c": 1}, dedup_keys=["a", None])
    handle = await queue.claim_one("w")
    assert handle is not None and handle.id == job_id and handle.job.headers == headers
    assert [(await queue.get_job(i)).headers for i in batch] == [{"c": 1}, {"c": 1}]
    assert (await queue.get_job(await queue.enqueue("plain"))).headers is None
    with pytest.raises(InvalidArgument):
        await queue.enqueue("x", headers=["not", "an", "object"])  # type: ignore[arg-type]
    with pytest.raises(CodecError):
        await queue.enqueue("x", headers={"bad": math.inf})
    assert jobs_in(db) == 4


async def test_limits_and_group_keys_bind(alk):
    queue = alk.queue("q")
    assert await queue.limits() == QueueLimits("q", None, None, None, None)
    assert await queue.set_limits(max_running=2, rate=10, rate_period_s=timedelta(minutes=1)) is True
    assert await queue.limits() == QueueLimits("q", 2, 10, 60, None)
    with pytest.raises(InvalidArgument):
        await queue.set_limits(max_running=0)
    with pytest.raises(InvalidArgument):
        await queue.set_limits(rate=5)
    first = await queue.enqueue(1, group_key="g")
    await queue.enqueue_batch([2, 3], group_keys=["g", None])
    with pytest.raises(InvalidArgument):
        await queue.enqueue_batch([4, 5], group_keys=["g"])
    with pytest.raises(InvalidName):
        await queue.enqueue(6, group_key="")
    claimed = await queue.claim_batch("w", 10)
    # max_running 2: the group's first job and the job without a group.
    assert [(h.job.payload, h.job.group_key) for h in claimed] == [(1, "g"), (3, None)]
    assert claimed[0].id == first
    assert await queue.set_limits() is True
    assert await queue.limits() == QueueLimits("q", None, None, None, None)
