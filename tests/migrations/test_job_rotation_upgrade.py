"""The job_rotation version rebuilds alk.jobs as a partitioned table: every
job moves over as it was (pending, scheduled, processing under a live lease,
dead, completed), a token issued before the upgrade still acks and a stale
one (a never-issued attempt, another worker's, a lapsed claim's that was
claimed again) still cannot, dedup keys stay held, and ids go on from where
they were.
Runs on every server the suite runs on (PostgreSQL 15 and 18 in CI)."""

from __future__ import annotations

import psycopg

from pyalk.schema import migrate
from pyalk.schema.install import head, versions
from tests.conftest import pin_clock

COLUMNS = ("id, queue, state, payload, priority, run_at, attempts, max_attempts, worker_id, claimed_at, "
           "claim_expires_at, created_at, expires_at, visibility_timeout_s, backoff_base_s, dead_letter_retention_s, "
           "last_error, died_at, purge_at, dedup_key, attempts_refunded, headers, result, completed_at")


def before_rotation() -> str:
    numbers = [version.number for version in versions()]
    rotation = next(version.number for version in versions() if version.mechanism == "job_rotation")
    return numbers[numbers.index(rotation) - 1]


def one(conn: psycopg.Connection, query: str, *params: object) -> object:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def test_the_upgrade_moves_every_job_and_keeps_every_token(empty_db):
    dsn = empty_db()
    migrate.upgrade(dsn, before_rotation())
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT alk.set_queue_retention('kept', 3600)")
        held = one(conn, "SELECT alk.enqueue('q', '{\"held\": true}', dedup_key => 'k', priority => -1)")
        one(conn, "SELECT alk.enqueue('q', '{}', delay => 3600)")  # scheduled
        running = one(conn, "SELECT alk.enqueue('q', '{}', priority => 5)")
        assert one(conn, "SELECT id FROM alk.claim('q', 'w', 1)") == running
        token = one(conn, "SELECT attempts FROM alk.jobs WHERE id = %s", running)
        dead = one(conn, "SELECT alk.enqueue('q', '{}', max_attempts => 1, priority => 4)")
        assert one(conn, "SELECT id FROM alk.claim('q', 'w', 1)") == dead
        assert one(conn, "SELECT alk.fail(%s, 'w', 1, 'boom', queue => 'q')", dead) is True
        # Claimed by w1, its lease lapsed, claimed again by w2: w1's attempt 1 is stale.
        lapsed = one(conn, "SELECT alk.enqueue('q', '{}', priority => 3, visibility_timeout_s => 1)")
        assert one(conn, "SELECT id FROM alk.claim('q', 'w1', 1)") == lapsed
        now = one(conn, "SELECT alk.now()")
        assert isinstance(now, int)
        pin_clock(conn, now + 60)
        assert conn.execute("SELECT id, attempts FROM alk.claim('q', 'w2', 1)").fetchall() == [(lapsed, 2)]
        pin_clock(conn, None)  # w2's lease runs to the pinned clock + 1 s: valid after the upgrade
        done = one(conn, "SELECT alk.enqueue('kept', '{}')")
        one(conn, "SELECT id FROM alk.claim('kept', 'w', 1)")
        assert one(conn, "SELECT alk.ack(%s, 'w', 1, 'kept', '{\"r\": 1}')", done) is True
        before = conn.execute(f"SELECT {COLUMNS} FROM alk.jobs ORDER BY id").fetchall()
        last_id = max(row[0] for row in before)

        migrate.upgrade(dsn, head())

        assert conn.execute(f"SELECT {COLUMNS} FROM alk.jobs ORDER BY id").fetchall() == before
        assert dict(conn.execute("SELECT id, slot FROM alk.jobs").fetchall()) == {
            row[0]: (2 if row[2] in ("dead", "completed") else 0) for row in before}
        # The token from before the upgrade: a stale one and another worker's are refused, the valid one acks.
        assert one(conn, "SELECT alk.ack(%s, 'w', %s, 'q')", running, token + 1) is False
        assert one(conn, "SELECT alk.ack(%s, 'other', %s, 'q')", running, token) is False
        assert one(conn, "SELECT alk.ack(%s, 'w', %s, 'q')", running, token) is True
        assert one(conn, "SELECT alk.ack(%s, 'w1', 1, 'q')", lapsed) is False
        assert one(conn, "SELECT alk.ack(%s, 'w2', 1, 'q')", lapsed) is False
        assert one(conn, "SELECT alk.ack(%s, 'w2', 2, 'q')", lapsed) is True
        assert one(conn, "SELECT alk.enqueue('q', '{}', dedup_key => 'k')") == held
        assert one(conn, "SELECT alk.enqueue('q', '{}', priority => -5)") > last_id
        assert one(conn, "SELECT id FROM alk.claim('q', 'w', 1)") == held
        assert one(conn, "SELECT (alk.get_job('kept', %s)).result", done) == {"r": 1}
        assert one(conn, "SELECT alk.requeue_dead('q')") == 1
        assert one(conn, "SELECT alk.rotate_jobs(0)") == "rotated"
        assert one(conn, "SELECT count(*) FROM alk.jobs") == len(before) - 1  # two acked, one enqueued
