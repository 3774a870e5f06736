"""Pythonic durations and instants: every duration argument takes an int
(seconds) or a timedelta, every instant an int (unix seconds) or an aware
datetime; a sub-second part rounds up; a naive datetime and a float are
refused naming the argument, before anything is sent."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta, timezone

import psycopg
import pytest

from pyalk import AsyncAlk, InvalidArgument, QueueOpts

NOW = 1_700_000_000
AT = datetime.fromtimestamp(NOW, UTC)


@pytest.fixture
async def alk(dsn: str) -> AsyncIterator[AsyncAlk]:
    connection = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    await connection.execute("SELECT set_config('alk.now', %s, false)", [str(NOW)])
    yield AsyncAlk(connection)
    await connection.close()


def row(db: psycopg.Connection, queue: str, job_id: int) -> tuple[object, ...]:
    return db.execute(
        "SELECT run_at, expires_at, visibility_timeout_s, backoff_base_s, dead_letter_retention_s"
        " FROM alk.get_job(%s, %s)", [queue, job_id]).fetchone()


async def test_enqueue_takes_timedeltas_and_aware_datetimes(alk, db):
    opts = QueueOpts(visibility_timeout_s=timedelta(minutes=2), backoff_base_s=timedelta(seconds=1.5),
                     dead_letter_retention_s=timedelta(days=1))
    queue = alk.queue("q", opts)
    delayed = await queue.enqueue({}, delay=timedelta(seconds=30, microseconds=1), expires=timedelta(hours=1))
    assert row(db, "q", delayed) == (NOW + 31, NOW + 3600, 120, 2, 86400)
    # Another zone, a sub-second part: the same instant, rounded up.
    plus_two = timezone(timedelta(hours=2))
    at = await queue.enqueue({}, run_at=(AT + timedelta(minutes=5, milliseconds=1)).astimezone(plus_two))
    assert row(db, "q", at)[0] == NOW + 301
    [batch] = await queue.enqueue_batch([{}], run_at=AT + timedelta(seconds=7))
    assert row(db, "q", batch)[0] == NOW + 7


async def test_claimed_job_ops_and_the_outbox_take_timedeltas(alk, db):
    queue = alk.queue("q")
    await queue.enqueue({})
    job = await queue.claim_one("w")
    assert job is not None
    assert await job.heartbeat(timedelta(minutes=10)) is True
    lease = db.execute("SELECT claim_expires_at FROM alk.get_job('q', %s)", [job.id]).fetchone()
    assert lease == (NOW + 600,)
    assert await job.retry("again", delay=timedelta(seconds=45)) is True
    assert row(db, "q", job.id)[0] == NOW + 45
    message = await alk.outbox("billing").enqueue({}, delay=timedelta(seconds=9))
    got = await alk.outbox("billing").get_job(message)
    assert got is not None and got.run_at == NOW + 9


async def test_schedules_take_timedeltas_and_datetimes(alk):
    await alk.schedule("nightly", "0 3 * * *", "q", expires=timedelta(hours=2))
    schedule = await alk.get_schedule("nightly")
    assert schedule is not None and schedule.expires == 7200
    assert await alk.cron_next("0 * * * *", AT) == await alk.cron_next("0 * * * *", NOW)


@pytest.mark.parametrize(("options", "message"), [
    ({"run_at": datetime(2030, 1, 1)}, "run_at must be a timezone-aware datetime"),
    ({"delay": 1.5}, "delay must be an int (seconds) or a datetime.timedelta, got float 1.5"),
    ({"expires": "60"}, "expires must be an int (seconds) or a datetime.timedelta, got str '60'"),
    ({"run_at": 1.5}, "run_at must be an int (unix seconds) or an aware datetime, got float 1.5"),
])
async def test_bad_durations_and_instants_are_refused_before_sending(alk, db, options, message):
    with pytest.raises(InvalidArgument) as caught:
        await alk.queue("q").enqueue({}, **options)
    assert str(caught.value).startswith(message)
    assert db.execute("SELECT count(*) FROM alk.list_jobs('q')").fetchone() == (0,)
