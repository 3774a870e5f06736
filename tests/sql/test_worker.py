"""What a worker needs from the queue (sql/queue/, docs/contract.md#queue), checked
through alk.* alone: the wake-up channel and its notifications,
alk.next_claim_at, alk.queue_stats, alk.list_jobs and alk.requeue_dead."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from tests.conftest import pin_clock
from tests.helpers import one, sqlstate_of

NOW = 1_700_000_000
MAX = 2**63 - 1
MIN = -(2**63)


def rows(db: psycopg.Connection, query: str, *params: Any) -> list[dict[str, Any]]:
    cur = db.execute(query, params)
    assert cur.description is not None
    names = [c.name for c in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def enqueue(db: psycopg.Connection, queue: str = "q", payload: str = "{}", **options: Any) -> int:
    named = "".join(f", {name} => %({name})s" for name in options)
    row = db.execute(f"SELECT alk.enqueue(%(queue)s, %(payload)s::jsonb{named})",
                     {"queue": queue, "payload": payload, **options}).fetchone()
    assert row is not None
    return int(row[0])


def claim(db: psycopg.Connection, n: int = 1, worker: str = "w1", queue: str = "q") -> list[dict[str, Any]]:
    return rows(db, "SELECT * FROM alk.claim(%s, %s, %s)", queue, worker, n)


def kill(db: psycopg.Connection, job_id: int, attempt: int, worker: str = "w1", err: str = "boom") -> None:
    assert one(db, "SELECT alk.fail(%s, %s, %s, %s)", job_id, worker, attempt, err) is True


def stats(db: psycopg.Connection, queue: str | None = None) -> list[dict[str, Any]]:
    return rows(db, "SELECT * FROM alk.queue_stats(%s)", queue)


@pytest.fixture
def clocked(db: psycopg.Connection) -> psycopg.Connection:
    pin_clock(db, NOW)
    return db


# the channel -----------------------------------------------------------------


def channel_of(queue: str) -> str:
    return "alk_q_" + hashlib.sha256(queue.encode()).hexdigest()[:32]


@pytest.mark.parametrize("queue", ["emails", "é-Ü 名前", "x" * 1024, "alk:outbox:billing", 'a"b; DROP'])
def test_channel_is_a_38_byte_hash_of_the_name_whatever_the_name(db, queue):
    channel = one(db, "SELECT alk.queue_channel(%s)", queue)
    assert channel == channel_of(queue)
    assert len(channel.encode()) == 38


@pytest.mark.parametrize("queue", ["", None])
def test_channel_of_no_name_is_invalid(db, queue):
    assert sqlstate_of(db, "SELECT alk.queue_channel(%s)", queue)[0] == "LK001"


class Listener:
    """A LISTEN connection that tells notifications apart by channel, with a
    sentinel queue to prove an absence: notifications are delivered in commit
    order, so one sent before the sentinel's arrives before it."""

    def __init__(self, conn: psycopg.Connection, *queues: str, worker_id: str = "listener") -> None:
        self.conn = conn
        self.worker_id = worker_id
        self.names = {channel_of(q): q for q in (*queues, "sentinel")}
        for channel in self.names:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        self.advertise()

    def advertise(self) -> None:
        # Enqueues notify only workers that wait idle (alk.wait_for_jobs),
        # and the enqueue that notifies consumes the advert (0014).
        for queue in self.names.values():
            self.conn.execute("SELECT alk.wait_for_jobs(%s, %s)", [queue, self.worker_id])

    def heard(self, writer: psycopg.Connection) -> list[tuple[str, str]]:
        """(queue, payload) of every notification committed before now."""
        enqueue(writer, "sentinel")
        heard = []
        done = False
        for notify in self.conn.notifies(timeout=10):
            if self.names[notify.channel] == "sentinel":
                done = True
                break
            heard.append((self.names[notify.channel], notify.payload))
        if done:
            self.advertise()  # as a worker does after every wake-up (not inside notifies(): it holds the connection)
            return heard
        raise AssertionError(f"the sentinel notification did not arrive within 10 s (heard {heard})")


@pytest.fixture
def listen(connect: Callable[..., psycopg.Connection]) -> Callable[..., Listener]:
    return lambda *queues: Listener(connect(), *queues)


def test_an_enqueue_notifies_its_queue_at_commit_with_an_empty_payload(db, listen):
    listener = listen("emails", "other")
    enqueue(db, "emails")
    assert listener.heard(db) == [("emails", "")]


