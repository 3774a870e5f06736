"""``pyalk status`` and ``pyalk jobs`` in an 80-column terminal (issue 27):
no header is cut, no line is wider than 80 and every row stays one line,
on a database with jobs in every state, long names, long errors and counts
that take their thousands separators."""

from __future__ import annotations

import json

import psycopg
import pytest

from tests.cli.test_cli import no_ambient_database, run

__all__ = ["no_ambient_database"]  # the autouse fixture, shared

WIDTH = 80
LONG_QUEUE = "billing-invoices-monthly"
LONG_WORKER = "worker-host.internal.example.com:123456:0f3e9a"
STATUS_WORDS = ["queue", "ready", "scheduled", "running", "lapsed", "dead", "oldest", "ready", "next", "due"]
JOBS_WORDS = ["id", "state", "attempts", "at", "(UTC)", "error", "or", "result", "payload"]


def jobs_in_every_state(db: psycopg.Connection, queue: str, *, ready: int) -> None:
    """``ready`` due jobs, 3 scheduled, 2 running, 1 lapsed and 1 dead, with
    the 7-digit ids of a queue that has run for a while."""
    db.execute("SELECT setval(pg_get_serial_sequence('alk.jobs', 'id'), 1234566)")
    dead = db.execute("SELECT alk.enqueue(%s, '{\"dies\": true}')", [queue]).fetchone()[0]  # type: ignore[index]
    db.execute("SELECT alk.claim(%s, %s, 1)", [queue, LONG_WORKER])
    db.execute("SELECT alk.fail(%s, %s, 1, %s)", [dead, LONG_WORKER, "ValueError: " + "no such invoice " * 8])
    db.execute("SELECT alk.enqueue_batch(%s, array(SELECT jsonb_build_object('n', g, 'to', 'ada@example.com')"
               " FROM generate_series(1, 2) g))", [queue])
    db.execute("SELECT alk.claim(%s, %s, 2)", [queue, LONG_WORKER])
    # Enqueued and claimed an hour ago (a pinned clock): its lease has lapsed now.
    db.execute("SELECT set_config('alk.now', (alk.now() - 3600)::text, false)")
    db.execute("SELECT alk.enqueue(%s, '{\"lapses\": true}')", [queue])
    db.execute("SELECT alk.claim(%s, %s, 1)", [queue, LONG_WORKER])
    db.execute("RESET alk.now")
    db.execute("SELECT alk.enqueue_batch(%s, array(SELECT to_jsonb(g) FROM generate_series(1, 3) g), delay => 5400)",
               [queue])
    db.execute("SELECT alk.enqueue_batch(%s, array(SELECT jsonb_build_object('n', g, 'to', 'ada@example.com')"
               " FROM generate_series(1, %s) g))", [queue, ready])


def fits(out: str, words: list[str]) -> list[str]:
    """Assert ``out`` is at most 80 wide and its table's header is whole
    (every word, on one line or stacked, and no ellipsis); the table's rows."""
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= WIDTH, out
    top = next(i for i, line in enumerate(lines) if line.startswith("┏"))
    rule = next(i for i, line in enumerate(lines) if line.startswith("┡"))
    header = lines[top + 1:rule]
    assert header and not any("…" in line for line in header), out
    assert sorted(" ".join(header).replace("┃", " ").split()) == sorted(words), out
    return [line for line in lines if line.startswith("│")]


@pytest.fixture
def narrow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", str(WIDTH))  # rich reads it: the console is 80 wide


def test_status_fits_80_columns_with_whole_headers_and_counts(capsys, dsn, db, narrow):
    jobs_in_every_state(db, "emails", ready=12_345)
    jobs_in_every_state(db, LONG_QUEUE, ready=2)
    code, out, err = run(capsys, "status", "--dsn", dsn)
    assert code == 0, err
    rows = fits(out, STATUS_WORDS)
    assert len(rows) == 2
    emails = next(row for row in rows if "emails" in row)
    # ready, scheduled, running, lapsed, dead: whole, thousands separators included
    assert emails.split("│")[2:7] == [" 12,345 ", "         3 ", "       2 ", "      1 ", "    1 "]
    assert "in 1h29m" in emails or "in 1h30m" in emails  # due in 5400 s, a second may have passed
    [long] = [row for row in rows if "emails" not in row]
    assert long.split("│")[1].strip() == "bill…thly"  # the name, cut in the middle: both ends stay


@pytest.mark.parametrize("state", [None, "processing", "dead"])
def test_jobs_fit_80_columns_with_whole_headers(capsys, dsn, db, narrow, state):
    jobs_in_every_state(db, LONG_QUEUE, ready=2)
    code, out, err = run(capsys, "jobs", LONG_QUEUE, *(["--state", state] if state else []), "--dsn", dsn)
    assert code == 0, err
    rows = fits(out, JOBS_WORDS)  # the worker column gives way to the rest at 80 columns
    listed = db.execute("SELECT state FROM alk.list_jobs(%s, %s)", [LONG_QUEUE, state]).fetchall()
    assert len(rows) == len(listed) > 0
    for row, (job_state,) in zip(rows, listed, strict=True):
        assert row.split("│")[2].strip() == job_state


def test_a_wide_terminal_keeps_one_line_headers_and_the_worker(capsys, dsn, db, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    jobs_in_every_state(db, LONG_QUEUE, ready=2)
    code, out, err = run(capsys, "jobs", LONG_QUEUE, "--state", "processing", "--dsn", dsn)
    assert code == 0, err
    header = next(line for line in out.splitlines() if line.startswith("┃"))
    assert header.split() == ["┃", "id", "┃", "state", "┃", "attempts", "┃", "at", "(UTC)", "┃", "worker", "┃",
                              "error", "or", "result", "┃", "payload", "┃"]
    assert LONG_WORKER in out
    code, out, err = run(capsys, "status", "--dsn", dsn)
    assert code == 0, err
    assert LONG_QUEUE in out and "oldest ready" in out and "next due" in out
    assert json.loads(run(capsys, "status", "--json", "--dsn", dsn)[1])[0]["queue"] == LONG_QUEUE
