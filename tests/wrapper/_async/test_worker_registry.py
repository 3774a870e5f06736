"""The registry of workers from Python: the bindings (alk.workers,
alk.request_stop, worker_register/beat/deregister) round-trip and map the
SQL's refusals; a running worker is listed with what it holds, stops on
alk.request_stop (on its control channel when it listens, at its next beat
when it does not), registers again when its row is removed, deregisters at
exit, and works on without the registry when it is refused one.

The worker runs in the foreground; a driver thread watches alk.workers() and
the worker's log records (with deadlines), and acts. Tests that wait for a
beat shorten the beat interval; nothing synchronises by sleeping.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from pyalk import (
    Alk,
    AsyncAlk,
    AsyncJobHandle,
    AsyncWorker,
    CodecError,
    InvalidArgument,
    InvalidName,
    WorkerInfo,
)
from pyalk._async import workers
from pyalk.runtime import AsyncEvent
from pyalk.worker import control
from tests.helpers import one, until

DEADLINE = 30.0


@pytest.fixture
async def alk(dsn: str) -> AsyncIterator[AsyncAlk]:
    async with AsyncAlk(dsn) as client:
        yield client


@pytest.fixture
def quick_beats(monkeypatch: pytest.MonkeyPatch) -> None:
    """Beats every 50 ms, for the tests that wait for one (read when a worker is built)."""
    monkeypatch.setattr(control, "BEAT_INTERVAL", 0.05)


@pytest.fixture
def records(caplog: pytest.LogCaptureFixture) -> Callable[[str], int]:
    """How many of the worker's log records so far contain a fragment."""
    caplog.set_level(logging.DEBUG, logger="pyalk.worker")

    def count(fragment: str) -> int:
        return sum(fragment in record.getMessage() for record in list(caplog.records))

    return count


def listed(db: psycopg.Connection) -> list[WorkerInfo]:
    with Alk(db) as alk:
        return alk.workers()


async def drive_beside(worker: AsyncWorker, drive: Callable[[], None]) -> None:
    """Run the worker while ``drive`` runs in a thread; ``drive`` ends by
    asking the worker to stop. If it fails, or the worker does not stop
    within the deadline after it, the worker is stopped and the test fails."""
    failures: list[BaseException] = []
    done = threading.Event()

    def guarded() -> None:
        try:
            drive()
        except BaseException as error:
            failures.append(error)
            worker.stop()
            return
        if not done.wait(DEADLINE):
            failures.append(AssertionError("the worker did not stop when asked"))
            worker.stop()

    thread = threading.Thread(target=guarded, daemon=True)
    thread.start()
    try:
        await worker.run()
    finally:
        done.set()
    thread.join()
    assert not failures, failures


# bindings ------------------------------------------------------------------------


async def test_the_bindings_round_trip(alk, db):
    executor = alk.executor
    channel = await workers.register(executor, "w-1", "emails", host="web-3", pid=4242, concurrency=8,
                                     version="my-worker 1.2")
    assert channel.startswith("alk_w_") and len(channel) == 38
    assert await workers.register(executor, "w-2", "alk:outbox:billing", host=None, pid=None, concurrency=1,
                                  version=None) != channel
    assert await workers.beat(executor, "w-1", 3) is False
    assert await workers.beat(executor, "w-1", 3, "other") is None  # a row of another queue counts as gone
    [first, second] = await alk.workers()
    now = one(db, "SELECT alk.now()")
    assert (first.worker_id, first.queue, first.host, first.pid, first.running, first.concurrency,
            first.version, first.stopping, first.gone) == ("w-1", "emails", "web-3", 4242, 3, 8, "my-worker 1.2",
                                                           False, False)
    assert now - 5 <= first.started_at <= first.last_seen_at <= now
    assert (second.worker_id, second.host, second.pid, second.version) == ("w-2", None, None, None)

    db.execute("LISTEN " + channel)
    assert await alk.request_stop("w-1") is True
    assert [n.payload for n in db.notifies(timeout=DEADLINE, stop_after=1)] == ["stop"]
    assert await workers.beat(executor, "w-1", 0, "emails") is True
    assert [w.stopping for w in await alk.workers()] == [True, False]
    assert await alk.request_stop("w-2", "emails") is False  # routed to another queue: not found
    assert await alk.request_stop("nobody") is False

    assert await workers.deregister(executor, "w-1", "emails") is True
    assert await workers.deregister(executor, "w-1") is False
    assert await workers.beat(executor, "w-1", 0) is None
    assert [w.worker_id for w in await alk.workers()] == ["w-2"]


async def test_the_bindings_map_the_refusals(alk):
    executor = alk.executor
    with pytest.raises(InvalidArgument, match="concurrency"):
        await workers.register(executor, "w", "q", host=None, pid=None, concurrency=0, version=None)
    with pytest.raises(InvalidArgument, match="pid"):
        await workers.register(executor, "w", "q", host=None, pid=-1, concurrency=1, version=None)
    with pytest.raises(InvalidName, match="worker_id"):
        await workers.register(executor, "", "q", host=None, pid=None, concurrency=1, version=None)
    with pytest.raises(InvalidArgument, match="running"):
        await workers.beat(executor, "w", -1)
    with pytest.raises(CodecError, match="worker_id"):
        await alk.request_stop("w\x00")
    with pytest.raises(InvalidArgument, match="concurrency"):
        await workers.register(executor, "w", "q", host=None, pid=None, concurrency=True,  # type: ignore[arg-type]
                               version=None)
    assert await alk.workers() == []  # nothing was written


