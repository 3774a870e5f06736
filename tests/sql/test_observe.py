"""The observation functions (each in its mechanism's sql/<mechanism>.sql), through alk.* alone:
browse_jobs, browse_events, stream_stats, stream_consumer_lag, queue_throughput
(counted by every settle function), schedule_overview (with the
tick path's alk._note_fire) and list_locks."""

from __future__ import annotations

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
    with raises_lk("LK002", "state must be pending, processing, dead or completed", "'done'"):
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

def claimed(conn: psycopg.Connection, queue: str, n: int, worker: str = "w", **options: Any) -> list[tuple[int, int]]:
    """Enqueue n jobs and claim them as worker: their (id, token)."""
    extra = "".join(f", {name} => %({name})s" for name in options)
    conn.execute(f"SELECT alk.enqueue_batch(%(queue)s, (SELECT array_agg('{{}}'::jsonb) "
                 f"FROM generate_series(1, %(n)s)){extra})", {"queue": queue, "n": n, **options})
    got = conn.execute("SELECT id, attempts FROM alk.claim(%s, %s, %s)", [queue, worker, n]).fetchall()
    assert len(got) == n
    return [(int(i), int(t)) for i, t in got]


def counted(db: psycopg.Connection, queue: str, since: int = NOW // 60 * 60) -> tuple[int, int, int]:
    """(acked, retried, dead) of a queue from since to now, as alk.queue_throughput sums them."""
    got = rows(db, "SELECT * FROM alk.queue_throughput(%s, %s)", queue, since)
    return tuple(sum(r[k] for r in got) for k in ("acked", "retried", "dead"))  # type: ignore[return-value]


def settle(conn: psycopg.Connection, jobs: list[tuple[int, int]], outcomes: list[str] | None = None,
           queue: str | None = None, worker: str = "w") -> list[str | None]:
    got = conn.execute("SELECT state FROM alk.settle(%s, %s, %s, %s, queue => %s)",
                       [[i for i, _ in jobs], worker, [t for _, t in jobs], outcomes, queue]).fetchall()
    return [r[0] for r in got]


def test_every_settle_function_counts_what_it_settled_once_per_call(clocked):
    db = clocked
    jobs = claimed(db, "q", 10)
    spent = claimed(db, "q", 1, max_attempts=1)[0]
    assert counted(db, "q") == (0, 0, 0)
    assert one(db, "SELECT alk.ack(%s, 'w', %s)", *jobs[0])
    assert counted(db, "q") == (1, 0, 0)
    assert one(db, "SELECT alk.ack_batch(%s, 'w', %s, 'q')", [i for i, _ in jobs[1:3]], [t for _, t in jobs[1:3]]) == 2
    assert counted(db, "q") == (3, 0, 0)
    assert settle(db, jobs[3:6], ["ack", "retry", "fail"]) == ["acked", "pending", "dead"]
    assert counted(db, "q") == (4, 1, 1)
    assert one(db, "SELECT alk.retry(%s, 'w', %s)", *spent)  # attempts spent: dead, counted as dead
    assert counted(db, "q") == (4, 1, 2)
    assert one(db, "SELECT alk.fail(%s, 'w', %s, 'bad')", *jobs[6])
    assert counted(db, "q") == (4, 1, 3)
    got = db.execute("SELECT kind, state FROM alk.settle_and_claim('q', 'w', 0, %s, %s, %s)",
                     [[i for i, _ in jobs[7:10]], [t for _, t in jobs[7:10]], ["ack", "retry", "ack"]]).fetchall()
    assert got == [("settled", "acked"), ("settled", "pending"), ("settled", "acked")]
    assert counted(db, "q") == (6, 2, 3)
    assert settle(db, jobs[:1]) == [None]  # already acked: refused, nothing counted
    assert counted(db, "q") == (6, 2, 3)
    # All of it in one row: this backend's counter of this minute.
    assert one(db, "SELECT count(*) FROM alk.queue_counts") == 1


def test_a_refused_settlement_counts_nothing(clocked, connect):
    db = clocked
    jobs = claimed(db, "q", 4)
    (stale_id, token) = jobs[0]
    assert one(db, "SELECT alk.ack(%s, 'w', %s)", stale_id, token + 1) is False  # a stale token
    assert one(db, "SELECT alk.ack(%s, 'someone-else', %s)", *jobs[1]) is False  # another worker's job
    assert settle(db, jobs[2:3], ["fail"], worker="someone-else") == [None]
    assert one(db, "SELECT alk.ack_batch(%s, 'w', %s)", [jobs[3][0]], [token + 5]) == 0
    pin_clock(db, NOW + 3600)  # every lease has lapsed
    assert settle(db, jobs[:2], ["ack", "retry"]) == [None, None]
    assert one(db, "SELECT count(*) FROM alk.queue_counts") == 0
    # A batch that is partly refused counts what it applied; a repeated id once.
    pin_clock(db, NOW)
    fresh = claimed(db, "r", 2)
    assert settle(db, [fresh[0], fresh[0], (fresh[1][0], fresh[1][1] + 1)]) == ["acked", None, None]
    assert counted(db, "r") == (1, 0, 0)


def test_queue_null_counts_each_queue_by_its_own_rows(clocked):
    db = clocked
    a, b = claimed(db, "a", 3), claimed(db, "b", 4)
    assert one(db, "SELECT alk.ack_batch(%s, 'w', %s)", [a[0][0], b[0][0], b[1][0]], [a[0][1], b[0][1], b[1][1]]) == 3
    assert (counted(db, "a"), counted(db, "b")) == ((1, 0, 0), (2, 0, 0))
    assert settle(db, [a[1], b[2], a[2], b[3]], ["retry", "fail", "ack", "ack"]) == [
        "pending", "dead", "acked", "acked"]
    assert (counted(db, "a"), counted(db, "b")) == ((2, 1, 0), (3, 0, 1))
    # Given a queue, only that queue's rows settle and count.
    more = claimed(db, "b", 1)
    assert settle(db, more, queue="a") == [None]
    assert counted(db, "b") == (3, 0, 1)


def test_queue_throughput_sums_backends_into_the_minute_of_the_pinned_clock(clocked, connect):
    db = clocked
    other = connect()
    minute = NOW // 60 * 60
    for conn, at, n in ((db, minute - 120, 3), (other, minute - 120, 4), (db, minute - 60, 5), (db, minute, 1)):
        pin_clock(conn, at + 7)
        assert settle(conn, claimed(conn, "q", n)) == ["acked"] * n
    pin_clock(db, minute + 59)
    assert settle(db, claimed(db, "q", 8), ["fail"] * 2 + ["retry"] * 6) == ["dead"] * 2 + ["pending"] * 6
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


def test_opening_a_minute_drops_the_queues_rows_past_a_day_and_nothing_else(clocked, connect):
    db = clocked
    other = connect()
    old = NOW - 2 * 86400
    for conn in (db, other):
        pin_clock(conn, old)
        settle(conn, claimed(conn, "q", 1))
        settle(conn, claimed(conn, "kept", 1))
    pin_clock(db, NOW - 86400 + 60)  # a minute inside the day: kept
    settle(db, claimed(db, "q", 1))

    def minutes(queue: str) -> list[int]:
        return [r[0] for r in db.execute("SELECT minute FROM alk.queue_counts WHERE queue = %s ORDER BY minute",
                                         [queue])]

    # That call opened a minute: q's rows past a day went, any backend's (gone ones' too); not kept's.
    assert minutes("q") == [(NOW - 86400 + 60) // 60 * 60]
    assert len(minutes("kept")) == 2
    pin_clock(other, old + 60)  # its old row comes back for the next check
    settle(other, claimed(other, "q", 1))
    pin_clock(db, NOW - 86400 + 90)  # the same minute again: no prune
    settle(db, claimed(db, "q", 1))
    assert minutes("q") == [(old + 60) // 60 * 60, (NOW - 86400 + 60) // 60 * 60]
    # The mixed statement (a retry or fail in the batch) prunes the same way.
    pin_clock(db, NOW)
    assert settle(db, claimed(db, "q", 1), ["fail"]) == ["dead"]
    assert minutes("q") == [(NOW - 86400 + 60) // 60 * 60, NOW // 60 * 60]


def test_concurrent_settles_on_one_queue_never_wait_for_each_other(clocked, connect):
    db = clocked
    a, b = connect(autocommit=False), connect(autocommit=False)
    jobs = {}
    for conn, worker in ((a, "wa"), (b, "wb")):
        pin_clock(conn, NOW)
        jobs[worker] = claimed(conn, "q", 2, worker=worker)
        conn.commit()
        conn.execute("SET lock_timeout = '2s'")
    assert settle(a, jobs["wa"][:1], worker="wa") == ["acked"]  # a holds its counter row, uncommitted
    # b counts the same queue in the same minute, in both statements: it must not wait (lock_timeout: 55P03).
    assert settle(b, jobs["wb"][:1], worker="wb") == ["acked"]
    assert settle(b, jobs["wb"][1:], ["fail"], worker="wb") == ["dead"]
    b.commit()
    assert counted(db, "q") == (1, 0, 1)
    a.commit()
    assert counted(db, "q") == (2, 0, 1)


def test_concurrent_prunes_skip_each_others_rows_never_wait(clocked, connect):
    db = clocked
    old = NOW - 2 * 86400
    pin_clock(db, old)
    settle(db, claimed(db, "q", 1))
    a, b = connect(autocommit=False), connect(autocommit=False)
    jobs = {}
    for conn, worker in ((a, "wa"), (b, "wb")):
        pin_clock(conn, NOW)
        jobs[worker] = claimed(conn, "q", 1, worker=worker)
        conn.commit()
        conn.execute("SET lock_timeout = '2s'")
    settle(a, jobs["wa"], worker="wa")  # opens the minute: locks and deletes the old row, uncommitted
    settle(b, jobs["wb"], worker="wb")  # opens its minute too: skips the locked row rather than wait
    b.commit()
    a.commit()
    assert [r[0] for r in db.execute("SELECT minute FROM alk.queue_counts")] == [NOW // 60 * 60] * 2


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
