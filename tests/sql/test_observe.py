"""The observation functions (sql/versions/0009_observe.sql), through alk.* alone:
browse_jobs, browse_events, stream_stats, stream_consumer_lag, queue_throughput
(with the settle path's counter alk._count_settled), schedule_overview (with the
tick path's alk._note_fire) and list_locks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from tests.conftest import pin_clock
from tests.helpers import raises_lk

NOW = 1_700_000_000


def rows(db: psycopg.Connection, query: str, *params: Any) -> list[dict[str, Any]]:
    cur = db.execute(query, params)
    assert cur.description is not None
    names = [c.name for c in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def one(db: psycopg.Connection, query: str, *params: Any) -> Any:
    row = db.execute(query, params).fetchone()
    assert row is not None
    return row[0]


@pytest.fixture
def clocked(db: psycopg.Connection) -> psycopg.Connection:
    pin_clock(db, NOW)
    return db


def page(db: psycopg.Connection, state: str, n: int, after: dict[str, Any] | None = None,
         queue: str = "q") -> list[dict[str, Any]]:
    key = (after["priority"], after["run_at"], after["id"]) if after else (None, None, None)
    return rows(db, "SELECT * FROM alk.browse_jobs(%s, %s, %s, %s, %s, %s)", queue, state, n, *key)


# browse_jobs ------------------------------------------------------------------

def test_browse_jobs_pages_every_pending_job_once_in_claim_order(clocked):
    db = clocked
    for i in range(23):
        db.execute("SELECT alk.enqueue('q', %s::jsonb, priority => %s, run_at => %s)",
                   [f'{{"i": {i}}}', i % 3, NOW - (i * 7) % 5])
    db.execute("SELECT alk.enqueue('other', '{}')")
    listed = rows(db, "SELECT id, priority, run_at FROM alk.list_jobs('q', 'pending', 100)")
    expected = [r["id"] for r in sorted(listed, key=lambda r: (-r["priority"], r["run_at"], r["id"]))]
    seen: list[int] = []
    last = None
    while True:
        got = page(db, "pending", 5, last)
        if not got:
            break
        assert len(got) <= 5
        seen += [r["id"] for r in got]
        last = got[-1]
    assert seen == expected
    assert all(r["queue"] == "q" for r in page(db, "pending", 100))


def test_browse_jobs_order_matches_claim_with_mixed_priorities_and_run_ats(clocked):
    db = clocked
    for i in range(30):
        db.execute("SELECT alk.enqueue('q', '{}', priority => %s, run_at => %s)", [(i * 5) % 4 - 1, NOW - (i * 11) % 7])
    listed = [r["id"] for r in page(db, "pending", 100)]
    second = []
    last = None
    while got := page(db, "pending", 4, last):
        second += [r["id"] for r in got]
        last = got[-1]
    assert second == listed
    claimed = [r["id"] for r in rows(db, "SELECT id FROM alk.claim('q', 'w', 100)")]
    assert claimed == listed


def test_browse_jobs_filters_by_state_and_cuts_payloads_and_errors(clocked):
    db = clocked
    big = '{"s": "' + "x" * 5000 + '"}'
    job = one(db, "SELECT alk.enqueue('q', %s::jsonb, max_attempts => 1)", big)
    one(db, "SELECT alk.enqueue('q', '{\"n\": 2}')")
    attempt = one(db, "SELECT attempts FROM alk.claim('q', 'w', 1)")
    assert one(db, "SELECT alk.fail(%s, 'w', %s, %s)", job, attempt, "E" * 1000)
    dead = page(db, "dead", 10)
    assert [r["id"] for r in dead] == [job]
    assert dead[0]["payload_preview"] == big[:200]
    assert dead[0]["payload_bytes"] == len(big)
    assert dead[0]["last_error"] == "E" * 200
    assert dead[0]["died_at"] == NOW and dead[0]["worker_id"] == "w"
    assert [r["state"] for r in page(db, "pending", 10)] == ["pending"]
    assert page(db, "processing", 10) == []
    short = rows(db, "SELECT payload_preview FROM alk.browse_jobs('q', 'dead', preview_chars => 5)")
    assert short == [{"payload_preview": big[:5]}]


def test_browse_jobs_extents_and_bad_arguments(clocked):
    db = clocked
    one(db, "SELECT alk.enqueue('q', '{}')")
    assert page(db, "pending", 0) == [] and page(db, "pending", -1) == []
    assert rows(db, "SELECT * FROM alk.browse_jobs('q', 'pending', NULL)") == []
    with raises_lk("LK002", "state must be pending, processing or dead", "'done'"):
        db.execute("SELECT * FROM alk.browse_jobs('q', 'done')")
    with raises_lk("LK002", "state"):
        db.execute("SELECT * FROM alk.browse_jobs('q', NULL)")
    with raises_lk("LK002", "go together"):
        db.execute("SELECT * FROM alk.browse_jobs('q', 'pending', 5, after_id => 3)")
    with raises_lk("LK002", "preview_chars"):
        db.execute("SELECT * FROM alk.browse_jobs('q', 'pending', 5, preview_chars => -1)")
    with raises_lk("LK001"):
        db.execute("SELECT * FROM alk.browse_jobs('', 'pending')")


def test_browse_jobs_reads_reserved_outbox_queues(clocked):
    db = clocked
    one(db, "SELECT alk.outbox_enqueue('mail', '{}')")
    assert len(page(db, "pending", 5, queue="alk:outbox:mail")) == 1


# streams ----------------------------------------------------------------------

def test_browse_events_newest_first_keyset_backwards(clocked):
    db = clocked
    for i in range(7):
        db.execute("SELECT alk.publish('s', %s::jsonb, %s)", [f'{{"i": {i}}}', f"k{i}"])
    first = rows(db, "SELECT * FROM alk.browse_events('s', n => 3)")
    assert [r["event_offset"] for r in first] == [7, 6, 5]
    assert first[0]["key"] == "k6" and first[0]["payload_preview"] == '{"i": 6}' and first[0]["payload_bytes"] == 8
    rest = rows(db, "SELECT event_offset FROM alk.browse_events('s', 5, 10)")
    assert [r["event_offset"] for r in rest] == [4, 3, 2, 1]
    assert rows(db, "SELECT * FROM alk.browse_events('s', n => 0)") == []
    assert rows(db, "SELECT * FROM alk.browse_events('nothing')") == []
    with raises_lk("LK002", "preview_chars"):
        db.execute("SELECT * FROM alk.browse_events('s', preview_chars => NULL)")


def test_stream_stats_and_consumer_lag(clocked):
    db = clocked
    for _ in range(10):
        db.execute("SELECT alk.publish('s', '{}')")
    db.execute("SELECT alk.publish('t', '{}')")
    db.execute("SELECT alk.save_offset('s', 'fast', 10)")
    db.execute("SELECT alk.save_offset('s', 'slow', 3)")
    db.execute("SELECT alk.save_offset('ghost', 'early', 4)")  # a checkpoint before any publish
    db.execute("SELECT alk.trim_to('s', 2)")
    stats = {r["stream"]: r for r in rows(db, "SELECT * FROM alk.stream_stats()")}
    assert set(stats) == {"s", "t"}
    assert stats["s"] == {"stream": "s", "head_offset": 10, "first_offset": 3, "consumers": 2, "max_lag": 7,
                          "created_at": NOW}
    assert stats["t"]["consumers"] == 0 and stats["t"]["max_lag"] is None
    assert rows(db, "SELECT stream FROM alk.stream_stats('t')") == [{"stream": "t"}]
    lag = rows(db, "SELECT stream, consumer, at_offset, head_offset, lag FROM alk.stream_consumer_lag()")
    assert lag == [
        {"stream": "ghost", "consumer": "early", "at_offset": 4, "head_offset": 0, "lag": 0},
        {"stream": "s", "consumer": "fast", "at_offset": 10, "head_offset": 10, "lag": 0},
        {"stream": "s", "consumer": "slow", "at_offset": 3, "head_offset": 10, "lag": 7},
    ]
    assert [r["consumer"] for r in rows(db, "SELECT * FROM alk.stream_consumer_lag('s')")] == ["fast", "slow"]
    with raises_lk("LK001"):
        db.execute("SELECT * FROM alk.stream_stats('')")


# throughput -------------------------------------------------------------------

def test_queue_throughput_sums_backends_into_buckets_with_zeros(clocked, connect: Callable[..., psycopg.Connection]):
    db = clocked
    other = connect()
    minute = NOW // 60 * 60
    for conn, at, n in ((db, minute - 120, 3), (other, minute - 120, 4), (db, minute - 60, 5), (db, minute, 1)):
        pin_clock(conn, at + 7)
        conn.execute("SELECT alk._count_settled('q', 'acked', %s)", [n])
    pin_clock(db, minute + 1)
    db.execute("SELECT alk._count_settled('q', 'dead', 2)")
    db.execute("SELECT alk._count_settled('q', 'retried', 6)")
    db.execute("SELECT alk._count_settled('q', 'acked', 0)")  # nothing settled: nothing written
    got = rows(db, "SELECT * FROM alk.queue_throughput('q', %s)", minute - 180)
    assert got == [
        {"queue": "q", "bucket_at": minute - 180, "acked": 0, "retried": 0, "dead": 0},
        {"queue": "q", "bucket_at": minute - 120, "acked": 7, "retried": 0, "dead": 0},
        {"queue": "q", "bucket_at": minute - 60, "acked": 5, "retried": 0, "dead": 0},
        {"queue": "q", "bucket_at": minute, "acked": 1, "retried": 6, "dead": 2},
    ]
    # The default window is the last hour in minutes: 61 buckets.
    assert len(rows(db, "SELECT * FROM alk.queue_throughput('q')")) == 61
    wide = rows(db, "SELECT bucket_at, acked FROM alk.queue_throughput(NULL, %s, 600)", minute - 3000)
    assert sum(r["acked"] for r in wide) == 13
    assert rows(db, "SELECT * FROM alk.queue_throughput('idle', %s)", minute) == [
        {"queue": "idle", "bucket_at": minute, "acked": 0, "retried": 0, "dead": 0}]
    for bad in (0, 30, 90, None):
        with raises_lk("LK002", "bucket_s"):
            db.execute("SELECT * FROM alk.queue_throughput('q', bucket_s => %s)", [bad])
    with raises_lk("LK002", "buckets"):
        db.execute("SELECT * FROM alk.queue_throughput('q', 0)")


def test_count_settled_drops_its_own_rows_past_a_day_and_no_one_elses(clocked, connect):
    db = clocked
    other = connect()
    old = NOW - 2 * 86400
    for conn in (db, other):
        pin_clock(conn, old)
        conn.execute("SELECT alk._count_settled('q', 'acked', 1)")
    pin_clock(db, NOW)
    db.execute("SELECT alk._count_settled('q', 'acked', 1)")  # opens a new minute: prunes this backend's rows
    left = rows(db, "SELECT bucket_at, acked FROM alk.queue_throughput('q', %s, 86400 * 7 / 60 * 60)", old)
    assert sum(r["acked"] for r in left) == 2  # the other backend's old row stays until it settles again


def test_concurrent_settles_on_one_queue_never_wait_for_each_other(clocked, connect):
    db = clocked
    a, b = connect(autocommit=False), connect(autocommit=False)
    for conn in (a, b):
        pin_clock(conn, NOW)
        conn.execute("SET lock_timeout = '200ms'")
    a.execute("SELECT alk._count_settled('q', 'acked', 1)")
    b.execute("SELECT alk._count_settled('q', 'acked', 1)")  # a still holds its row: b must not wait
    a.commit()
    b.commit()
    assert one(db, "SELECT sum(acked) FROM alk.queue_throughput('q')") == 2


# schedules and locks ----------------------------------------------------------

def test_schedule_overview_next_and_last_fire(clocked):
    db = clocked
    next_at = one(db, "SELECT alk.schedule('nightly', '0 3 * * *', 'reports')")
    db.execute("SELECT alk.schedule('often', '@every 5m', 'q')")
    got = {r["name"]: r for r in rows(db, "SELECT * FROM alk.schedule_overview()")}
    assert list(got) == ["nightly", "often"]
    assert got["nightly"]["next_fire_at"] == next_at and got["nightly"]["last_fire_at"] is None
    assert got["nightly"]["spec"] == "0 3 * * *" and got["nightly"]["queue"] == "reports"
    db.execute("SELECT alk._note_fire('nightly', %s, 41)", [next_at - 86400])
    db.execute("SELECT alk._note_fire('nightly', %s, 40)", [next_at - 2 * 86400])  # older: ignored
    row = rows(db, "SELECT * FROM alk.schedule_overview()")[0]
    assert (row["last_fire_at"], row["last_job_id"], row["last_fired_at"]) == (next_at - 86400, 41, NOW)


def test_list_locks_held_and_expired(clocked):
    db = clocked
    assert one(db, "SELECT alk.try_lock('b', 'me', 30)")
    assert one(db, "SELECT alk.try_lock('a', 'you', 5)")
    pin_clock(db, NOW + 10)
    got = rows(db, "SELECT * FROM alk.list_locks()")
    assert got == [
        {"name": "a", "owner": "you", "acquired_at": NOW, "expires_at": NOW + 5, "held": False},
        {"name": "b", "owner": "me", "acquired_at": NOW, "expires_at": NOW + 30, "held": True},
    ]
    db.execute("SELECT alk.release_lock('b', 'me')")
    assert [r["name"] for r in rows(db, "SELECT name FROM alk.list_locks()")] == ["a"]


def test_hostile_names_are_data(clocked):
    db = clocked
    name = "<script>alert(1)</script>'\"; DROP TABLE x; --"
    one(db, "SELECT alk.enqueue(%s, '{}')", name)
    db.execute("SELECT alk.publish(%s, '{}')", [name])
    assert page(db, "pending", 5, queue=name)[0]["queue"] == name
    assert rows(db, "SELECT stream FROM alk.stream_stats(%s)", name) == [{"stream": name}]


def test_queue_throughput_at_the_bigint_edges_saturates_or_refuses_never_overflows(db):
    # A since at the bottom edge asks for more buckets than the cap: LK002, not 22003.
    with raises_lk("LK002", "10080 buckets"):
        db.execute("SELECT * FROM alk.queue_throughput(NULL, -9223372036854775808)")
    # A bucket as wide as the range: one bucket, no overflow at its end.
    rows = db.execute("SELECT * FROM alk.queue_throughput('q', NULL, 9223372036854775800)").fetchall()
    assert len(rows) == 1 and rows[0][2:] == (0, 0, 0)
