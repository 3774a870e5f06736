"""Tasks (pyalk.Tasks, docs/tasks.md) through the package's exports and the
CLI's ``pyalk worker module:registry``."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import psycopg
import pytest

import pyalk
from tests.cli.test_cli import no_ambient_database, run
from tests.tasks import app
from tests.test_docs_examples import psql_binary

__all__ = ["no_ambient_database"]

DOC = Path(__file__).resolve().parents[2] / "docs" / "tasks.md"


@pytest.fixture(autouse=True)
def no_calls():
    app.calls.clear()


def rows(db: psycopg.Connection, queue: str) -> list[tuple[object, ...]]:
    return db.execute("SELECT payload, state, last_error, priority, max_attempts FROM alk.list_jobs(%s)"
                      " ORDER BY id", [queue]).fetchall()


def work(capsys, dsn: str, *argv: str) -> tuple[int, str, str]:
    return run(capsys, "worker", *argv, "--burst", "--dsn", dsn)


def test_defer_enqueues_the_payload_convention_with_the_task_defaults(dsn, db):
    with pyalk.Alk(dsn) as alk:
        job = app.send_email.defer(alk, to=app.Address("ada@example.com"), subject="hi")
        app.send_email.configure(priority=9).defer(alk, app.Address("bob@x"), "later", retry_count=2)
    assert isinstance(job, pyalk.DeferredJob) and isinstance(job.id, int) and job.queue == "emails"
    assert rows(db, "emails") == [
        ({"task": "send_email", "args": {"to": {"email": "ada@example.com", "name": ""}, "subject": "hi"}},
         "pending", None, 0, 5),
        ({"task": "send_email", "args": {"to": {"email": "bob@x", "name": ""}, "subject": "later", "retry_count": 2}},
         "pending", None, 9, 5),
    ]
    assert app.send_email(app.Address("c@x"), "direct") is None  # still a plain function
    assert app.calls == [("send_email", (app.Address("c@x"), "direct", 0))]


async def test_defer_async(dsn, db):
    async with pyalk.AsyncAlk(dsn) as alk:
        await app.typed.defer_async(alk, n=1, x=2.5, flag=True, tags=["a"], meta={"k": 1})
    ((payload, state, _, priority, _),) = rows(db, "emails")
    assert payload == {"task": "typed", "args": {"n": 1, "x": 2.5, "flag": True, "tags": ["a"], "meta": {"k": 1}}}
    assert (state, priority) == ("pending", 3)
    (due,) = db.execute("SELECT run_at - created_at FROM alk.list_jobs('emails')").fetchone()  # type: ignore[misc]
    assert due == 600


def test_defer_refuses_arguments_the_function_does_not_take(dsn, db):
    with pyalk.Alk(dsn) as alk:
        with pytest.raises(pyalk.InvalidArgument, match="task 'send_email': missing a required argument: 'subject'"):
            app.send_email.defer(alk, to=app.Address("a@x"))
        with pytest.raises(pyalk.InvalidArgument, match="unexpected keyword argument 'cc'"):
            app.send_email.defer(alk, to=app.Address("a@x"), subject="s", cc="b@x")
        with pytest.raises(pyalk.InvalidArgument, match="unknown task option 'retries'"):
            app.send_email.configure(retries=3)  # type: ignore[arg-type]
    assert rows(db, "emails") == []


def test_a_name_registered_twice_on_a_queue_is_refused():
    tasks = pyalk.Tasks()
    tasks.task(name="t")(lambda: None)
    with pytest.raises(ValueError, match="task 't' is already registered on queue 'tasks'"):
        tasks.task(name="t")(lambda: None)
    tasks.task(name="t", queue="other")(lambda: None)  # another queue: fine
    assert tasks.queues() == ["other", "tasks"]


def test_the_worker_dispatches_by_name_and_converts_arguments(capsys, dsn, db):
    with pyalk.Alk(dsn) as alk:
        app.send_email.defer(alk, to=app.Address("ada@example.com", "Ada"), subject="hi")
        app.typed.configure(delay=0).defer(alk, n=1, x=2, flag=False, tags=["a", "b"], meta={"k": 1}, anything=[1])
    code, out, err = work(capsys, dsn, "tests.tasks.app:tasks", "-q", "emails")
    assert code == 0, err
    assert "worker stopped: 2 acked, 0 retried, 0 failed" in out
    calls = dict(app.calls)  # typed has the higher priority: it ran first
    assert calls == {
        "send_email": (app.Address("ada@example.com", "Ada"), "hi", 0),
        "typed": (1, 2.0, False, ["a", "b"], {"k": 1}, None, [1]),
    }
    assert isinstance(calls["typed"][1], float)


@pytest.mark.parametrize(("payload", "error"), [
    ({"task": "send_mail", "args": {}}, "unknown task 'send_mail' on queue 'emails'; known: flaky, send_email, typed"),
    ({"args": {}}, 'a task job\'s payload is {"task": <name>, "args": {...}}, got dict'),
    ("send_email", 'a task job\'s payload is {"task": <name>, "args": {...}}, got str'),
    ({"task": "send_email", "args": []}, "task 'send_email': args must be a JSON object, got list []"),
    ({"task": "send_email", "args": {"to": {"email": "a@x"}}}, "task 'send_email': missing argument 'subject'"),
    ({"task": "send_email", "args": {"to": {"email": "a@x"}, "subject": 5}},
     "task 'send_email': argument 'subject' must be str, got int 5"),
    ({"task": "send_email", "args": {"to": "a@x", "subject": "s"}},
     "task 'send_email': argument 'to' must be a Address object, got str 'a@x'"),
    ({"task": "send_email", "args": {"to": {"mail": "a@x"}, "subject": "s"}},
     "task 'send_email': argument 'to': Address has no field 'mail'"),
    ({"task": "send_email", "args": {"to": {"email": "a@x"}, "subject": "s", "cc": "b"}},
     "task 'send_email': unexpected argument 'cc'"),
    ({"task": "typed", "args": {"n": True, "x": 1, "flag": True, "tags": [], "meta": {}}},
     "task 'typed': argument 'n' must be int, got bool True"),
    ({"task": "typed", "args": {"n": 1, "x": "1", "flag": True, "tags": [], "meta": {}}},
     "task 'typed': argument 'x' must be float, got str '1'"),
    ({"task": "typed", "args": {"n": 1, "x": 1, "flag": 1, "tags": [], "meta": {}}},
     "task 'typed': argument 'flag' must be bool, got int 1"),
    ({"task": "typed", "args": {"n": 1, "x": 1, "flag": True, "tags": [1], "meta": {}}},
     "task 'typed': argument 'tags'[0] must be str, got int 1"),
    ({"task": "typed", "args": {"n": 1, "x": 1, "flag": True, "tags": [], "meta": {"k": "v"}}},
     "task 'typed': argument 'meta'['k'] must be int, got str 'v'"),
    ({"task": "typed", "args": {"n": 1, "x": 1, "flag": True, "tags": [], "meta": {}, "note": 3}},
     "task 'typed': argument 'note' must be str | None, got int 3"),
])
def test_a_job_that_cannot_run_fails_for_good_with_a_clear_error(capsys, dsn, db, payload, error):
    db.execute("SELECT alk.enqueue('emails', %s::jsonb, max_attempts => 5)", [json.dumps(payload)])
    code, out, err = work(capsys, dsn, "tests.tasks.app:tasks")  # one queue: --queue may be left out
    assert code == 0, err
    assert "0 acked, 0 retried, 1 failed" in out
    ((_, state, last_error, _, _),) = rows(db, "emails")
    assert state == "dead"
    assert error in last_error
    assert app.calls == []


def test_an_error_raised_by_the_task_retries_as_usual(capsys, dsn, db):
    with pyalk.Alk(dsn) as alk:
        app.flaky.defer(alk)
    code, out, _ = work(capsys, dsn, "tests.tasks.app:tasks", "-q", "emails")
    assert code == 0 and "0 acked, 1 retried, 0 failed" in out
    assert db.execute("SELECT state, attempts FROM alk.list_jobs('emails')").fetchall() == [("pending", 1)]


def test_a_registry_with_an_async_task_runs_on_asyncio_and_plain_ones_in_threads(capsys, dsn, db):
    with pyalk.Alk(dsn) as alk:
        app.hello.defer(alk, name="ada")
        app.plain.defer(alk, name="bob")
    code, out, err = work(capsys, dsn, "tests.tasks.app:async_tasks")
    assert code == 0, err
    assert "2 acked" in out
    assert sorted(app.calls) == [("hello", "ada"), ("plain", "bob")]


def test_a_deferred_task_waits_for_what_the_task_returned(capsys, dsn, db):
    with pyalk.Alk(dsn) as alk:
        alk.queue("sums").set_retention(60)
        job = app.add.defer(alk, a=2, b=3)
        code, _, err = work(capsys, dsn, "tests.tasks.app:sums")
        assert code == 0, err
        assert job.wait(timeout=30) == {"sum": 5}


async def test_a_deferred_async_task_waits_too(capsys, dsn, db):
    async with pyalk.AsyncAlk(dsn) as alk:
        await alk.queue("sums").set_retention(60)
        job = await app.add.defer_async(alk, a=1, b=1)
        assert isinstance(job, pyalk.AsyncDeferredJob)
        code, _, err = work(capsys, dsn, "tests.tasks.app:sums")  # a blocking task: the threaded worker
        assert code == 0, err
        assert await job.wait(timeout=30) == {"sum": 2}


def test_a_registry_in_python_through_the_worker_class(dsn, db):
    with pyalk.Alk(dsn) as alk:
        app.send_email.defer(alk, to=app.Address("a@x"), subject="s")
        counts = alk.worker("emails", app.tasks.handler("emails"), burst=True, handle_signals=False).run()
    assert counts.acked == 1 and app.calls == [("send_email", (app.Address("a@x"), "s", 0))]


@pytest.mark.parametrize(("argv", "code", "expected"), [
    (["tests.tasks.app:tasks", "-q", "sms"], 1,
     "error: tests.tasks.app:tasks: no task runs on queue 'sms' (tasks run on: emails)"),
    (["tests.tasks.app:send_email", "-q", "emails"], 1,
     "error: tests.tasks.app:send_email is one task: run its registry"),
    (["tests.cli.handlers:record"], 2, "error: --queue is required"),
])
def test_worker_registry_errors(capsys, dsn, argv, code, expected):
    result, _, err = run(capsys, "worker", *argv, "--dsn", dsn)
    assert result == code
    assert err.strip().startswith(expected)


def test_the_psql_example_enqueues_a_task_the_worker_runs(capsys, dsn, db, tmp_path):
    psql = psql_binary()
    if psql is None:
        pytest.skip("no psql binary on this machine")
    blocks = re.findall(r"```sql\n(.*?)```", DOC.read_text(), re.S)
    assert blocks
    script = tmp_path / "tasks.sql"
    script.write_text("\n".join(blocks))
    result = subprocess.run([psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-f", str(script)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    code, out, err = work(capsys, dsn, "tests.tasks.app:tasks", "-q", "emails")
    assert code == 0 and "1 acked" in out, err
    assert app.calls == [("send_email", (app.Address("ada@example.com"), "hello", 0))]
