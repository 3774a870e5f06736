"""``pyalk workers``: the registry of workers as a table that fits 80
columns (and narrower), as ``--json``, and ``pyalk workers stop ID``."""

from __future__ import annotations

import json

import psycopg
import pytest

from pyalk import Alk
from tests.cli.cli_run import one_error_line, run
from tests.conftest import pin_clock
from tests.helpers import one

LONG_ID = "a-worker-id-as-long-as-a-kubernetes-pod-name-7f9d8c6b5-xk2lq"


@pytest.fixture(autouse=True)
def no_ambient_database(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYALK_DSN", raising=False)


@pytest.fixture
def registered(db: psycopg.Connection) -> list[str]:
    """Three workers: one working, one asked to stop, one silent for an hour (gone)."""
    db.execute("SELECT alk.worker_register('web-3:4242:a1b2c3', 'emails', 'web-3', 4242, 8, 'pyalk 0.1.0')")
    db.execute("SELECT alk.worker_register(%s, 'notifications-high-priority', 'node-12', 7, 2, 'node-alk 1.2')",
               [LONG_ID])
    db.execute("SELECT alk.request_stop(%s)", [LONG_ID])
    pin_clock(db, one(db, "SELECT alk.now()") - 1800)
    db.execute("SELECT alk.worker_register('old:1:ffffff', 'emails', NULL, NULL, 1, NULL)")
    pin_clock(db, None)
    return [LONG_ID, "old:1:ffffff", "web-3:4242:a1b2c3"]


def table_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.strip()]


@pytest.mark.parametrize("columns", [80, 60])
def test_the_table_fits_the_terminal_with_every_kept_header_whole(capsys, monkeypatch, dsn, registered, columns):
    monkeypatch.setenv("COLUMNS", str(columns))
    code, out, _ = run(capsys, "workers", "--dsn", dsn)
    assert code == 0
    lines = table_lines(out)
    assert all(len(line) <= columns for line in lines), out
    header = next(line for line in lines if "worker" in line and "queue" in line)
    assert [cell.strip() for cell in header.strip("┃").split("┃")] == ["worker", "queue", "state", "jobs", "beat",
                                                                       "up"]
    rows = {line.split("│")[1].strip(): line for line in lines if line.startswith("│")}
    assert len(rows) == 3
    by_state = {cells[3].strip(): cells[4].strip() for cells in (line.split("│") for line in rows.values())}
    assert by_state == {"stopping": "0/2", "gone": "0/1", "working": "0/8"}
    assert any(key.endswith("…") for key in rows)  # the long id is cut, not wrapped


def test_a_wide_terminal_shows_host_pid_and_version(capsys, monkeypatch, dsn, registered):
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = run(capsys, "workers", "--dsn", dsn)
    assert code == 0
    assert LONG_ID in out and "node-alk 1.2" in out and "4242" in out and "web-3 " in out


def test_json_is_every_row_whole(capsys, dsn, db, registered):
    code, out, _ = run(capsys, "workers", "--json", "--dsn", dsn)
    assert code == 0
    rows = json.loads(out)
    assert [row["worker_id"] for row in rows] == registered
    with Alk(db) as alk:
        assert rows == [
            {field: getattr(worker, field) for field in worker.__dataclass_fields__} for worker in alk.workers()]
    assert [(row["stopping"], row["gone"]) for row in rows] == [(True, False), (False, True), (False, False)]


def test_no_workers(capsys, dsn):
    code, out, _ = run(capsys, "workers", "--dsn", dsn)
    assert (code, out.strip()) == (0, "no workers registered")


def test_stop_asks_the_worker_and_an_unknown_id_is_exit_1(capsys, dsn, db, registered):
    code, out, _ = run(capsys, "workers", "stop", "web-3:4242:a1b2c3", "--dsn", dsn)
    assert code == 0
    assert "asked worker 'web-3:4242:a1b2c3' to stop" in out
    assert one(db, "SELECT stopping FROM alk.workers() WHERE worker_id = 'web-3:4242:a1b2c3'") is True

    code, out, err = run(capsys, "workers", "stop", "nobody", "--dsn", dsn)
    assert (code, out) == (1, "")
    assert one_error_line(err) == "error: no worker 'nobody' is registered (pyalk workers lists them)"
    code, _, err = run(capsys, "workers", "stop", "web-3:4242:a1b2c3", "--queue", "other", "--dsn", dsn)
    assert code == 1 and "for queue 'other'" in one_error_line(err)


def test_stop_takes_the_database_given_before_it(capsys, dsn, db, registered, monkeypatch):
    # Nothing else names a database: the --dsn before "stop" must be the one used.
    for name in ("PYALK_DSN", "PGHOST", "PGPORT", "PGDATABASE", "PGUSER"):
        monkeypatch.delenv(name, raising=False)
    code, out, _ = run(capsys, "workers", "--dsn", dsn, "stop", "web-3:4242:a1b2c3")
    assert code == 0 and "asked worker 'web-3:4242:a1b2c3' to stop" in out
    assert one(db, "SELECT stopping FROM alk.workers() WHERE worker_id = 'web-3:4242:a1b2c3'") is True
