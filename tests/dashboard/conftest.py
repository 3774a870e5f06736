"""The dashboard's fixtures: a seeded database, roles from docs/security.md's
recipes, an in-process client and a real server for the browser."""

from __future__ import annotations

import re
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

pytest.importorskip("starlette", reason="the dashboard tests need pyalk[dashboard]")

import uvicorn
from starlette.testclient import TestClient

from pyalk.dashboard import create_app

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = "<script>alert(1)</script>'\""
BIG = 1_000_000


@dataclass(frozen=True)
class Seeded:
    dsn: str
    dead_id: int  # the hostile queue's dead job
    big_id: int  # a dead job with a 1 MB payload in queue "reports"


def seed(db: psycopg.Connection) -> Seeded:
    """Queues, a stream with consumers, schedules, locks and an hour of
    counted settles; hostile names and payloads among them."""
    # An hour of settles, counted by the settle path itself: each minute's
    # jobs enqueued, claimed and acked under that minute's pinned clock.
    db.execute("""DO $$ DECLARE m bigint; clock bigint := alk.now(); BEGIN
        FOR m IN 0..59 LOOP
            PERFORM set_config('alk.now', (clock - (59 - m) * 60)::text, true);
            PERFORM alk.enqueue_batch('emails', (SELECT array_agg('{}'::jsonb) FROM generate_series(1, 10 + m)));
            PERFORM alk.ack_batch(array_agg(c.id), 'seeder', array_agg(c.attempts), 'emails')
               FROM alk.claim('emails', 'seeder', 10 + m) c;
        END LOOP;
        PERFORM set_config('alk.now', '', true); END $$""")
    db.execute("SELECT alk.enqueue_batch('emails', array_agg(jsonb_build_object('to', i))) "
               "FROM generate_series(1, 30) i")
    db.execute("SELECT alk.enqueue('emails', '{\"later\": true}', delay => 3600)")
    db.execute("SELECT count(*) FROM alk.claim('emails', 'worker-a', 2)")
    dead_id = db.execute("SELECT alk.enqueue(%s, %s::jsonb, max_attempts => 1)",
                         [HOSTILE, '{"x": "<script>alert(2)</script>", "q": "\\"\'"}']).fetchone()[0]
    db.execute("SELECT count(*) FROM alk.claim(%s, %s, 1)", [HOSTILE, HOSTILE])
    error = "<img src=x onerror=alert(3)>"
    assert db.execute("SELECT alk.fail(%s, %s, 1, %s)", [dead_id, HOSTILE, error]).fetchone()[0]
    big_id = db.execute("SELECT alk.enqueue('reports', jsonb_build_object('blob', repeat('x', %s)), max_attempts => 1)",
                        [BIG]).fetchone()[0]
    db.execute("SELECT count(*) FROM alk.claim('reports', 'w', 1)")
    assert db.execute("SELECT alk.fail(%s, 'w', 1, 'too big')", [big_id]).fetchone()[0]
    db.execute("SELECT alk.publish(%s, jsonb_build_object('i', i, 'html', '<b>x</b>'), 'k' || i) "
               "FROM generate_series(1, 75) i", [HOSTILE])
    db.execute("SELECT alk.publish('orders', jsonb_build_object('blob', repeat('y', %s)))", [BIG])
    db.execute("SELECT alk.save_offset(%s, %s, 60)", [HOSTILE, HOSTILE])
    db.execute("SELECT alk.schedule(%s, '@every 5m', 'emails')", [HOSTILE])
    db.execute("SELECT alk.try_lock(%s, %s, 600)", [HOSTILE, HOSTILE])
    return Seeded(dsn="", dead_id=dead_id, big_id=big_id)


@dataclass(frozen=True)
class Registered:
    """Workers in the registry, as alk.worker_register left them (no worker
    process: the pages read rows), and each one's control channel."""

    channels: dict[str, str]


#: The registered workers: id -> (queue, host, pid, concurrency, version).
#: The hostile one's id, host and version are markup, as a worker could send.
WORKERS = {
    "emails-1": ("emails", "web-3", 4242, 8, "pyalk 0.9"),
    "emails-2": ("emails", "web-4", 977, 4, "pyalk 0.9"),
    HOSTILE: (HOSTILE, HOSTILE, 1, 2, "<b>x</b>"),
    "reports-old": ("reports", "batch-1", 31337, 1, "node-alk 1.2"),
}
#: Registered this long ago and silent since: past the 30 s silence bound.
GONE = "reports-old"
GONE_SILENT_S = 120


def register_workers(db: psycopg.Connection) -> Registered:
    """WORKERS registered through alk.worker_register; emails-1 beats with 3
    jobs held; GONE registered under a clock pinned GONE_SILENT_S ago."""
    channels: dict[str, str] = {}
    for worker_id, (queue, host, pid, concurrency, version) in WORKERS.items():
        with db.transaction():
            if worker_id == GONE:
                db.execute("SELECT set_config('alk.now', (alk.now() - %s)::text, true)", [GONE_SILENT_S])
            row = db.execute("SELECT alk.worker_register(%s, %s, %s, %s, %s, %s)",
                             [worker_id, queue, host, pid, concurrency, version]).fetchone()
        assert row
        channels[worker_id] = row[0]
    assert db.execute("SELECT alk.worker_beat('emails-1', 3)").fetchone() == (False,)
    return Registered(channels)


@pytest.fixture
def registered(db: psycopg.Connection, seeded: Seeded) -> Registered:
    return register_workers(db)


@pytest.fixture
def seeded(db: psycopg.Connection, dsn: str) -> Seeded:
    found = seed(db)
    return Seeded(dsn=dsn, dead_id=found.dead_id, big_id=found.big_id)


def recipe(heading: str) -> str:
    """The first SQL block after a phrase of docs/security.md (matched
    whatever its line breaks and capitals)."""
    text = (ROOT / "docs" / "security.md").read_text()
    found = re.search(r"\s+".join(map(re.escape, heading.split())), text, re.I)
    assert found, heading
    section = text[found.end():]
    block = re.search(r"```sql\n(.*?)```", section, re.S)
    assert block, heading
    return block.group(1)


@pytest.fixture
def make_role(db: psycopg.Connection, dsn: str) -> Iterator[Callable[[str], str]]:
    """A login role granted by one of docs/security.md's recipes; returns its conninfo."""
    made: list[str] = []

    def make(kind: str) -> str:
        role = f"pyalk_{kind}_{secrets.token_hex(4)}"
        if kind == "viewer":
            sql = recipe("## A read-only role").replace("app_viewer", f'"{role}"')
            sql = sql.replace(f"CREATE ROLE \"{role}\" LOGIN PASSWORD '...';", f'CREATE ROLE "{role}" LOGIN;')
        else:
            # docs/security.md's roles as code: the reader or the admin kind.
            sql = f"CREATE ROLE \"{role}\" LOGIN; SELECT alk.grant_{kind}('{role}');"
        db.execute(sql)
        made.append(role)
        return psycopg.conninfo.make_conninfo(dsn, user=role)

    yield make
    for role in made:
        db.execute(f'DROP OWNED BY "{role}"')
        db.execute(f'DROP ROLE "{role}"')


@pytest.fixture
def client(seeded: Seeded) -> Iterator[TestClient]:
    with TestClient(create_app(seeded.dsn), base_url="http://127.0.0.1") as test_client:
        yield test_client


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def live_server(seeded: Seeded) -> Iterator[str]:
    """The dashboard served by uvicorn on a free port; its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(seeded.dsn), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "the dashboard did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)
