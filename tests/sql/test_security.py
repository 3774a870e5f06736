"""The roles model (docs/security.md): the clock privilege, the four role
kinds and what each may and may not do, checked with real login roles, the
real worker process and the CLI running as them."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from tests.helpers import one, raises_lk

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("reader", "producer", "worker", "admin")
#: Names the lists carry for functions other versions add (queue 0009, schedule 0010);
#: allowed to be missing until those land.
PENDING = {"release_jobs", "settle_and_claim", "pause_queue", "resume_queue", "scheduler_tick"}

Role = Callable[..., str]


@pytest.fixture
def role(db: psycopg.Connection, dsn: str) -> Iterator[Role]:
    """Create a LOGIN role (roles are cluster-wide: a unique name, dropped
    after), optionally granted a kind; returns a DSN that logs in as it."""
    made: list[str] = []

    def make(kind: str | None = None, *, clock: bool = False) -> str:
        name = f"pyalk_{kind or 'none'}_{secrets.token_hex(4)}"
        db.execute(f'CREATE ROLE "{name}" LOGIN')
        made.append(name)
        if kind:
            db.execute(f"SELECT alk.grant_{kind}(%s)", [name])
        if clock:
            db.execute(f'GRANT EXECUTE ON FUNCTION alk.clock_privilege() TO "{name}"')
        return make_conninfo(dsn, user=name)

    yield make
    for name in made:
        db.execute(f'DROP OWNED BY "{name}"')
        db.execute(f'DROP ROLE "{name}"')


def login(conninfo: str) -> psycopg.Connection:
    return psycopg.connect(conninfo, autocommit=True)


def user_of(conninfo: str) -> str:
    return psycopg.conninfo.conninfo_to_dict(conninfo)["user"]  # type: ignore[return-value]


# the clock ---------------------------------------------------------------------


def test_every_kind_reads_the_clock_and_the_schema(role):
    for kind in KINDS:
        with login(role(kind)) as conn:
            assert one(conn, "SELECT alk.now()") > 1_700_000_000
            assert one(conn, "SELECT alk.pinned_clock()") is None
            assert one(conn, "SELECT version FROM alk.schema_info()")


def test_pinning_the_clock_needs_the_clock_privilege(role):
    with login(role("worker")) as conn:
        conn.execute("SET alk.now = '1700000000'")
        with raises_lk("LK005", "SET alk.now", "clock privilege", "alk.clock_privilege()"):
            conn.execute("SELECT alk.now()")
        with raises_lk("LK005", "clock privilege"):
            conn.execute("SELECT * FROM alk.claim('q', 'w', 1)")
        conn.execute("SET alk.now = ''")  # empty is unpinned: anyone's
        assert one(conn, "SELECT alk.now()") > 1_700_000_000
        conn.execute("RESET alk.now")
        assert one(conn, "SELECT alk.pinned_clock()") is None
    with login(role("worker", clock=True)) as conn:
        conn.execute("SET alk.now = '1700000000'")
        assert one(conn, "SELECT alk.now()") == one(conn, "SELECT alk.pinned_clock()") == 1_700_000_000
        conn.execute("SET alk.now = 'soon'")
        with raises_lk("LK002", "alk.now", "'soon'"):
            conn.execute("SELECT alk.now()")


def test_a_pinned_clock_cannot_take_what_another_holds(db, role):
    """The attacks of issue 13: a later clock to claim a job under a valid
    lease, take a held lock, sweep unexpired jobs. All refused, nothing moved."""
    job_id = one(db, "SELECT alk.enqueue('q', '1', expires => 600)")
    with login(role("worker")) as a, login(role("worker")) as b, login(role("admin")) as admin:
        assert one(a, "SELECT id FROM alk.claim('q', 'a', 1)") == job_id
        assert one(a, "SELECT alk.try_lock('report', 'a', 60)") is True
        for conn in (b, admin):
            conn.execute("SET alk.now = '9000000000'")
        with raises_lk("LK005"):
            b.execute("SELECT * FROM alk.claim('q', 'b', 1)")
        with raises_lk("LK005"):
            b.execute("SELECT alk.try_lock('report', 'b', 60)")
        with raises_lk("LK005"):
            admin.execute("SELECT alk.sweep_expired('q')")
        assert one(a, "SELECT alk.ack(%s, 'a', 1)", job_id) is True
        assert one(db, "SELECT owner FROM alk.get_lock('report')") == "a"


def test_the_privilege_belongs_to_the_session_user(db, role):
    """SET ROLE narrows a session it can RESET, so a privileged login keeps
    the privilege under SET ROLE; an unprivileged login never gains it by
    SET ROLE into a role that holds it without inheriting."""
    plain = role("worker")
    holder = role("worker", clock=True)
    db.execute(f'GRANT "{user_of(plain)}" TO "{user_of(holder)}"')
    with login(holder) as conn:
        conn.execute(f'SET ROLE "{user_of(plain)}"')
        conn.execute("SET alk.now = '1700000000'")
        assert one(conn, "SELECT alk.now()") == 1_700_000_000
    other = role("worker")
    # A member that does not inherit (NOINHERIT: PostgreSQL 15 has no GRANT ... WITH INHERIT).
    db.execute(f'ALTER ROLE "{user_of(other)}" NOINHERIT')
    db.execute(f'GRANT "{user_of(holder)}" TO "{user_of(other)}"')
    with login(other) as conn:
        conn.execute(f'SET ROLE "{user_of(holder)}"')
        conn.execute("SET alk.now = '1700000000'")
        with raises_lk("LK005", user_of(other)):
            conn.execute("SELECT alk.now()")


def test_ticking_later_than_the_clock_needs_the_clock_privilege(db, role):
    db.execute("SELECT alk.schedule('far', '@every 1d', 'q')")
    with login(role("admin")) as conn:
        with raises_lk("LK005", "alk.tick at 9223372036854775807", "later than the clock"):
            conn.execute("SELECT * FROM alk.tick(9223372036854775807)")
        assert conn.execute("SELECT * FROM alk.tick()").fetchall() == []
        assert conn.execute("SELECT * FROM alk.tick(NULL)").fetchall() == []
        assert conn.execute("SELECT * FROM alk.tick(alk.now() - 86400)").fetchall() == []
    assert one(db, "SELECT count(*) FROM alk.list_jobs('q')") == 0
    with login(role("admin", clock=True)) as conn:
        assert len(conn.execute("SELECT * FROM alk.tick(alk.now() + 86400)").fetchall()) == 1


# the role kinds ------------------------------------------------------------------------


def _executable(conn: psycopg.Connection) -> set[str]:
    return {row[0] for row in conn.execute(
        "SELECT p.oid::regprocedure::text FROM pg_proc p WHERE p.pronamespace = 'alk'::regnamespace "
        "AND has_function_privilege(p.oid, 'EXECUTE')")}


@pytest.mark.parametrize("kind", KINDS)
def test_a_kind_gets_exactly_its_list(db, role, kind):
    listed = {row[0] for row in db.execute("SELECT * FROM alk.role_functions(%s)", [kind])}
    with login(role(kind)) as conn:
        assert _executable(conn) == listed
    assert {"alk.now()", "alk.pinned_clock()", "alk.schema_info()"} <= listed
    assert "alk.clock_privilege()" not in listed


def test_the_lists_cover_every_public_function(db):
    public = {row[0] for row in db.execute(
        "SELECT proname FROM pg_proc WHERE pronamespace = 'alk'::regnamespace AND proname !~ '^_'")}
    listed = {row[0] for row in db.execute("SELECT function_name FROM alk._role_functions()")}
    assert public - listed == {"clock_privilege"}, "classify every new public function in alk._role_functions"
    assert listed - public - {n for n in listed if n.startswith("_")} <= PENDING
    admin = {row[0].split("(")[0].removeprefix("alk.")
             for row in db.execute("SELECT * FROM alk.role_functions('admin')")}
    assert public - admin == {"clock_privilege"}


MAY_NOT = {
    "reader": ["SELECT alk.enqueue('q', '1')", "SELECT * FROM alk.claim('q', 'w', 1)", "SELECT alk.publish('s', '1')",
               "SELECT alk.try_lock('l', 'o', 5)", "SELECT alk.cancel('q', 1)", "SELECT alk.grant_reader('x')",
               "SELECT alk.worker_register('w', 'q', 'h', 1, 1, 'v')", "SELECT alk.request_stop('w')"],
    "producer": ["SELECT * FROM alk.claim('q', 'w', 1)", "SELECT alk.ack(1, 'w')", "SELECT alk.cancel('q', 1)",
                 "SELECT alk.save_offset('s', 'c', 1)", "SELECT * FROM alk.list_jobs('q')",
                 "SELECT alk.limit_names('x', NULL)", "SELECT alk.worker_beat('w', 0)",
                 "SELECT * FROM alk.workers()"],
    "worker": ["SELECT alk.cancel('q', 1)", "SELECT alk.sweep_expired('q')", "SELECT alk.trim_to('s', 1)",
               "SELECT alk.schedule('n', '@hourly', 'q')", "SELECT * FROM alk.tick()",
               "SELECT alk._try_lock('alk:scheduler', 'me', 60)", "SELECT alk.requeue_dead('q')",
               "SELECT alk.grant_worker('x')", "SELECT alk.request_stop('w')", "SELECT * FROM alk.workers()",
               "SELECT alk.set_queue_retention('q', 60)"],
    "admin": ["GRANT EXECUTE ON FUNCTION alk.clock_privilege() TO CURRENT_USER"],
}


@pytest.mark.parametrize("kind", KINDS)
def test_a_kind_may_not_call_what_it_was_not_given_nor_read_tables(role, kind):
    with login(role(kind)) as conn:
        for statement in [*MAY_NOT[kind], "SELECT * FROM alk.jobs", "SELECT * FROM alk.role_grants"]:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
            if kind == "admin":
                assert "clock_privilege" not in {r.split("(")[0] for r in _executable(conn)}


def test_each_kind_does_its_work(db, role):
    with login(role("producer")) as producer:
        job_id = one(producer, "SELECT alk.enqueue('q', '1')")
        one(producer, "SELECT alk.outbox_enqueue('mail', '2')")
        assert one(producer, "SELECT alk.publish('s', '3')") == 1
        assert one(producer, "SELECT state FROM alk.get_job('q', %s)", job_id) == "pending"
    with login(role("worker")) as worker:
        assert one(worker, "SELECT id FROM alk.claim('q', 'w', 1)") == job_id
        assert one(worker, "SELECT alk.heartbeat(%s, 'w', 1, 60)", job_id) is True
        assert one(worker, "SELECT alk.ack(%s, 'w', 1)", job_id) is True
        outbox_id = one(worker, "SELECT id FROM alk.outbox_claim('mail', 'w', 1)")
        assert one(worker, "SELECT alk.retry(%s, 'w', 1, 'later', 0)", outbox_id) is True
        assert one(worker, "SELECT count(*) FROM alk.read_from_consumer('s', 'c', 10)") == 1
        assert one(worker, "SELECT alk.save_offset('s', 'c', 1)") is True
        assert one(worker, "SELECT alk.try_lock('l', 'w', 30)") is True
        assert one(worker, "SELECT alk.worker_register('w', 'q', 'h', 1, 2, 'v')").startswith("alk_w_")
        assert one(worker, "SELECT alk.worker_beat('w', 1)") is False
    with login(role("reader")) as reader:
        assert one(reader, "SELECT count(*) FROM alk.queue_stats()") >= 1
        assert one(reader, "SELECT alk.get_offset('s', 'c')") == 1
        assert one(reader, "SELECT owner FROM alk.get_lock('l')") == "w"
        assert one(reader, "SELECT running FROM alk.workers()") == 1
        assert one(reader, "SELECT alk.queue_retention('q')") == 0
    with login(role("admin")) as admin:
        assert one(admin, "SELECT alk.trim_to('s', 1)") == 1
        assert one(admin, "SELECT alk.sweep_expired('q')") == 0
        assert one(admin, "SELECT alk.outbox_sweep_expired('mail')") == 0
        assert one(admin, "SELECT alk.cancel('q', %s)", job_id) is False
        assert one(admin, "SELECT alk.schedule('n', '@hourly', 'q')") > 0
        assert one(admin, "SELECT alk.set_queue_retention('q', 60)") is True
        assert one(admin, "SELECT alk.grant_reader(%s)", user_of(role())) > 0
        assert one(admin, "SELECT alk.request_stop('w')") is True


def test_grants_are_idempotent_recorded_and_revocable(db, role):
    target = role()
    name = user_of(target)
    first = one(db, "SELECT alk.grant_worker(%s)", name)
    assert one(db, "SELECT alk.grant_worker(%s)", name) == first
    assert db.execute("SELECT kind FROM alk.role_grants() WHERE role = %s", [name]).fetchall() == [("worker",)]
    db.execute(f'REVOKE EXECUTE ON FUNCTION alk.claim(text, text, bigint) FROM "{name}"')
    assert one(db, "SELECT alk._regrant()") >= first
    with login(target) as conn:
        assert conn.execute("SELECT * FROM alk.claim('q', 'w', 1)").fetchall() == []
    assert one(db, "SELECT alk.revoke_all(%s)", name) is True
    assert db.execute("SELECT * FROM alk.role_grants() WHERE role = %s", [name]).fetchall() == []
    with login(target) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("SELECT alk.now()")


@pytest.mark.parametrize(("call", "fragment"), [
    ("SELECT alk.grant_worker('no such role')", "'no such role'"),
    ("SELECT alk.grant_reader(NULL)", "NULL"),
    ("SELECT alk.revoke_all('Public')", "'Public'"),
    ("SELECT * FROM alk.role_functions('root')", "'root'"),
    ("SELECT alk.revoke_all(current_user)", "owns schema alk"),
])
def test_bad_role_or_kind_is_lk002(db, call, fragment):
    with raises_lk("LK002", fragment):
        db.execute(call)


def test_a_quoted_role_name_is_an_identifier_not_sql(db, role):
    name = 'we"ird; DROP TABLE x --'
    db.execute(f'CREATE ROLE "{name.replace(chr(34), chr(34) * 2)}"')
    try:
        assert one(db, "SELECT alk.grant_reader(%s)", name) > 0
        assert db.execute("SELECT kind FROM alk.role_grants() WHERE role = %s", [name]).fetchall() == [("reader",)]
    finally:
        db.execute("SELECT alk.revoke_all(%s)", [name])
        db.execute(f'DROP ROLE "{name.replace(chr(34), chr(34) * 2)}"')


# the real worker and CLI as these roles ------------------------------------------------------


def _pyalk(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYALK_DSN"} | {"PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "pyalk", *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def test_the_worker_process_and_cli_run_as_their_roles(db, role):
    producer, worker, reader = role("producer"), role("worker"), role("reader")
    for payload in ("1", "2", '"flaky"'):
        result = _pyalk("enqueue", "q", payload, "--dsn", producer)
        assert result.returncode == 0, result.stderr
    result = _pyalk("worker", "tests.cli.handlers:record", "-q", "q", "-c", "2", "--burst", "--dsn", worker)
    assert result.returncode == 0, result.stderr
    assert "worker stopped: 2 acked, 1 retried" in result.stdout + result.stderr
    result = _pyalk("status", "--dsn", reader)
    assert result.returncode == 0 and "q" in result.stdout, result.stderr
    result = _pyalk("jobs", "q", "--json", "--dsn", reader)
    assert result.returncode == 0 and "flaky" in result.stdout, result.stderr
    # and what a role was not given fails as one line
    result = _pyalk("enqueue", "q", "3", "--dsn", reader)
    assert result.returncode == 1 and "permission denied for function enqueue" in result.stderr
    result = _pyalk("requeue-dead", "q", "--dsn", worker)
    assert result.returncode == 1 and "permission denied" in result.stderr


# docs/security.md, run as written ------------------------------------------------------------

DOC_ROLES = ("app_reader", "app_viewer", "app_producer", "app_worker", "app_admin", "app_gone", "replay_tool",
             "team_a_worker")


def test_the_security_page_runs_in_psql_as_its_roles(db, dsn, tmp_path):
    """Each ```sql block of docs/security.md in order: as the owner, or as the
    role its first line names (-- as <role>); role names made unique."""
    from tests.test_docs_examples import psql_binary

    psql = psql_binary()
    if psql is None:
        pytest.skip("no psql binary on this machine")
    tag = secrets.token_hex(3)
    rename = {name: f"{name}_{tag}" for name in DOC_ROLES}
    blocks = re.findall(r"```sql\n(.*?)```", (ROOT / "docs/security.md").read_text(), re.S)
    assert len(blocks) >= 6
    try:
        for i, block in enumerate(blocks):
            text = re.sub(r"\b(" + "|".join(DOC_ROLES) + r")\b", lambda m: rename[m.group(1)], block)
            first = re.match(r"-- as (\w+)", text)
            target = make_conninfo(dsn, user=first.group(1)) if first else dsn
            script = tmp_path / f"block{i}.sql"
            script.write_text(text)
            result = subprocess.run([psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", target, "-f", str(script)],
                                    capture_output=True, text=True, timeout=60)
            assert result.returncode == 0, f"block {i}:\n{text}\n{result.stderr}"
    finally:
        for name in rename.values():
            if one(db, "SELECT count(*) FROM pg_roles WHERE rolname = %s", name):
                db.execute(f'DROP OWNED BY "{name}"')
                db.execute(f'DROP ROLE "{name}"')


# name limits ---------------------------------------------------------------------------------


def test_a_limited_role_reaches_only_names_under_its_prefixes(db, role):
    team_a = role("worker")
    db.execute("SELECT alk.grant_producer(%s), alk.grant_reader(%s)", [user_of(team_a)] * 2)
    assert one(db, "SELECT alk.limit_names(%s, ARRAY['team-a.', 'shared.', 'team-a.'])", user_of(team_a)) == 2
    other_job = one(db, "SELECT alk.enqueue('team-b.q', '1')")
    db.execute("SELECT * FROM alk.claim('team-b.q', 'b-worker', 1)")
    db.execute("SELECT alk.try_lock('team-b.l', 'b', 60), alk.publish('team-b.s', '1')")
    with login(team_a) as conn:
        own = one(conn, "SELECT alk.enqueue('team-a.q', '1')")
        assert one(conn, "SELECT id FROM alk.claim('team-a.q', 'a-worker', 1)") == own
        assert one(conn, "SELECT alk.ack(%s, 'a-worker', 1)", own) is True
        one(conn, "SELECT alk.outbox_enqueue('shared.mail', '1')")
        outbox_id = one(conn, "SELECT id FROM alk.outbox_claim('shared.mail', 'a-worker', 1)")
        assert one(conn, "SELECT alk.ack(%s, 'a-worker', 1)", outbox_id) is True
        for statement in ["SELECT * FROM alk.claim('team-b.q', 'a-worker', 1)", "SELECT alk.enqueue('team-b.q', '1')",
                          "SELECT alk.try_lock('team-b.l', 'a', 60)", "SELECT alk.publish('team-b.s', '2')",
                          "SELECT * FROM alk.read_from_consumer('team-b.s', 'c', 10)",
                          "SELECT alk.outbox_enqueue('team-b.mail', '1')", "SELECT * FROM alk.get_job('team-b.q', 1)",
                          "SELECT alk.next_claim_at('team-b.q')", "SELECT alk.queue_channel('team-b.q')",
                          "SELECT * FROM alk.queue_stats('team-b.q')"]:
            with raises_lk("LK005", "is outside the names role", "'team-a.'", "'shared.'"):
                conn.execute(statement)
        # A job of another team's queue is never held, whatever the worker id and token.
        assert one(conn, "SELECT alk.ack(%s, 'b-worker', 1)", other_job) is False
        assert one(conn, "SELECT alk.heartbeat(%s, 'b-worker', NULL, 600)", other_job) is False
        assert one(conn, "SELECT alk.ack_batch(ARRAY[%s]::bigint[], 'b-worker')", other_job) == 0
        visible = {row[0] for row in conn.execute("SELECT queue FROM alk.queue_stats()")}
        assert "team-b.q" not in visible and visible <= {"team-a.q", "alk:outbox:shared.mail"}
        # no setting lifts it
        conn.execute("SET alk.name_limits = 'off'")
        with raises_lk("LK005"):
            conn.execute("SELECT * FROM alk.claim('team-b.q', 'a-worker', 1)")
    assert one(db, "SELECT state FROM alk.get_job('team-b.q', %s)", other_job) == "processing"
    assert db.execute("SELECT * FROM alk.name_limits() WHERE role = %s", [user_of(team_a)]).fetchall() == [
        (user_of(team_a), "shared."), (user_of(team_a), "team-a.")]
    assert one(db, "SELECT alk.limit_names(%s, NULL)", user_of(team_a)) == 0
    with login(team_a) as conn:
        assert conn.execute("SELECT * FROM alk.claim('team-b.q', 'a-worker', 1)").fetchall() == []


def test_limits_reach_sessions_already_open_and_lift_again(db, role):
    """The checks are planned away while no limit exists (alk._limits_active):
    the first limit must reach plans a session cached before it, and lifting
    the last one must plan them away again."""
    worker = role("worker")
    with login(worker) as conn:
        for _ in range(6):  # past plpgsql's custom-plan rounds, so plans are generic and cached
            assert conn.execute("SELECT * FROM alk.claim('team-b.q', 'w', 1)").fetchall() == []
            assert one(conn, "SELECT alk.ack(1, 'w')") is False
        assert one(db, "SELECT alk._limits_active()") is False
        db.execute("SELECT alk.limit_names(%s, ARRAY['team-a.'])", [user_of(worker)])
        assert one(db, "SELECT alk._limits_active()") is True
        with raises_lk("LK005"):
            conn.execute("SELECT * FROM alk.claim('team-b.q', 'w', 1)")
        db.execute("SELECT alk.limit_names(%s, ARRAY[]::text[])", [user_of(worker)])
        assert one(db, "SELECT alk._limits_active()") is False
        assert conn.execute("SELECT * FROM alk.claim('team-b.q', 'w', 1)").fetchall() == []


def test_a_new_limit_reaches_cached_settle_plans(db, role):
    """alk.ack and alk.ack_batch have statements of their own: a session that
    cached their plans while no limit existed must still refuse a job outside
    the limit that appears later (alk._holds plans the check in again)."""
    worker = role("worker")
    db.execute("SELECT alk.grant_producer(%s)", [user_of(worker)])
    with login(worker) as conn:
        for _ in range(6):  # past plpgsql's custom-plan rounds: generic plans, cached
            job_id = one(conn, "SELECT alk.enqueue('team-b.q', '1')")
            (token,) = conn.execute("SELECT attempts FROM alk.claim('team-b.q', 'w', 1)").fetchone()
            assert one(conn, "SELECT alk.ack(%s, 'w', %s)", job_id, token) is True
            job_id = one(conn, "SELECT alk.enqueue('team-b.q', '1')")
            (token,) = conn.execute("SELECT attempts FROM alk.claim('team-b.q', 'w', 1)").fetchone()
            assert one(conn, "SELECT alk.ack_batch(ARRAY[%s]::bigint[], 'w', ARRAY[%s]::bigint[])", job_id, token) == 1
        held = one(conn, "SELECT alk.enqueue('team-b.q', '1')")
        (token,) = conn.execute("SELECT attempts FROM alk.claim('team-b.q', 'w', 1)").fetchone()
        db.execute("SELECT alk.limit_names(%s, ARRAY['team-a.'])", [user_of(worker)])
        assert one(conn, "SELECT alk.ack(%s, 'w', %s)", held, token) is False
        assert one(conn, "SELECT alk.ack_batch(ARRAY[%s]::bigint[], 'w', ARRAY[%s]::bigint[])", held, token) == 0
    assert one(db, "SELECT state FROM alk.get_job('team-b.q', %s)", held) == "processing"


@pytest.mark.parametrize(("prefixes", "fragment"), [
    ("ARRAY['']", "got ''"), ("ARRAY['alk:outbox:']", "'alk:outbox:'"), ("ARRAY['ok', NULL]", "got NULL"),
])
def test_bad_prefixes_are_lk002_and_change_nothing(db, role, prefixes, fragment):
    name = user_of(role("worker"))
    db.execute("SELECT alk.limit_names(%s, ARRAY['keep.'])", [name])
    with raises_lk("LK002", fragment):
        db.execute(f"SELECT alk.limit_names(%s, {prefixes})", [name])
    assert db.execute("SELECT prefix FROM alk.name_limits() WHERE role = %s", [name]).fetchall() == [("keep.",)]


def test_the_worker_process_runs_as_a_limited_role(db, role):
    worker = role("worker")
    db.execute("SELECT alk.limit_names(%s, ARRAY['team-a.'])", [user_of(worker)])
    db.execute("SELECT alk.enqueue_batch('team-a.q', ARRAY['1', '2']::jsonb[])")
    result = _pyalk("worker", "tests.cli.handlers:record", "-q", "team-a.q", "--burst", "--dsn", worker)
    assert result.returncode == 0, result.stderr
    assert "worker stopped: 2 acked" in result.stdout + result.stderr
    result = _pyalk("worker", "tests.cli.handlers:record", "-q", "team-b.q", "--burst", "--dsn", worker)
    assert result.returncode == 1 and "outside the names" in result.stderr