def test_one_notification_per_queue_per_transaction(db, connect, listen):
    listener = listen("a", "b")
    writer = connect(autocommit=False)
    with writer.transaction():
        for _ in range(3):
            enqueue(writer, "a")
        writer.execute("SELECT alk.enqueue_batch('a', ARRAY['1', '2', '3']::jsonb[])")
        enqueue(writer, "b", delay=3600)  # a future job wakes sleepers too: it may be the earliest
        # Nothing before the commit.
        assert listener.heard(db) == []
    assert sorted(listener.heard(db)) == [("a", ""), ("b", "")]


def test_a_rolled_back_enqueue_wakes_nobody(db, connect, listen):
    listener = listen("a")
    writer = connect(autocommit=False)
    enqueue(writer, "a")
    writer.rollback()
    assert listener.heard(db) == []


def test_an_empty_batch_notifies_nothing(db, listen):
    listener = listen("a")
    assert db.execute("SELECT * FROM alk.enqueue_batch('a', ARRAY[]::jsonb[])").fetchall() == []
    assert listener.heard(db) == []


def test_every_enqueue_form_notifies(db, listen):
    long_name = "q" * 500
    listener = listen(long_name, "alk:outbox:billing", "ticks")
    enqueue(db, long_name)
    db.execute("SELECT alk.outbox_enqueue('billing', '{}')")
    assert sorted(listener.heard(db)) == sorted([(long_name, ""), ("alk:outbox:billing", "")])
    db.execute("SELECT alk.schedule('every-minute', '* * * * *', 'ticks')")
    assert db.execute("SELECT * FROM alk.tick(alk.now() + 180)").fetchall()
    assert listener.heard(db) == [("ticks", "")]


def test_enqueue_still_returns_ids_in_input_order_through_the_wrapper(db):
    ids = [r[0] for r in db.execute("SELECT * FROM alk.enqueue_batch('q', ARRAY['1', '2', '3']::jsonb[])")]
    assert ids == sorted(ids) and len(ids) == 3
    assert one(db, "SELECT count(*) FROM alk.jobs WHERE queue = 'q'") == 3


# next_claim_at -----------------------------------------------------------------


def test_next_claim_at_is_null_for_a_queue_with_nothing_waiting_or_running(clocked):
    assert one(clocked, "SELECT alk.next_claim_at('q')") is None
    job_id = enqueue(clocked)
    kill(clocked, job_id, claim(clocked)[0]["attempts"])
    enqueue(clocked, "other")
    assert one(clocked, "SELECT alk.next_claim_at('q')") is None


def test_next_claim_at_is_now_when_a_job_is_due(clocked):
    enqueue(clocked, run_at=NOW - 500)
    enqueue(clocked, delay=60)
    assert one(clocked, "SELECT alk.next_claim_at('q')") == NOW


def test_next_claim_at_is_the_earliest_run_at_across_priorities(clocked):
    enqueue(clocked, delay=300, priority=9)
    enqueue(clocked, delay=40, priority=-3)
    enqueue(clocked, delay=100, priority=0)
    enqueue(clocked, delay=50, priority=-3)
    assert one(clocked, "SELECT alk.next_claim_at('q')") == NOW + 40


def test_next_claim_at_is_the_second_after_the_first_lease_ends(clocked):
    enqueue(clocked, visibility_timeout_s=30)
    enqueue(clocked, visibility_timeout_s=10)
    claim(clocked, 2)
    enqueue(clocked, delay=100)
    assert one(clocked, "SELECT alk.next_claim_at('q')") == NOW + 11
    pin_clock(clocked, NOW + 10)
    assert claim(clocked) == []  # the lease is still valid at its last second
    pin_clock(clocked, NOW + 11)
    assert one(clocked, "SELECT alk.next_claim_at('q')") == NOW + 11
    assert len(claim(clocked, worker="w2")) == 1


def test_next_claim_at_counts_due_jobs_claim_would_bury(clocked):
    enqueue(clocked, max_attempts=0)
    assert one(clocked, "SELECT alk.next_claim_at('q')") == NOW
    assert claim(clocked) == []  # buried
    assert one(clocked, "SELECT alk.next_claim_at('q')") is None


def test_next_claim_at_saturates(clocked):
    enqueue(clocked, visibility_timeout_s=MAX)
    claim(clocked)
    assert one(clocked, "SELECT alk.next_claim_at('q')") == MAX
    enqueue(clocked, run_at=MIN)
    assert one(clocked, "SELECT alk.next_claim_at('q')") == NOW


