"""``pyalk schedule add|list|remove|next``, ``pyalk scheduler`` and ``pyalk
relay`` through the CLI's entry point (``pyalk.cli.main`` in-process, and
``python -m pyalk`` in a subprocess for the signal-driven scheduler)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.cli import deliveries
from tests.cli.cli_run import logging_restored, one_error_line, run
from tests.helpers import until

ROOT = Path(__file__).resolve().parents[2]
NOW = 1_700_000_000


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No PYALK_DSN from outside; the logging the long-running commands set up undone afterwards."""
    monkeypatch.delenv("PYALK_DSN", raising=False)
    deliveries.delivered.clear()
    with logging_restored():
        yield


def schedules(db: psycopg.Connection) -> list[tuple[object, ...]]:
    return db.execute("SELECT name, spec, queue, tz, payload, priority, expires FROM alk.list_schedules()"
                      " ORDER BY name").fetchall()


# pyalk schedule ----------------------------------------------------------------------------


def test_schedule_add_registers_and_prints_the_next_fire(capsys, dsn, db):
    code, out, _ = run(capsys, "schedule", "add", "nightly", "0 2 * * *", "reports", "--tz", "Europe/Berlin",
                       "--payload", '{"kind": "daily"}', "--priority", "5", "--expires", "3600", "--dsn", dsn)
    assert code == 0
    [(name, spec, queue, tz, payload, priority, expires)] = schedules(db)
    assert (name, spec, queue, tz, payload, priority, expires) == (
        "nightly", "0 2 * * *", "reports", "Europe/Berlin", {"kind": "daily"}, 5, 3600)
    next_fire_at = db.execute("SELECT next_fire_at FROM alk.get_schedule('nightly')").fetchone()[0]
    assert out.strip().startswith("schedule 'nightly' into 'reports': next fire ")
    assert out.strip().endswith(f"UTC ({next_fire_at})")


@pytest.mark.parametrize(("argv", "expected"), [
    (["add", "bad", "99 * * * *", "q"], "error: spec '99 * * * *'"),
    (["add", "bad", "@every 0s", "q"], "error: spec '@every 0s'"),
    (["add", "bad", "@daily", "q", "--tz", "Mars/Olympus"],
     "error: tz 'Mars/Olympus' is not a known IANA time zone name"),
    (["add", "bad", "@daily", "alk:q"], "error: queue 'alk:q' uses the reserved prefix"),
    (["add", "bad", "@daily", "q", "--payload", "{nope"], "error: --payload is not JSON"),
    (["next", "61 * * * *"], "error: spec '61 * * * *'"),
    (["next", "@daily", "--tz", "Nowhere/Else"], "error: tz 'Nowhere/Else' is not a known IANA time zone name"),
    (["remove", "missing"], "error: no schedule named 'missing'"),
])
def test_bad_specs_zones_and_names_are_one_error_line(capsys, dsn, db, argv, expected):
    code, out, err = run(capsys, "schedule", *argv, "--dsn", dsn)
    assert code == 1 and out == ""
    assert one_error_line(err).startswith(expected)
    assert schedules(db) == []


def test_schedule_list_shows_every_schedule_literally_and_as_json(capsys, dsn, db):
    assert run(capsys, "schedule", "list", "--dsn", dsn)[1].strip() == "no schedules"
    db.execute("SELECT alk.schedule('x[/]', '@daily', '[b]q[/b]'), alk.schedule('beat', '@every 30s', 'pings')")
    code, out, _ = run(capsys, "schedule", "list", "--dsn", dsn)
    assert code == 0
    assert "x[/]" in out and "[b]q[/b]" in out and "@every 30s" in out
    code, out, _ = run(capsys, "schedule", "list", "--json", "--dsn", dsn)
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(row["name"], row["queue"], row["tz"]) for row in rows] == [("beat", "pings", "UTC"),
                                                                       ("x[/]", "[b]q[/b]", "UTC")]


def test_schedule_remove_deletes_it(capsys, dsn, db):
    db.execute("SELECT alk.schedule('nightly', '0 2 * * *', 'reports')")
    code, out, _ = run(capsys, "schedule", "remove", "nightly", "--dsn", dsn)
    assert (code, out.strip()) == (0, "removed schedule 'nightly'")
    assert schedules(db) == []


def test_schedule_next_prints_the_next_fires_of_a_spec(capsys, dsn, db):
    code, out, _ = run(capsys, "schedule", "next", "0 2 * * *", "--tz", "Europe/Berlin", "-n", "3",
                       "--after", str(NOW), "--dsn", dsn)
    assert code == 0
    # 02:00 in Berlin is 01:00 UTC in November.
    assert out.splitlines() == ["1700010000  2023-11-15 01:00:00 UTC", "1700096400  2023-11-16 01:00:00 UTC",
                                "1700182800  2023-11-17 01:00:00 UTC"]


# pyalk scheduler ------------------------------------------------------------------------------


