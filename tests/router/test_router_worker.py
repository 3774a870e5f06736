"""pyalk's worker and command line through the router: the worker claims and
settles (ack_batch, fail, heartbeat with their queue) through the router, and
LISTENs on the partition that holds its queue (alk.partition_conninfo):
NOTIFY fires where the enqueue commits, never on the router."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import psycopg
import pytest

from pyalk import Alk, Job
from pyalk.cli import main
from pyalk.schema.router import router_install
from tests.router.conftest import Target


def wait_for(predicate: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met before the deadline")
        time.sleep(0.02)


def stats(dsn: str, queue: str) -> tuple[int, int, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pending, processing, dead FROM alk.queue_stats(%s)", [queue]).fetchone()
    assert row is not None
    return row[0], row[1], row[2]


def listeners(conninfo: str) -> int:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                           " AND query LIKE 'LISTEN%%' AND pid <> pg_backend_pid()").fetchone()
    assert row is not None
    return int(row[0])


def test_the_worker_runs_through_the_router_and_wakes_on_its_partition(routed: Target, tag: str):
    queue = f"{tag}-work"
    seen: list[object] = []

    def handler(job: Job) -> None:
        if job.payload == "bad":
            raise ValueError("no")
        job.heartbeat()
        seen.append(job.payload)

    with psycopg.connect(routed.dsn, autocommit=True) as db:
        row = db.execute("SELECT alk.partition_conninfo(%s)", [queue]).fetchone()
    assert row is not None and row[0] == routed.partition_of(queue)
    conninfo = str(row[0])
    with Alk(routed.dsn) as alk:
        worker = alk.worker(queue, handler, concurrency=4, poll_interval=600, handle_signals=False,
                        listen_conninfo=conninfo, fail_on=ValueError)
        thread = threading.Thread(target=worker.run)
        thread.start()
        try:
            wait_for(lambda: worker.listening)
            assert listeners(conninfo) == 1  # on the queue's partition, where enqueue notifies
            alk.queue(queue).enqueue_batch([1, 2, 3, "bad"])
            wait_for(lambda: len(seen) == 3 and stats(routed.dsn, queue) == (0, 0, 1))
        finally:
            worker.stop()
            thread.join(30)
    assert sorted(seen, key=str) == [1, 2, 3]
    assert worker.counts.acked == 3 and worker.counts.failed == 1


def test_the_cli_prints_the_router_install_and_works_through_the_router(
        routed: Target, tag: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("COLUMNS", "200")  # room for the whole queue name in the status table
    args = [a for p in routed.partitions for a in ("--router", p)]
    assert main(["sql", *args]) == 0
    assert capsys.readouterr().out == router_install(routed.partitions)
    queue = f"{tag}-cli"
    assert main(["enqueue", queue, '{"to": "ada"}', "--priority", "3", "--dsn", routed.dsn]) == 0
    job_id = int(capsys.readouterr().out.strip().split()[-1])
    with psycopg.connect(routed.partition_of(queue), autocommit=True) as home:
        row = home.execute("SELECT payload, priority FROM alk.get_job(%s, %s)", [queue, job_id]).fetchone()
    assert row == ({"to": "ada"}, 3)
    assert main(["status", queue, "--dsn", routed.dsn]) == 0
    assert queue in capsys.readouterr().out
    assert main(["jobs", queue, "--json", "--dsn", routed.dsn]) == 0
    assert '"to": "ada"' in capsys.readouterr().out


def test_the_cli_refuses_a_partition_count_that_is_not_a_power_of_two(capsys: pytest.CaptureFixture[str]):
    assert main(["sql", "--router", "dbname=a", "--router", "dbname=b", "--router", "dbname=c"]) == 1
    assert "power of two" in capsys.readouterr().err


def test_a_worker_through_the_router_registers_on_its_queues_partition_and_stops_when_asked(
        routed: Target, tag: str, caplog: pytest.LogCaptureFixture):
    queue = f"{tag}-stop"

    def handler(job: Job) -> None:
        pass

    def logged(fragment: str) -> bool:
        return any(fragment in record.getMessage() for record in list(caplog.records))

    caplog.set_level(logging.DEBUG, logger="pyalk.worker")
    conninfo = routed.partition_of(queue)
    with Alk(routed.dsn) as alk:
        worker = alk.worker(queue, handler, poll_interval=600, handle_signals=False, listen_conninfo=conninfo)
        thread = threading.Thread(target=worker.run)
        thread.start()
        try:
            with psycopg.connect(conninfo, autocommit=True) as home:
                wait_for(lambda: home.execute("SELECT count(*) FROM alk.workers() WHERE worker_id = %s",
                                              [worker.worker_id]).fetchone() == (1,))
            wait_for(lambda: logged("listening on alk_w_"))
            # Asked through the router without the queue, the stop reaches the
            # worker's channel on the partition where it LISTENs.
            assert alk.request_stop(worker.worker_id) is True
            thread.join(30)
            assert not thread.is_alive()
            assert logged("seen on its control channel")
        finally:
            worker.stop()
            thread.join(30)
        assert [w for w in alk.workers() if w.worker_id == worker.worker_id] == []
