"""``pyalk jobs`` and ``pyalk job`` on completed jobs and their results
(pyalk/cli/jobs.py): listed, shown whole, awaited; every value printed as
it is (a result is data, never rich markup), an 80-column table kept."""

from __future__ import annotations

import json
import threading

import psycopg
import pytest

from tests.cli.test_cli import no_ambient_database, run
from tests.cli.test_cli_edges import HOSTILE_QUEUES
from tests.helpers import one, until

__all__ = ["no_ambient_database"]  # the autouse fixture, shared

#: In jsonb's key order (shorter keys first), so it prints back as written.
HOSTILE_RESULT = {"html": "<b>x</b>", "link": "[link=http://x]y[/link]", "markup": "[red]boom[/red] [/]"}


def completed(db: psycopg.Connection, queue: str, payload: object, result: object,
              headers: object = None) -> int:
    """One job of ``queue`` (which keeps completed jobs) acked with ``result``."""
    db.execute("SELECT alk.set_queue_retention(%s, 3600)", [queue])
    job_id = one(db, "SELECT alk.enqueue(%s, %s::jsonb, headers => %s::jsonb)", queue, json.dumps(payload),
                 None if headers is None else json.dumps(headers))
    db.execute("SELECT alk.claim(%s, 'w1', 1)", [queue])
    assert one(db, "SELECT alk.ack(%s, 'w1', 1, %s, %s::jsonb)", job_id, queue, json.dumps(result))
    return int(job_id)


@pytest.mark.parametrize("queue", HOSTILE_QUEUES)
def test_completed_jobs_are_listed_with_their_results_as_they_are(capsys, dsn, db, queue, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # wide enough for whole cells
    job_id = completed(db, queue, {"p": "[/]"}, HOSTILE_RESULT)
    one(db, "SELECT alk.enqueue(%s, '1')", queue)  # pending: no result
    code, out, err = run(capsys, "jobs", queue, "--dsn", dsn)
    assert code == 0, err
    assert json.dumps(HOSTILE_RESULT) in out and '{"p": "[/]"}' in out
    line = next(line for line in out.splitlines() if line.startswith(f"│ {job_id} "))
    assert "completed" in line and json.dumps(HOSTILE_RESULT) in line

    code, out, err = run(capsys, "jobs", queue, "--state", "completed", "--json", "--dsn", dsn)
    assert code == 0, err
    [row] = json.loads(out)
    assert (row["id"], row["state"], row["result"]) == (job_id, "completed", HOSTILE_RESULT)
    assert row["completed_at"] is not None


def test_an_80_column_list_of_completed_jobs_keeps_its_headers_and_one_line_rows(capsys, dsn, db, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    for n in range(3):
        completed(db, "reports", {"report": n, "to": "ada@example.com"}, {"rows": list(range(40))})
    code, out, err = run(capsys, "jobs", "reports", "--state", "completed", "--dsn", dsn)
    assert code == 0, err
    lines = out.splitlines()
    assert all(len(line) <= 80 for line in lines), out
    assert sum(line.startswith("│ ") and "completed" in line for line in lines) == 3, out
    for word in ("id", "state", "error", "result", "payload"):
        assert word in out


def test_job_shows_one_job_whole_with_result_and_headers(capsys, dsn, db):
    job_id = completed(db, "q", {"a": 1}, HOSTILE_RESULT, headers={"traceparent": "[b]00-x[/b]"})
    code, out, err = run(capsys, "job", "q", str(job_id), "--dsn", dsn)
    assert code == 0, err
    assert f"id: {job_id}" in out and "state: completed" in out
    assert f"result: {json.dumps(HOSTILE_RESULT, ensure_ascii=False)}" in out
    assert 'headers: {"traceparent": "[b]00-x[/b]"}' in out
    code, out, err = run(capsys, "job", "q", str(job_id), "--json", "--dsn", dsn)
    assert code == 0, err
    assert json.loads(out)["result"] == HOSTILE_RESULT
    code, _, err = run(capsys, "job", "q", "999999", "--dsn", dsn)
    assert code == 1 and "no job 999999 in queue 'q'" in err


def test_job_wait_prints_the_job_once_a_worker_completes_it(capsys, dsn, db, connect):
    db.execute("SELECT alk.set_queue_retention('q', 3600)")
    job_id = one(db, "SELECT alk.enqueue('q', '1')")

    def complete() -> None:
        conn = connect()
        # The waiter has read the job after its LISTEN (its connection is idle after get_job).
        until(lambda: one(conn, "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle'"
                                " AND query LIKE '%%alk.get_job%%' AND pid <> pg_backend_pid()") >= 1,
              "the CLI to wait")
        conn.execute("SELECT alk.claim('q', 'w1', 1)")
        conn.execute("SELECT alk.ack(%s, 'w1', 1, 'q', '{\"ok\": true}')", [job_id])

    thread = threading.Thread(target=complete, daemon=True)
    thread.start()
    code, out, err = run(capsys, "job", "q", str(job_id), "--wait", "--timeout", "30", "--dsn", dsn)
    thread.join()
    assert code == 0, err
    assert "state: completed" in out and 'result: {"ok": true}' in out


def test_job_wait_says_why_there_is_no_result(capsys, dsn, db):
    db.execute("SELECT alk.set_queue_retention('q', 3600)")
    pending = one(db, "SELECT alk.enqueue('q', '1')")
    code, _, err = run(capsys, "job", "q", str(pending), "--wait", "--timeout", "0.1", "--dsn", dsn)
    assert code == 1 and f"job {pending} of queue 'q' had no outcome within 0.1s (it is pending)" in err
    db.execute("SELECT alk.claim('q', 'w1', 1)")
    db.execute("SELECT alk.fail(%s, 'w1', 1, '[red]bad[/red]')", [pending])
    code, out, err = run(capsys, "job", "q", str(pending), "--wait", "--dsn", dsn)
    assert code == 1 and "state: dead" in out and "is dead: [red]bad[/red]" in err
    plain = one(db, "SELECT alk.enqueue('plain', '1')")
    code, _, err = run(capsys, "job", "plain", str(plain), "--wait", "--dsn", dsn)
    assert code == 1 and "'plain' keeps no completed jobs" in err
