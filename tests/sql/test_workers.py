"""The registry of running workers and stop from anywhere
(docs/contract.md#flow-control-and-operations, sql/workers.sql), checked
through alk.* alone: what any language's worker calls."""

from __future__ import annotations

import re
import secrets
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pyalk.schema import migrate
from pyalk.schema.install import versions
from tests.conftest import pin_clock
from tests.helpers import one, raises_lk

NOW = 1_700_000_000
#: The bounds sql/workers.sql documents: gone after 30 s without a beat, pruned after an hour.
SILENCE_S = 30
PRUNE_S = 3600
COLUMNS = ["worker_id", "queue", "host", "pid", "started_at", "last_seen_at", "running", "concurrency", "version",
           "stopping", "gone"]


def register(db: psycopg.Connection, worker_id: str = "w1", queue: str = "q", host: str | None = "host-1",
             pid: int | None = 4242, concurrency: int | None = 8, version: str | None = "test 1.0") -> str:
    return one(db, "SELECT alk.worker_register(%s, %s, %s, %s, %s, %s)", worker_id, queue, host, pid, concurrency,
               version)


def beat(db: psycopg.Connection, worker_id: str = "w1", running: int | None = 0) -> bool | None:
    return one(db, "SELECT alk.worker_beat(%s, %s)", worker_id, running)