@pytest.mark.parametrize("queue", ["", None, "alk:outbox:billing"])
def test_next_claim_at_refuses_what_claim_refuses(db, queue):
    assert sqlstate_of(db, "SELECT alk.next_claim_at(%s)", queue)[0] == "LK001"


job_specs = st.lists(
    st.tuples(
        st.integers(-50, 50),  # run_at offset from NOW
        st.integers(-2, 2),  # priority
        # waiting (None), or claimed at NOW + offset with this visibility timeout
        st.one_of(st.none(), st.tuples(st.integers(-50, 0), st.integers(-5, 60))),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(specs=job_specs)
def test_next_claim_at_is_exactly_when_claim_first_returns_a_job(db, specs):
    """Property: claim finds nothing before next_claim_at and something at it."""
    db.execute("DELETE FROM alk.jobs")
    leased = 0
    for offset, priority, lease in specs:
        if lease is None:
            pin_clock(db, NOW - 100)
            enqueue(db, run_at=NOW + offset, priority=priority)
        else:
            claimed_at, timeout = lease
            pin_clock(db, NOW + claimed_at)
            # Top priority and due now: this claim takes it (or a lapsed peer).
            enqueue(db, priority=1000, visibility_timeout_s=timeout, max_attempts=100)
            leased += len(claim(db, worker="holder"))
    assert leased == sum(1 for spec in specs if spec[2] is not None)
    pin_clock(db, NOW)
    at = one(db, "SELECT alk.next_claim_at('q')")
    assert at is not None and at >= NOW
    with db.transaction(force_rollback=True):
        if at > NOW:
            pin_clock(db, at - 1)
            assert claim(db, 100, worker="probe") == []
        pin_clock(db, at)
        assert claim(db, 100, worker="probe") != []


# queue_stats -------------------------------------------------------------------


def test_queue_stats_counts_every_state_per_queue(clocked):
    enqueue(clocked, "a", run_at=NOW - 30)  # ready for 30 s
    enqueue(clocked, "a", run_at=NOW - 5)  # ready
    enqueue(clocked, "a", delay=60)  # scheduled
    enqueue(clocked, "a", delay=20)  # scheduled, the next due
    running = enqueue(clocked, "b", visibility_timeout_s=10)
    lapses = enqueue(clocked, "b", visibility_timeout_s=1)
    dies = enqueue(clocked, "b")
    claimed = {job["id"]: job for job in claim(clocked, 3, queue="b")}
    assert set(claimed) == {running, lapses, dies}
    kill(clocked, dies, claimed[dies]["attempts"])
    clocked.execute("SELECT alk.outbox_enqueue('billing', '{}')")
    pin_clock(clocked, NOW + 2)

    assert stats(clocked) == [
        {"queue": "a", "pending": 4, "ready": 2, "scheduled": 2, "processing": 0, "lapsed": 0, "dead": 0,
         "oldest_ready_age_s": 32, "next_run_at": NOW + 20, "paused": False, "estimated": False,
         "completed": 0},
        {"queue": "alk:outbox:billing", "pending": 1, "ready": 1, "scheduled": 0, "processing": 0, "lapsed": 0,
         "dead": 0, "oldest_ready_age_s": 2, "next_run_at": None, "paused": False, "estimated": False,
         "completed": 0},
        {"queue": "b", "pending": 0, "ready": 0, "scheduled": 0, "processing": 2, "lapsed": 1, "dead": 1,
         "oldest_ready_age_s": None, "next_run_at": None, "paused": False, "estimated": False,
         "completed": 0},
    ]


def test_queue_stats_splits_at_the_clock_across_priorities(clocked):
    # run_at = now is ready; the oldest ready and the next scheduled job sit
    # in different priorities than the busiest ones (the counts are range
    # scans per priority, so each boundary is checked in each priority).
    for priority, run_at in [(5, NOW), (5, NOW + 1), (0, NOW - 7), (0, NOW + 9), (-3, NOW - 2), (-3, NOW + 3),
                             (5, NOW - 1), (9, NOW + 1)]:
        enqueue(clocked, "p", priority=priority, run_at=run_at)
    assert stats(clocked, "p") == [
        {"queue": "p", "pending": 8, "ready": 4, "scheduled": 4, "processing": 0, "lapsed": 0, "dead": 0,
         "oldest_ready_age_s": 7, "next_run_at": NOW + 1, "paused": False, "estimated": False,
         "completed": 0}]


def test_queue_stats_lapsed_excludes_a_lease_ending_now(clocked):
    enqueue(clocked, "l", visibility_timeout_s=5)
    enqueue(clocked, "l", visibility_timeout_s=4)
    assert len(claim(clocked, 2, queue="l")) == 2
    pin_clock(clocked, NOW + 5)  # one lease ends now (still held), the other a second ago
    assert [(r["processing"], r["lapsed"]) for r in stats(clocked, "l")] == [(2, 1)]


def test_queue_stats_agrees_with_a_direct_count(clocked):
    # Each row against one plain aggregate over alk.jobs (the definition the
    # index scans must match), on a mix of queues, priorities and states.
    for i in range(60):
        enqueue(clocked, f"m{i % 3}", priority=i % 4 - 1, run_at=NOW + (i * 7) % 23 - 5,
                visibility_timeout_s=1 + i % 5)
    pin_clock(clocked, NOW + 5)
    clocked.execute("SELECT alk.set_queue_retention('m2', 60)")
    for queue in ("m0", "m1", "m2"):
        claimed = claim(clocked, 6, queue=queue)
        for job in claimed[::3]:
            kill(clocked, job["id"], job["attempts"])
        if queue == "m2":  # and a completed job
            clocked.execute("SELECT alk.ack(%s, 'w1', %s)", [claimed[1]["id"], claimed[1]["attempts"]])
    pin_clock(clocked, NOW + 8)  # leases of up to 2 s have lapsed; run_at past NOW + 8 is scheduled
    direct = rows(clocked, """
        SELECT queue, count(*) FILTER (WHERE state = 'pending') AS pending,
               count(*) FILTER (WHERE state = 'pending' AND run_at <= alk.now()) AS ready,
               count(*) FILTER (WHERE state = 'pending' AND run_at > alk.now()) AS scheduled,
               count(*) FILTER (WHERE state = 'processing') AS processing,
               count(*) FILTER (WHERE state = 'processing' AND claim_expires_at < alk.now()) AS lapsed,
               count(*) FILTER (WHERE state = 'dead') AS dead,
               alk.now() - min(run_at) FILTER (WHERE state = 'pending' AND run_at <= alk.now()) AS oldest_ready_age_s,
               min(run_at) FILTER (WHERE state = 'pending' AND run_at > alk.now()) AS next_run_at, false AS paused,
               false AS estimated, count(*) FILTER (WHERE state = 'completed') AS completed
          FROM alk.jobs GROUP BY queue ORDER BY queue""")
    assert all(r["dead"] and r["lapsed"] and r["scheduled"] and r["ready"] for r in direct), direct  # each case occurs
    assert [r["completed"] for r in direct] == [0, 0, 1]
    assert stats(clocked) == direct
    # Under the limit the capped counts are the exact ones.
    assert rows(clocked, "SELECT * FROM alk.queue_stats(exact_limit => 60)") == direct


def test_queue_stats_of_one_queue_includes_an_empty_one(clocked):
    enqueue(clocked, "a")
    assert [row["queue"] for row in stats(clocked, "a")] == ["a"]
    assert stats(clocked, "nothing") == [
        {"queue": "nothing", "pending": 0, "ready": 0, "scheduled": 0, "processing": 0, "lapsed": 0, "dead": 0,
         "oldest_ready_age_s": None, "next_run_at": None, "paused": False, "estimated": False,
         "completed": 0}]
    assert stats(clocked, "alk:outbox:billing")[0]["pending"] == 0  # reading a reserved queue is allowed


def test_queue_stats_of_an_empty_table_is_empty(db):
    assert stats(db) == []


def test_queue_stats_refuses_an_empty_name(db):
    assert sqlstate_of(db, "SELECT * FROM alk.queue_stats('')")[0] == "LK001"


def test_queue_stats_ages_saturate(clocked):
    enqueue(clocked, run_at=MIN)
    assert stats(clocked)[0]["oldest_ready_age_s"] == MAX


def test_queue_stats_counts_past_exact_limit_are_the_planners_estimates(clocked):
    for i in range(40):
        enqueue(clocked, "big", run_at=NOW - i)
    for _ in range(3):
        enqueue(clocked, "big", delay=60)
    enqueue(clocked, "small")
    clocked.execute("ANALYZE alk.jobs")  # what autovacuum does: the estimates read these statistics
    big, small = rows(clocked, "SELECT * FROM alk.queue_stats(exact_limit => 10)")
    # Past the limit: flagged, never below limit + 1, and near the truth once analyzed.
    assert big["estimated"] is True
    assert 20 <= big["ready"] <= 80 and big["ready"] >= 11
    assert big["pending"] == big["ready"] + 3
    # Under the limit every count is exact, in this row and in the other.
    assert (big["scheduled"], big["processing"], big["lapsed"], big["dead"]) == (3, 0, 0, 0)
    assert small == stats(clocked, "small")[0]
    # The ages never estimate.
    exact = stats(clocked, "big")[0]
    assert exact["estimated"] is False and exact["ready"] == 40
    assert (big["oldest_ready_age_s"], big["next_run_at"]) == (39, NOW + 60) == (
        exact["oldest_ready_age_s"], exact["next_run_at"])


def test_queue_stats_exact_limit_zero_estimates_every_count_but_zero(clocked):
    enqueue(clocked, "z")
    clocked.execute("ANALYZE alk.jobs")
    [row] = rows(clocked, "SELECT * FROM alk.queue_stats('z', 0)")
    assert row["estimated"] is True and row["ready"] >= 1
    assert (row["scheduled"], row["processing"], row["lapsed"], row["dead"]) == (0, 0, 0, 0)
    assert rows(clocked, "SELECT estimated, pending FROM alk.queue_stats('empty', 0)") == [
        {"estimated": False, "pending": 0}]


def test_queue_stats_ages_stay_exact_past_the_limit_across_priorities(clocked):
    for priority, run_at in [(5, NOW), (5, NOW + 1), (0, NOW - 7), (0, NOW + 9), (-3, NOW - 2), (-3, NOW + 3),
                             (5, NOW - 1), (9, NOW + 1), (9, NOW + 2)]:
        enqueue(clocked, "p", priority=priority, run_at=run_at)
    [row] = rows(clocked, "SELECT oldest_ready_age_s, next_run_at, estimated FROM alk.queue_stats('p', 1)")
    assert row == {"oldest_ready_age_s": 7, "next_run_at": NOW + 1, "estimated": True}


def test_queue_stats_never_shows_more_lapsed_than_processing(clocked):
    for _ in range(6):
        enqueue(clocked, "l", visibility_timeout_s=1)
    assert len(claim(clocked, 6, queue="l")) == 6
    pin_clock(clocked, NOW + 5)  # every lease has lapsed
    [row] = rows(clocked, "SELECT processing, lapsed FROM alk.queue_stats('l', 2)")
    assert 3 <= row["lapsed"] <= row["processing"]


def test_queue_stats_exact_limit_of_the_largest_bigint_is_every_count_exact(clocked):
    enqueue(clocked, "m")
    assert rows(clocked, "SELECT ready, estimated FROM alk.queue_stats('m', %s)", MAX) == [
        {"ready": 1, "estimated": False}]


@pytest.mark.parametrize("limit", [-1, MIN])
def test_queue_stats_refuses_a_negative_exact_limit(db, limit):
    code, message = sqlstate_of(db, "SELECT * FROM alk.queue_stats(NULL, %s)", limit)
    assert code == "LK002" and "exact_limit" in message


# list_jobs ---------------------------------------------------------------------


def test_list_jobs_pages_by_id_and_filters_by_state(clocked):
    ids = [enqueue(clocked) for _ in range(5)]
    first = claim(clocked)[0]
    kill(clocked, first["id"], first["attempts"])
    second = claim(clocked)[0]
    enqueue(clocked, "other")

    listed = rows(clocked, "SELECT id, state, last_error FROM alk.list_jobs('q')")
    assert [r["id"] for r in listed] == ids
    assert rows(clocked, "SELECT id, last_error FROM alk.list_jobs('q', 'dead')") == [
        {"id": ids[0], "last_error": "boom"}]
    assert [r["id"] for r in rows(clocked, "SELECT id FROM alk.list_jobs('q', state => 'processing')")] == [
        second["id"]]
    assert [r["id"] for r in rows(clocked, "SELECT id FROM alk.list_jobs('q', 'pending', n => 2)")] == ids[2:4]
    page = rows(clocked, "SELECT id FROM alk.list_jobs('q', n => 2, after_id => %s)", ids[1])
    assert [r["id"] for r in page] == ids[2:4]
    # Whole rows, like get_job.
    whole = rows(clocked, "SELECT * FROM alk.list_jobs('q', n => 1)")[0]
    assert whole == rows(clocked, "SELECT * FROM alk.get_job('q', %s)", ids[0])[0]


@pytest.mark.parametrize("n", [0, -1, None])
def test_list_jobs_extent_non_positive_lists_nothing(clocked, n):
    enqueue(clocked)
    assert rows(clocked, "SELECT * FROM alk.list_jobs('q', NULL, %s)", n) == []


def test_list_jobs_refuses_an_unknown_state_and_reserved_names(db):
    code, message = sqlstate_of(db, "SELECT * FROM alk.list_jobs('q', 'running')")
    assert code == "LK002" and "'running'" in message
    assert sqlstate_of(db, "SELECT * FROM alk.list_jobs('alk:outbox:x')")[0] == "LK001"


# requeue_dead --------------------------------------------------------------------


def dead_jobs(db: psycopg.Connection, n: int, queue: str = "q", **options: Any) -> list[int]:
    ids = [enqueue(db, queue, **options) for _ in range(n)]
    for job in claim(db, n, queue=queue):
        kill(db, job["id"], job["attempts"])
    return ids


def test_requeue_dead_gives_every_dead_job_a_fresh_life(clocked, listen):
    ids = dead_jobs(clocked, 3, priority=4, max_attempts=7, visibility_timeout_s=9)
    alive = enqueue(clocked)
    other = dead_jobs(clocked, 1, "other")
    listener = listen("q", "other")
    pin_clock(clocked, NOW + 100)

    assert one(clocked, "SELECT alk.requeue_dead('q')") == 3
    assert listener.heard(clocked) == [("q", "")]
    for job_id in ids:
        job = rows(clocked, "SELECT * FROM alk.get_job('q', %s)", job_id)[0]
        # Every spent attempt refunded; attempts (the fencing token) stays.
        assert job["attempts"] >= 1 and job["attempts_refunded"] == job["attempts"]
        assert (job["state"], job["attempts"] - job["attempts_refunded"], job["run_at"], job["worker_id"],
                job["claimed_at"], job["claim_expires_at"], job["last_error"], job["died_at"]) == (
            "pending", 0, NOW + 100, None, None, None, None, None)
        assert (job["priority"], job["max_attempts"], job["visibility_timeout_s"], job["created_at"]) == (
            4, 7, 9, NOW)
    assert one(clocked, "SELECT state FROM alk.get_job('other', %s)", other[0]) == "dead"
    assert one(clocked, "SELECT state FROM alk.get_job('q', %s)", alive) == "pending"
    assert {job["id"] for job in claim(clocked, 10)} == {*ids, alive}


def test_requeue_dead_by_ids_moves_only_dead_jobs_of_this_queue(clocked):
    ids = dead_jobs(clocked, 3)
    other = dead_jobs(clocked, 1, "other")
    pending = enqueue(clocked)
    assert one(clocked, "SELECT alk.requeue_dead('q', %s)", [ids[0], ids[2], other[0], pending, 999_999, None]) == 2
    states = {r["id"]: r["state"] for r in rows(clocked, "SELECT id, state FROM alk.list_jobs('q')")}
    assert states == {ids[0]: "pending", ids[1]: "dead", ids[2]: "pending", pending: "pending"}
    assert one(clocked, "SELECT alk.requeue_dead('q', ARRAY[]::bigint[])") == 0


def test_requeue_dead_with_nothing_to_move_returns_zero_and_notifies_nobody(clocked, listen):
    enqueue(clocked)
    listener = listen("q")
    assert one(clocked, "SELECT alk.requeue_dead('q')") == 0
    assert listener.heard(clocked) == []


def test_requeue_dead_counts_an_expiring_jobs_ttl_again_from_now(clocked):
    [job_id] = dead_jobs(clocked, 1, expires=60)
    pin_clock(clocked, NOW + 1000)
    assert one(clocked, "SELECT alk.requeue_dead('q')") == 1
    assert one(clocked, "SELECT expires_at FROM alk.get_job('q', %s)", job_id) == NOW + 1060
    assert [job["id"] for job in claim(clocked)] == [job_id]


def test_requeue_dead_saturates_extreme_expiry(clocked):
    [job_id] = dead_jobs(clocked, 1, expires=MAX)
    assert one(clocked, "SELECT alk.requeue_dead('q')") == 1
    assert one(clocked, "SELECT expires_at FROM alk.get_job('q', %s)", job_id) == MAX


@pytest.mark.parametrize("queue", ["", None, "alk:outbox:billing"])
def test_requeue_dead_refuses_invalid_and_reserved_names(db, queue):
    assert sqlstate_of(db, "SELECT alk.requeue_dead(%s)", queue)[0] == "LK001"
