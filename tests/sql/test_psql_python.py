"""psql and Python agree on docs/queue.md's examples: a section's ```sql
block runs in psql as the page runs it (every block before it first, so its
literal ids and pinned clock hold), and the same steps go through the Python
wrapper on a database of their own; both give the same answers, compared as
psql prints them (-A -t)."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import astuple
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pyalk import Alk
from tests.helpers import one
from tests.test_docs_examples import DOCS, psql_binary

MARK = "-- the section starts here --"


def psql_says(dsn: str, heading: str, tmp_path: Path) -> list[str]:
    """What psql prints for the first sql block under ``heading`` of
    docs/queue.md, run after every block above it, as the page runs them."""
    psql = psql_binary()
    if psql is None:
        pytest.skip("no psql binary on this machine")
    page = (DOCS / "queue.md").read_text()
    before, section = page.split(f"\n## {heading}\n", 1)
    blocks = re.findall(r"```sql\n(.*?)```", before, re.S)
    [target, *_] = re.findall(r"```sql\n(.*?)```", section, re.S)
    script = tmp_path / "section.sql"
    script.write_text("\n".join([*blocks, f"\\echo '{MARK}'", target]))
    result = subprocess.run([psql, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-f", str(script)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.split(MARK + "\n", 1)[1].split("\n")[:-1]


def as_psql(*values: Any) -> str:
    """One row as psql -A -t prints it: NULL empty, booleans t/f, jsonb as text."""
    def cell(value: Any) -> str:
        if value is None:
            return ""
        if isinstance(value, bool):
            return "t" if value else "f"
        if isinstance(value, dict | list):
            return json.dumps(value)
        return str(value)
    return "|".join(cell(v) for v in values)


@pytest.fixture
def python(second_dsn: str) -> Iterator[tuple[Alk, psycopg.Connection]]:
    """The wrapper on one connection of its own database, whose clock the test pins."""
    conn = psycopg.connect(second_dsn, autocommit=True)
    yield Alk(conn), conn
    conn.close()


def pin(conn: psycopg.Connection, at: int) -> None:
    conn.execute("SELECT set_config('alk.now', %s, false)", [str(at)])


def test_limits_and_serial_groups(dsn, python, tmp_path):
    psql = psql_says(dsn, "Limits and serial groups: alk.set_queue_limits, group_key", tmp_path)
    alk, conn = python
    pin(conn, 1_700_000_200)
    api = alk.queue("api")
    says = [as_psql(api.set_limits(max_running=2, rate=3, rate_period_s=60)), as_psql(*astuple(api.limits())),
            as_psql(len(api.enqueue_batch([1, 2, 3, 4])))]
    held = api.claim_batch("worker-1", 10)
    says += [as_psql(len(held)), as_psql(api.next_claim_at()), as_psql(api.ack_batch("worker-1", held)),
             as_psql(len(api.claim_batch("worker-1", 10))), as_psql(api.next_claim_at())]
    pin(conn, 1_700_000_260)
    says.append(as_psql(len(api.claim_batch("worker-1", 10))))

    sync = alk.queue("sync")
    sync.enqueue({"n": 1}, group_key="customer:42")
    says.append(as_psql(len(sync.enqueue_batch([{"n": 2}, {"n": 3}], group_keys=["customer:42", "customer:7"]))))
    [first] = sync.claim_batch("worker-1", 1)
    others = sync.claim_batch("worker-2", 10)
    says += [as_psql(first.payload), *(as_psql(h.payload) for h in others), as_psql(first.ack()),
             *(as_psql(h.payload) for h in sync.claim_batch("worker-2", 10))]

    expected = ["t", "api|2|3|60|", "4", "2", "1700000501", "2", "1", "1700000260", "1",
                "2", '{"n": 1}', '{"n": 3}', "t", '{"n": 2}']
    assert psql == expected
    assert says == expected


def test_snooze(dsn, python, tmp_path):
    psql = psql_says(dsn, "Putting a job off: alk.snooze", tmp_path)
    alk, conn = python
    pin(conn, 1_700_000_105)  # the page's clock at that section
    reports = alk.queue("reports")
    job_id = reports.enqueue({"week": 47})
    handle = reports.claim_one("worker-1")
    assert handle is not None
    says = [as_psql(job_id), as_psql(handle.id, handle.job.attempts), as_psql(handle.snooze(600))]
    job = reports.get_job(job_id)
    assert job is not None
    says += [as_psql(job.state, job.run_at, job.attempts, job.attempts_refunded), as_psql(handle.ack())]

    def expected(i: int) -> list[str]:
        return [str(i), f"{i}|1", "t", "pending|1700000705|1|1", "f"]
    assert psql == expected(int(psql[0]))
    assert says == expected(job_id)


def test_cancel_of_a_processing_job(dsn, db, python, tmp_path):
    psql = psql_says(dsn, "alk.cancel", tmp_path)
    assert one(db, "SELECT count(*) FROM alk.get_job('emails', 6)") == 0
    alk, _ = python
    emails = alk.queue("emails")
    job_id = emails.enqueue({"to": "zed"})
    handle = emails.claim_one("worker-1")
    assert handle is not None and handle.id == job_id
    says = [as_psql(emails.cancel(job_id)), as_psql(handle.ack())]
    assert emails.get_job(job_id) is None
    assert psql == says == ["t", "f"]


def test_dependencies(dsn, db, python, tmp_path):
    psql = psql_says(dsn, "Dependencies: after", tmp_path)
    # fetch was acked: parse and index are left.
    parse, index = [r[0] for r in db.execute("SELECT id FROM alk.list_jobs('pipeline') ORDER BY id")]
    assert [one(db, "SELECT state FROM alk.get_job('pipeline', %s)", i) for i in (parse, index)] == ["pending"] * 2

    alk, _ = python
    queue = alk.queue("pipeline")
    first = queue.enqueue({"step": "fetch"})
    second = queue.enqueue({"step": "parse"}, after=[first])
    third = queue.enqueue({"step": "index"}, after=[second])
    claimed = queue.claim_batch("worker-1", 10)
    got = queue.get_job(second)
    assert got is not None
    says = [as_psql(*(c.payload for c in claimed)), as_psql(got.state), as_psql(claimed[0].ack())]
    again = queue.claim_batch("worker-1", 10)
    says += [as_psql(*(c.id == second for c in again)), as_psql(again[0].fail("bad page"))]
    dead = queue.get_job(third)
    assert dead is not None
    says += [as_psql(dead.state, dead.last_error), as_psql(queue.requeue_dead([second]))]

    def expected(died: int) -> list[str]:
        return ['{"step": "fetch"}', "pending", "t", "t", "t", f"dead|after job {died} died", "2"]
    assert psql == expected(parse)
    assert says == expected(second)