def workers(db: psycopg.Connection) -> list[dict[str, Any]]:
    cur = db.execute("SELECT * FROM alk.workers()")
    assert cur.description is not None
    names = [c.name for c in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def by_id(db: psycopg.Connection) -> dict[str, dict[str, Any]]:
    return {w["worker_id"]: w for w in workers(db)}


@pytest.fixture
def clocked(db: psycopg.Connection) -> psycopg.Connection:
    pin_clock(db, NOW)
    return db


# register, beat, deregister --------------------------------------------------------


def test_register_beat_deregister_round_trip(clocked):
    db = clocked
    channel = register(db)
    assert channel == one(db, "SELECT alk._channel('alk_w_', 'w1')")
    assert channel.startswith("alk_w_") and len(channel) == 38
    assert workers(db) == [dict(zip(COLUMNS, ["w1", "q", "host-1", 4242, NOW, NOW, 0, 8, "test 1.0", False, False],
                                    strict=True))]
    pin_clock(db, NOW + 5)
    assert beat(db, running=3) is False
    row = by_id(db)["w1"]
    assert (row["started_at"], row["last_seen_at"], row["running"]) == (NOW, NOW + 5, 3)
    assert one(db, "SELECT alk.worker_deregister('w1')") is True
    assert workers(db) == []
    assert one(db, "SELECT alk.worker_deregister('w1')") is False
    assert beat(db) is None, "a beat without a row says: register again"


def test_workers_are_ordered_by_id_with_the_pinned_columns(clocked):
    """By worker_id, the first column: what a router that concatenates
    partitions and sorts by it returns too (docs/contract.md#scale-out)."""
    for worker_id, queue in [("b", "q1"), ("c", "q0"), ("a", "q2")]:
        register(clocked, worker_id, queue)
    cur = clocked.execute("SELECT * FROM alk.workers()")
    assert cur.description is not None
    assert [c.name for c in cur.description] == COLUMNS
    assert [r[0] for r in cur.fetchall()] == ["a", "b", "c"]


def test_the_optional_queue_routes_and_must_match(clocked):
    """beat, deregister and request_stop take the queue as optional routing
    (as the ops by job id): given, a row of another queue is not found."""
    db = clocked
    register(db, "w1", "q")
    assert one(db, "SELECT alk.worker_beat('w1', 1, queue => 'other')") is None
    assert one(db, "SELECT alk.request_stop('w1', queue => 'other')") is False
    assert one(db, "SELECT alk.worker_deregister('w1', queue => 'other')") is False
    assert by_id(db)["w1"]["running"] == 0 and by_id(db)["w1"]["stopping"] is False
    assert one(db, "SELECT alk.worker_beat('w1', 1, queue => 'q')") is False
    assert one(db, "SELECT alk.request_stop('w1', queue => 'q')") is True
    assert one(db, "SELECT alk.worker_beat('w1', 1, queue => 'q')") is True
    assert one(db, "SELECT alk.worker_deregister('w1', queue => 'q')") is True
    assert workers(db) == []


def test_a_restart_under_the_same_id_replaces_the_row(clocked):
    db = clocked
    register(db, pid=1, concurrency=4, version="old")
    assert beat(db, running=4) is False
    assert one(db, "SELECT alk.request_stop('w1')") is True
    pin_clock(db, NOW + 100)
    register(db, queue="q2", host="host-2", pid=2, concurrency=16, version="new")
    assert workers(db) == [dict(zip(COLUMNS, ["w1", "q2", "host-2", 2, NOW + 100, NOW + 100, 0, 16, "new", False,
                                              False], strict=True))]


def test_host_pid_and_version_may_be_unknown(clocked):
    register(clocked, host=None, pid=None, version=None)
    row = by_id(clocked)["w1"]
    assert (row["host"], row["pid"], row["version"]) == (None, None, None)


def test_reserved_names_are_worker_ids_and_queues_too(clocked):
    """pyalk's own workers use the alk: prefix, and an outbox relay works its
    backing queue: both may register (docs/contract.md#names)."""
    register(clocked, "alk:relay:1", "alk:outbox:mail")
    assert by_id(clocked)["alk:relay:1"]["queue"] == "alk:outbox:mail"


# gone and pruned -------------------------------------------------------------------


def test_gone_after_the_silence_bound_and_back_with_a_beat(clocked):
    db = clocked
    register(db)
    pin_clock(db, NOW + SILENCE_S)
    assert by_id(db)["w1"]["gone"] is False
    pin_clock(db, NOW + SILENCE_S + 1)
    assert by_id(db)["w1"]["gone"] is True
    assert beat(db) is False
    assert by_id(db)["w1"]["gone"] is False


def test_pruned_after_the_horizon_by_another_workers_register_or_beat(clocked):
    db = clocked
    register(db, "dead-1")
    register(db, "dead-2")
    register(db, "alive")
    pin_clock(db, NOW + PRUNE_S)
    assert beat(db, "alive") is False
    assert set(by_id(db)) == {"dead-1", "dead-2", "alive"}, "silent for exactly the horizon: kept"
    assert by_id(db)["dead-1"]["gone"] is True
    pin_clock(db, NOW + PRUNE_S + 1)
    assert beat(db, "alive") is False
    assert set(by_id(db)) == {"alive"}
    assert beat(db, "dead-1") is None, "the pruned worker learns it must register again"
    register(db, "dead-1")
    pin_clock(db, NOW + 2 * PRUNE_S + 10)
    register(db, "newcomer")
    assert set(by_id(db)) == {"newcomer"}, "register prunes too"


def test_the_bounds_saturate_at_the_clocks_edges(db):
    pin_clock(db, -(2**63))
    register(db)
    assert by_id(db)["w1"]["gone"] is False
    pin_clock(db, 2**63 - 1)
    assert by_id(db)["w1"]["gone"] is True
    assert beat(db) is False


# request_stop ----------------------------------------------------------------------


def test_request_stop_sets_stopping_and_the_listening_worker_is_notified(clocked, connect):
    listener = connect()
    pin_clock(listener, NOW)
    channel = register(listener)
    listener.execute(f'LISTEN "{channel}"')
    register(clocked, "other")
    assert one(clocked, "SELECT alk.request_stop('w1')") is True
    notices = list(listener.notifies(timeout=30, stop_after=1))
    assert [(n.channel, n.payload) for n in notices] == [(channel, "stop")]
    assert beat(listener, running=2) is True, "the beat says so too, for a worker that was not listening"
    assert {w["worker_id"]: w["stopping"] for w in workers(clocked)} == {"w1": True, "other": False}


def test_request_stop_notifies_at_commit_only(clocked, connect):
    listener = connect()
    pin_clock(listener, NOW)
    channel = register(listener)
    listener.execute(f'LISTEN "{channel}"')
    with clocked.transaction(force_rollback=True):
        assert one(clocked, "SELECT alk.request_stop('w1')") is True
    assert beat(listener) is False
    # Rolled back, nothing was sent: the next notification is a marker.
    clocked.execute("SELECT pg_notify(%s, 'marker')", [channel])
    assert [n.payload for n in listener.notifies(timeout=30, stop_after=1)] == ["marker"]
    with clocked.transaction():
        assert one(clocked, "SELECT alk.request_stop('w1')") is True
    assert [n.payload for n in listener.notifies(timeout=30, stop_after=1)] == ["stop"]


def test_request_stop_of_an_unknown_worker_is_false_and_sends_nothing(clocked, connect):
    listener = connect()
    channel = one(listener, "SELECT alk._channel('alk_w_', 'nobody')")
    listener.execute(f'LISTEN "{channel}"')
    assert one(clocked, "SELECT alk.request_stop('nobody')") is False
    # A notification sent after it arrives alone: nothing was queued before it.
    clocked.execute("SELECT pg_notify(%s, 'marker')", [channel])
    assert [n.payload for n in listener.notifies(timeout=30, stop_after=1)] == ["marker"]
    assert workers(clocked) == []


# bad input -------------------------------------------------------------------------

BAD_REGISTER = [
    ({"worker_id": ""}, "LK001", "worker_id"),
    ({"worker_id": None}, "LK001", "worker_id"),
    ({"worker_id": "x" * 1025}, "LK001", "worker_id"),
    ({"queue": ""}, "LK001", "queue"),
    ({"queue": None}, "LK001", "queue"),
    ({"concurrency": 0}, "LK002", "concurrency"),
    ({"concurrency": -1}, "LK002", "concurrency"),
    ({"concurrency": None}, "LK002", "concurrency"),
    ({"pid": -1}, "LK002", "pid"),
    ({"host": "h" * 1025}, "LK002", "host"),
    ({"version": "v" * 1025}, "LK002", "version"),
]


# cancel of a held job: the holder is told --------------------------------------------


def test_cancel_of_a_processing_job_notifies_its_holder_at_commit(clocked, connect):
    listener = connect()
    channel = one(listener, "SELECT alk._channel('alk_w_', 'w1')")
    listener.execute(f'LISTEN "{channel}"')
    job_id = one(clocked, "SELECT alk.enqueue('q', '{}')")
    assert one(clocked, "SELECT id FROM alk.claim('q', 'w1')") == job_id
    with clocked.transaction(force_rollback=True):
        assert one(clocked, "SELECT alk.cancel('q', %s)", job_id) is True
    # Rolled back, nothing was sent: the next notification is a marker.
    clocked.execute("SELECT pg_notify(%s, 'marker')", [channel])
    assert [n.payload for n in listener.notifies(timeout=30, stop_after=1)] == ["marker"]
    assert one(clocked, "SELECT alk.cancel('q', %s)", job_id) is True
    notices = list(listener.notifies(timeout=30, stop_after=1))
    assert [(n.channel, n.payload) for n in notices] == [(channel, f"cancel {job_id}")]
    assert one(clocked, "SELECT (SELECT alk.get_job('q', %s)) IS NULL", job_id) is True


def test_cancel_of_a_pending_or_missing_job_notifies_nobody(clocked, connect):
    listener = connect()
    channel = one(listener, "SELECT alk._channel('alk_w_', 'w1')")
    listener.execute(f'LISTEN "{channel}"')
    held = one(clocked, "SELECT alk.enqueue('q', '{}')")
    assert one(clocked, "SELECT id FROM alk.claim('q', 'w1')") == held
    # Retried, the job is pending again: its former holder is not told of a cancel.
    assert one(clocked, "SELECT alk.retry(%s, 'w1', 1, 'x', 0)", held) is True
    pending = one(clocked, "SELECT alk.enqueue('q', '{}')")
    assert one(clocked, "SELECT alk.cancel('q', %s)", held) is True
    assert one(clocked, "SELECT alk.cancel('q', %s)", pending) is True
    assert one(clocked, "SELECT alk.cancel('q', %s)", pending) is False
    # A notification sent after them arrives alone: none was queued before it.
    clocked.execute("SELECT pg_notify(%s, 'marker')", [channel])
    assert [n.payload for n in listener.notifies(timeout=30, stop_after=1)] == ["marker"]


@pytest.mark.parametrize(("override", "code", "fragment"), BAD_REGISTER)
def test_bad_register_is_refused_and_writes_nothing(clocked, override, code, fragment):
    register(clocked, "silent-long-ago")
    pin_clock(clocked, NOW + PRUNE_S + 1)  # a good register now would prune it
    arguments = {"worker_id": "w1", "queue": "q", "host": "h", "pid": 1, "concurrency": 1, "version": "v"} | override
    with raises_lk(code, fragment):
        register(clocked, **arguments)
    assert [w["worker_id"] for w in workers(clocked)] == ["silent-long-ago"]


@pytest.mark.parametrize(("call", "code", "fragment"), [
    ("SELECT alk.worker_beat('w1', -1)", "LK002", "running"),
    ("SELECT alk.worker_beat('w1', NULL)", "LK002", "running"),
    ("SELECT alk.worker_beat('', 0)", "LK001", "worker_id"),
    ("SELECT alk.worker_beat(NULL, 0)", "LK001", "worker_id"),
    ("SELECT alk.worker_deregister('')", "LK001", "worker_id"),
    ("SELECT alk.request_stop('')", "LK001", "worker_id"),
    ("SELECT alk.request_stop(NULL)", "LK001", "worker_id"),
    ("SELECT alk.worker_beat('w1', 0, queue => '')", "LK001", "queue"),
    ("SELECT alk.worker_deregister('w1', queue => '')", "LK001", "queue"),
    ("SELECT alk.request_stop('w1', queue => '')", "LK001", "queue"),
])
def test_bad_beat_deregister_or_stop_is_refused_and_changes_nothing(clocked, call, code, fragment):
    register(clocked)
    before = workers(clocked)
    pin_clock(clocked, NOW + 7)
    with raises_lk(code, fragment):
        clocked.execute(call)
    assert workers(clocked) == before


def test_hostile_ids_are_data(clocked, connect):
    worker_id = "w'); DROP TABLE alk.worker_registry; --\u00e9\U0001f600"
    listener = connect()
    pin_clock(listener, NOW)
    channel = register(listener, worker_id, "q'\"")
    listener.execute(f'LISTEN "{channel}"')
    assert one(clocked, "SELECT alk.request_stop(%s)", worker_id) is True
    assert [n.payload for n in listener.notifies(timeout=30, stop_after=1)] == ["stop"]
    assert by_id(clocked)[worker_id]["queue"] == "q'\""


# roles -----------------------------------------------------------------------------

Login = Callable[[str], psycopg.Connection]


@pytest.fixture
def login_as(db: psycopg.Connection, dsn: str) -> Iterator[Login]:
    """A LOGIN role granted one kind (unique name, dropped after), connected."""
    made: list[tuple[str, psycopg.Connection]] = []

    def make(kind: str) -> psycopg.Connection:
        name = f"pyalk_{kind}_{secrets.token_hex(4)}"
        db.execute(f'CREATE ROLE "{name}" LOGIN')
        db.execute(f"SELECT alk.grant_{kind}(%s)", [name])
        conn = psycopg.connect(make_conninfo(dsn, user=name), autocommit=True)
        made.append((name, conn))
        return conn

    yield make
    for name, conn in made:
        conn.close()
        db.execute(f'DROP OWNED BY "{name}"')
        db.execute(f'DROP ROLE "{name}"')


def test_each_function_needs_its_kind(db, login_as):
    worker, reader, admin = login_as("worker"), login_as("reader"), login_as("admin")
    assert register(worker).startswith("alk_w_")
    assert beat(worker, running=1) is False
    assert [w["worker_id"] for w in workers(reader)] == ["w1"]
    for statement in ["SELECT alk.request_stop('w1')", "SELECT alk.worker_register('w2', 'q', 'h', 1, 1, 'v')",
                      "SELECT alk.worker_beat('w1', 0)", "SELECT alk.worker_deregister('w1')"]:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            reader.execute(statement)
    for statement in ["SELECT alk.request_stop('w1')", "SELECT * FROM alk.workers()",
                      "SELECT * FROM alk.worker_registry"]:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            worker.execute(statement)
    assert by_id(db)["w1"]["stopping"] is False
    assert one(admin, "SELECT alk.request_stop('w1')") is True
    assert beat(worker) is True
    assert one(worker, "SELECT alk.worker_deregister('w1')") is True


def test_a_limited_role_sees_and_touches_only_workers_of_its_queues(db, login_as):
    team_a = login_as("admin")
    team_a_name = one(team_a, "SELECT session_user::text")
    register(db, "b-worker", "team-b.q")
    db.execute("SELECT alk.limit_names(%s, ARRAY['team-a.'])", [team_a_name])
    assert register(team_a, "a-worker", "team-a.q").startswith("alk_w_")
    with raises_lk("LK005", "'team-b.q'"):
        register(team_a, "a-2", "team-b.q")
    with raises_lk("LK005", "'b-worker'", "outside the names"):
        register(team_a, "b-worker", "team-a.q")
    assert [w["worker_id"] for w in workers(team_a)] == ["a-worker"]
    assert beat(team_a, "b-worker") is None
    assert one(team_a, "SELECT alk.request_stop('b-worker')") is False
    assert one(team_a, "SELECT alk.worker_deregister('b-worker')") is False
    with raises_lk("LK005", "'team-b.q'"):
        team_a.execute("SELECT alk.request_stop('b-worker', queue => 'team-b.q')")
    row = by_id(db)["b-worker"]
    assert (row["queue"], row["stopping"]) == ("team-b.q", False)
    assert set(by_id(db)) == {"a-worker", "b-worker"}


@pytest.fixture
def fresh_database(pg_server: Any) -> Iterator[str]:
    """An empty database (no pyalk yet), dropped after."""
    name = f"pyalk_workers_{secrets.token_hex(5)}"
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield pg_server.dsn_for(name)
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def test_roles_granted_before_the_version_get_its_functions(fresh_database):
    """The version that adds the registry re-grants every recorded kind
    (alk._regrant): a worker role granted before it can register after it."""
    chain = [v.number for v in versions()]
    landed = chain[[v.mechanism for v in versions()].index("workers")]
    migrate.upgrade(fresh_database, chain[chain.index(landed) - 1])
    names = {kind: f"pyalk_{kind}_{secrets.token_hex(4)}" for kind in ("worker", "reader", "admin")}
    with psycopg.connect(fresh_database, autocommit=True) as conn:
        try:
            for kind, name in names.items():
                conn.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(name)))
                conn.execute(f"SELECT alk.grant_{kind}(%s)", [name])
            migrate.upgrade(fresh_database, landed)
            for kind, function in [("worker", "alk.worker_register(text, text, text, bigint, bigint, text)"),
                                   ("worker", "alk.worker_beat(text, bigint, text)"),
                                   ("worker", "alk.worker_deregister(text, text)"),
                                   ("reader", "alk.workers()"), ("admin", "alk.request_stop(text, text)")]:
                assert one(conn, "SELECT has_function_privilege(%s, %s, 'EXECUTE')", names[kind], function), (
                    kind, function)
            assert one(conn, "SELECT has_function_privilege(%s, 'alk.request_stop(text, text)', 'EXECUTE')",
                       names["reader"]) is False
        finally:
            for name in names.values():
                conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
                conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def test_the_recipe_of_clients_md_runs_in_psql(db, dsn, tmp_path):
    """docs/clients.md, "A worker in any language": its one sql block, as written."""
    from tests.test_docs_examples import psql_binary

    psql = psql_binary()
    if psql is None:
        pytest.skip("no psql binary on this machine")
    page = (Path(__file__).resolve().parents[2] / "docs/clients.md").read_text()
    section = page.split("## A worker in any language", 1)[1]
    (block,) = re.findall(r"```sql\n(.*?)```", section, re.S)
    script = tmp_path / "worker.sql"
    script.write_text(block)
    result = subprocess.run([psql, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-f", str(script)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["f", "t"]
    assert workers(db) == []
