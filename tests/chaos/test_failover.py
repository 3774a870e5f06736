"""Failover to a synchronous streaming replica while worker processes, a
producer and an acker run on a multi-host DSN with
target_session_attrs=read-write: the primary dies (immediate stop), the
replica is promoted, and everyone carries on against it. With synchronous
replication no enqueue or ack the server acknowledged is lost."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyalk import Alk, QueueOpts
from pyalk.schema import migrate
from tests.chaos.harness import check, first_start_after, live_jobs, read_ledger
from tests.chaos.servers import PgServer, replica_of, until

pytestmark = pytest.mark.slow


@pytest.fixture
def pair() -> Iterator[tuple[PgServer, PgServer]]:
    root = Path(tempfile.mkdtemp(prefix="alk-fo-"))
    primary = PgServer(root, "p1", 5432).init()
    replica: PgServer | None = None
    try:
        primary.start()
        migrate.upgrade(primary.create_database("chaos"))
        replica = replica_of(primary, root, "p2", 5433)
        yield primary, replica
    finally:
        for server in (primary, replica):
            if server is not None:
                server.destroy()
        shutil.rmtree(root, ignore_errors=True)


def test_failover_to_a_synchronous_replica(pair, ledger, spawn, report):
    primary, replica = pair
    multi = (f"host={primary.socket_dir},{replica.socket_dir} port={primary.port},{replica.port} user=postgres "
             "dbname=chaos target_session_attrs=read-write connect_timeout=2")
    enqueued: list[int] = []
    acked: dict[int, float] = {}
    errors = {"enqueue": 0, "ack": 0}
    stop = threading.Event()

    def produce() -> None:
        with Alk(multi) as alk:
            queue = alk.queue("q", QueueOpts(visibility_timeout_s=2))
            i = 0
            while not stop.is_set():
                try:
                    enqueued.append(queue.enqueue({"n": i, "s": 0.02}))  # acknowledged by the server
                    i += 1
                except Exception:
                    errors["enqueue"] += 1
                    time.sleep(0.1)  # back-off while there is no primary
                time.sleep(0.005)  # pacing

    def ack_some() -> None:
        with Alk(multi) as alk:
            queue = alk.queue("q")
            while not stop.is_set():
                try:
                    handle = queue.claim_one("acker")
                    if handle is None:
                        time.sleep(0.05)  # pacing; the workers take most jobs
                        continue
                    if handle.ack():
                        acked[handle.id] = time.time()
                except Exception:
                    errors["ack"] += 1
                    time.sleep(0.1)

    threads = [threading.Thread(target=produce), threading.Thread(target=ack_some)]
    for thread in threads:
        thread.start()
    spawn(multi, "a", "--concurrency", "4")
    spawn(multi, "b", "--concurrency", "4", handler="work_async")
    try:
        until(lambda: len(read_ledger(ledger)) >= 100 and len(acked) >= 3, "work on the primary")
        at_failover = len(enqueued)
        primary.stop("immediate")
        promoted = replica.promote()
        promoted_wall = time.time() - (time.monotonic() - promoted)
        until(lambda: first_start_after(ledger, promoted_wall) is not None, "a worker job on the new primary")
        until(lambda: len(enqueued) >= at_failover + 100, "the producer to carry on against the new primary")
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    dsn = replica.dsn("chaos")
    until(lambda: live_jobs(dsn) == 0, "the queue to drain on the new primary", deadline=120)
    starts = read_ledger(ledger)
    late = [(job_id, s.start) for s in starts for job_id, when in acked.items() if s.id == job_id and s.start > when]
    assert not late, f"jobs acked on the server ran again afterwards (an acknowledged ack was lost): {late[:5]}"
    figures = check(ledger, [job_id for job_id in enqueued if job_id not in acked], dsn)
    figures.update(enqueued_acknowledged=len(enqueued), acked_by_acker=len(acked), failed_calls=errors,
                   recovery_s=first_start_after(ledger, promoted_wall))
    report.update(figures)