def test_the_scheduler_fires_due_schedules_and_stops_cleanly_on_sigint(dsn, db):
    db.execute("SELECT alk.schedule('beat', '@every 1s', 'beats')")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYALK_DSN", None)
    process = subprocess.Popen([sys.executable, "-m", "pyalk", "scheduler", "--dsn", dsn, "--poll-interval", "0.5"],
                               cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        until(lambda: db.execute("SELECT count(*) FROM alk.list_jobs('beats')").fetchone()[0] >= 2,
              "the scheduler to fire two boundaries")
        leader = db.execute("SELECT owner FROM alk.get_lock('alk:scheduler')").fetchone()[0]
        assert leader is not None
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, err
    assert "Traceback" not in err
    assert "fired beat" in err and err.strip().endswith("scheduler stopped")
    # A clean stop releases the lease: a standby takes over at once.
    assert db.execute("SELECT owner FROM alk.get_lock('alk:scheduler')").fetchone() is None


def test_the_scheduler_on_a_bad_dsn_is_one_error_line(capsys, tmp_path):
    code, _, err = run(capsys, "scheduler", "--dsn", f"host={tmp_path} dbname=nowhere")
    assert code == 1
    line = one_error_line(err)
    assert line.startswith("error: cannot connect to PostgreSQL at ")
    assert f"host={tmp_path}" in line and "dbname=nowhere" in line


# pyalk relay -----------------------------------------------------------------------------------


def messages(db: psycopg.Connection, *payloads: object) -> list[int]:
    return [db.execute("SELECT alk.outbox_enqueue('billing', %s::jsonb)", [json.dumps(p)]).fetchone()[0]
            for p in payloads]


@pytest.mark.parametrize("target", ["tests.cli.deliveries:deliver", "tests.cli.deliveries:deliver_async"])
def test_relay_delivers_every_due_message_then_stops_in_burst_mode(capsys, dsn, db, target):
    ids = messages(db, {"invoice": 1}, {"invoice": 2})
    code, _, err = run(capsys, "relay", "billing", target, "--burst", "--dsn", dsn)
    assert code == 0, err
    assert deliveries.delivered == [{"invoice": 1}, {"invoice": 2}]
    assert err.strip().endswith("relay of 'billing' stopped: 2 delivered, 0 failed")
    for job_id in ids:  # delivered messages are gone
        assert db.execute("SELECT id FROM alk.outbox_get_job('billing', %s)", [job_id]).fetchone() is None


def test_relay_retries_a_failed_delivery_with_its_error(capsys, dsn, db):
    [down, delivered] = messages(db, "down", {"invoice": 3})
    code, _, err = run(capsys, "relay", "billing", "tests.cli.deliveries:deliver", "--burst", "--dsn", dsn)
    assert code == 0, err
    assert deliveries.delivered == [{"invoice": 3}]
    assert db.execute("SELECT id FROM alk.outbox_get_job('billing', %s)", [delivered]).fetchone() is None
    assert err.strip().endswith("1 delivered, 1 failed")
    row = db.execute("SELECT state, attempts, last_error FROM alk.outbox_get_job('billing', %s)", [down]).fetchone()
    assert row == ("pending", 1, None)  # a retry keeps no error text; the relay's log says it
    assert f"message {down} (attempt 1 of 5) not delivered, retried later: ConnectionError: ledger unreachable" in err


def test_relay_runs_until_sigint_then_stops_cleanly(dsn, db):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYALK_DSN", None)
    process = subprocess.Popen([sys.executable, "-m", "pyalk", "relay", "billing", "tests.cli.deliveries:deliver_async",
                                "--poll-interval", "0.2", "--dsn", dsn],
                               cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        [first] = messages(db, {"invoice": 1})
        until(lambda: db.execute("SELECT id FROM alk.outbox_get_job('billing', %s)", [first]).fetchone() is None,
              "the relay to deliver the first message")
        [second] = messages(db, {"invoice": 2})  # written while the relay idles: seen at its next look
        until(lambda: db.execute("SELECT id FROM alk.outbox_get_job('billing', %s)", [second]).fetchone() is None,
              "the relay to deliver the second message")
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, err
    assert "Traceback" not in err
    assert err.strip().endswith("relay of 'billing' stopped: 2 delivered, 0 failed")


@pytest.mark.parametrize(("argv", "expected"), [
    (["relay", "billing", "tests.cli.deliveries:missing"], "error: 'tests.cli.deliveries' has no attribute"),
    (["relay", "billing", "nocolon"], "error: the delivery function must look like module:name"),
    (["relay", "alk:x", "tests.cli.deliveries:deliver", "--burst"], "error: outbox 'alk:x' uses the reserved prefix"),
])
def test_relay_refuses_bad_targets_and_names_in_one_line(capsys, dsn, db, argv, expected):
    code, _, err = run(capsys, *argv, "--dsn", dsn)
    assert code == 1
    assert one_error_line(err).startswith(expected)