# a worker's row --------------------------------------------------------------------


async def test_a_running_worker_is_listed_with_what_it_holds_and_gone_after_it_stops(alk, db, quick_beats):
    gate = AsyncEvent()

    async def handler(job: AsyncJobHandle) -> None:
        await gate.wait(DEADLINE)

    await alk.queue("q").enqueue_batch([1, 2])
    worker = alk.worker("q", handler, concurrency=3, handle_signals=False)
    seen: list[WorkerInfo] = []

    def drive() -> None:
        until(lambda: [w.running for w in listed(db)] == [2], "a beat counting the two running jobs")
        seen.extend(listed(db))
        gate.set()
        until(lambda: [w.running for w in listed(db)] == [0], "a beat after they were settled")
        assert one(db, "SELECT alk.request_stop(%s)", worker.worker_id) is True

    await drive_beside(worker, drive)
    [info] = seen
    assert (info.worker_id, info.queue, info.host, info.pid, info.concurrency, info.stopping, info.gone) == (
        worker.worker_id, "q", socket.gethostname(), os.getpid(), 3, False, False)
    assert info.version == control.client_version() and info.version.startswith("pyalk")
    assert listed(db) == []  # deregistered at exit
    assert worker.counts.acked == 2


async def test_request_stop_reaches_a_listening_worker_on_its_channel(alk, db, records, monkeypatch):
    monkeypatch.setattr(control, "BEAT_INTERVAL", 3600.0)  # no beat comes to help
    started = threading.Event()

    async def handler(job: AsyncJobHandle) -> None:
        started.set()

    worker = alk.worker("q", handler, handle_signals=False, poll_interval=3600)

    def drive() -> None:
        until(lambda: records("listening on alk_w_") == 1, "the worker to LISTEN on its control channel")
        assert [w.worker_id for w in listed(db)] == [worker.worker_id]
        assert one(db, "SELECT alk.request_stop(%s)", worker.worker_id) is True

    await drive_beside(worker, drive)
    assert records("seen on its control channel") == 1
    assert listed(db) == []


async def test_a_worker_without_listen_stops_at_its_next_beat(alk, db, records, quick_beats):
    async def handler(job: AsyncJobHandle) -> None:
        pass

    worker = alk.worker("q", handler, handle_signals=False, listen=False)

    def drive() -> None:
        until(lambda: len(listed(db)) == 1, "the worker to register")
        assert one(db, "SELECT alk.request_stop(%s)", worker.worker_id) is True

    await drive_beside(worker, drive)
    assert records("seen at its beat") == 1
    assert listed(db) == []


async def test_a_row_removed_behind_its_back_is_registered_again(alk, db, records, quick_beats):
    async def handler(job: AsyncJobHandle) -> None:
        pass

    worker = alk.worker("q", handler, handle_signals=False)

    def drive() -> None:
        until(lambda: len(listed(db)) == 1, "the worker to register")
        assert one(db, "SELECT alk.worker_deregister(%s)", worker.worker_id) is True
        until(lambda: records("registering again") == 1, "a beat to find the row gone")
        until(lambda: len(listed(db)) == 1, "the worker to register again")
        until(lambda: records("listening on alk_w_") >= 1, "the worker to LISTEN on its control channel")
        assert one(db, "SELECT alk.request_stop(%s)", worker.worker_id) is True

    await drive_beside(worker, drive)
    assert listed(db) == []


# refused a registry: the worker works on ------------------------------------------------


@pytest.fixture
def worker_role(db: psycopg.Connection, dsn: str) -> Iterator[str]:
    """A LOGIN role of the worker kind whose EXECUTE on alk.worker_register was
    taken back (grants made by hand, without the registry); its DSN."""
    name = f"pyalk_worker_{secrets.token_hex(4)}"
    db.execute(f'CREATE ROLE "{name}" LOGIN')
    db.execute("SELECT alk.grant_worker(%s)", [name])
    db.execute(f'REVOKE EXECUTE ON FUNCTION alk.worker_register(text, text, text, bigint, bigint, text) FROM "{name}"')
    yield make_conninfo(dsn, user=name)
    db.execute(f'DROP OWNED BY "{name}"')
    db.execute(f'DROP ROLE "{name}"')


@pytest.mark.parametrize("refusal", ["no grant", "no function"])
async def test_a_refused_registry_is_logged_once_and_the_worker_works_on(db, dsn, request, records, quick_beats,
                                                                       refusal):
    if refusal == "no grant":
        conninfo = request.getfixturevalue("worker_role")
        expected = "permission denied for function worker_register"
    else:
        # What a router install generated before version 0024 looks like to a worker.
        db.execute("DROP FUNCTION alk.worker_register(text, text, text, bigint, bigint, text)")
        conninfo, expected = dsn, "function alk.worker_register"
    ran: list[Any] = []

    async def handler(job: AsyncJobHandle) -> None:
        ran.append(job.payload)

    db.execute("SELECT alk.enqueue_batch('q', ARRAY['1', '2', '3']::jsonb[])")
    async with AsyncAlk(conninfo) as alk:
        worker = alk.worker("q", handler, handle_signals=False)

        def drive() -> None:
            until(lambda: records("working on without the registry") == 1, "the refusal to be logged")
            until(lambda: len(ran) == 3, "the three jobs to run")
            worker.stop()

        await drive_beside(worker, drive)
    assert records("working on without the registry") == 1
    assert records(expected) == 1
    assert sorted(ran) == [1, 2, 3] and worker.counts.acked == 3
    assert one(db, "SELECT count(*) FROM alk.worker_registry") == 0
