"""Queue limits and serial groups (docs/queue.md, "Limits and serial groups"):
alk.set_queue_limits, alk.queue_limits, the claim under max_running, rate
and max_running_per_group, and alk.next_claim_at; checked through alk.*
alone, on a pinned clock, and with real concurrent connections."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

from tests.conftest import pin_clock
from tests.helpers import one
from tests.sql.test_queue import MAX, MIN, NOW, claim, enqueue, job

LIMITS = "SELECT alk.set_queue_limits(%(queue)s, %(max_running)s, %(rate)s, %(rate_period_s)s, %(per_group)s)"


def limit(db: psycopg.Connection, queue: str = "q", max_running: int | None = None, rate: int | None = None,
          rate_period_s: int | None = None, per_group: int | None = None) -> bool:
    return one(db, LIMITS, queue=queue, max_running=max_running, rate=rate, rate_period_s=rate_period_s,
               per_group=per_group)


def open_on_the_clock(connect: Any) -> psycopg.Connection:
    """A connection in its own transaction (not autocommit) on the pinned clock."""
    conn = connect(autocommit=False)
    pin_clock(conn, NOW)
    conn.commit()
    return conn


def next_claim_at(db: psycopg.Connection, queue: str = "q") -> int | None:
    return one(db, "SELECT alk.next_claim_at(%s)", queue)


def ids(rows: list[dict[str, Any]]) -> list[int]:
    return [r["id"] for r in rows]


@pytest.fixture
def clocked(db: psycopg.Connection) -> psycopg.Connection:
    pin_clock(db, NOW)
    return db


# set_queue_limits and queue_limits -------------------------------------------

def test_limits_round_trip_and_say_whether_they_changed(clocked):
    assert clocked.execute("SELECT * FROM alk.queue_limits('q')").fetchall() == [("q", None, None, None, None)]
    assert limit(clocked, max_running=5, rate=10, rate_period_s=60, per_group=2) is True
    assert limit(clocked, max_running=5, rate=10, rate_period_s=60, per_group=2) is False
    assert clocked.execute("SELECT * FROM alk.queue_limits('q')").fetchall() == [("q", 5, 10, 60, 2)]
    # The whole set at once: what the call leaves NULL is lifted.
    assert limit(clocked, max_running=5) is True
    assert clocked.execute("SELECT * FROM alk.queue_limits('q')").fetchall() == [("q", 5, None, None, None)]
    assert limit(clocked) is True
    assert limit(clocked) is False
    assert one(clocked, "SELECT count(*) FROM alk.limited_queues") == 0  # no limit: no row


@pytest.mark.parametrize(("args", "fragment"), [
    ({"max_running": 0}, "max_running must be > 0"),
    ({"max_running": -1}, "max_running must be > 0"),
    ({"rate": 0, "rate_period_s": 1}, "rate must be > 0"),
    ({"rate": 1, "rate_period_s": 0}, "rate_period_s must be > 0"),
    ({"per_group": MIN}, "max_running_per_group must be > 0"),
    ({"rate": 5}, "rate and rate_period_s go together"),
    ({"rate_period_s": 5}, "rate and rate_period_s go together"),
])
def test_bad_limits_are_lk002_naming_the_argument_and_write_nothing(clocked, args, fragment):
    limit(clocked, max_running=7)
    with pytest.raises(psycopg.Error) as caught:
        limit(clocked, **args)
    assert caught.value.sqlstate == "LK002"
    assert fragment in str(caught.value)
    assert clocked.execute("SELECT * FROM alk.queue_limits('q')").fetchall() == [("q", 7, None, None, None)]


def test_limit_names_are_checked(clocked):
    for bad in ("", "alk:x", None):
        with pytest.raises(psycopg.Error) as caught:
            limit(clocked, queue=bad, max_running=1)  # type: ignore[arg-type]
        assert caught.value.sqlstate == "LK001"
        with pytest.raises(psycopg.Error):
            clocked.execute("SELECT * FROM alk.queue_limits(%s)", [bad])


# max_running -----------------------------------------------------------------

def test_max_running_caps_a_claim_and_asks_for_more_get_fewer(clocked):
    for _ in range(5):
        enqueue(clocked)
    limit(clocked, max_running=2)
    first = claim(clocked, 10)
    assert len(first) == 2
    assert claim(clocked, 10) == []  # full: fewer, never an error
    assert one(clocked, "SELECT alk.ack(%s, 'w1', 1)", first[0]["id"]) is True
    assert len(claim(clocked, 10)) == 1  # one slot freed
    limit(clocked, max_running=4)
    assert len(claim(clocked, 10)) == 2  # raised: the rest


def test_lapsed_leases_do_not_count_as_running(clocked):
    for _ in range(3):
        enqueue(clocked, visibility_timeout_s=10)
    limit(clocked, max_running=1)
    held = claim(clocked, 5)
    assert len(held) == 1
    assert next_claim_at(clocked) == NOW + 11  # full: the second after its lease ends
    pin_clock(clocked, NOW + 11)  # lapsed: the slot is free again
    again = claim(clocked, 5)
    # The lapsed job comes first in claim order: claimed again, and nothing more.
    assert ids(again) == ids(held)
    assert again[0]["attempts"] == 2


def test_settle_and_claim_honours_max_running(clocked):
    for _ in range(4):
        enqueue(clocked)
    limit(clocked, max_running=2)
    a, _ = claim(clocked, 2)
    rows = clocked.execute(
        "SELECT kind, id FROM alk.settle_and_claim('q', 'w1', 10, ARRAY[%s]::bigint[], ARRAY[1]::bigint[], "
        "ARRAY['ack'])", [a["id"]]).fetchall()
    assert [kind for kind, _ in rows] == ["settled", "claimed"]  # one freed, one claimed


def test_a_claim_of_a_limited_queue_needs_read_committed(connect, clocked):
    enqueue(clocked)
    limit(clocked, max_running=1)
    conn = open_on_the_clock(connect)
    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    with pytest.raises(psycopg.Error) as caught:
        claim(conn, 1)
    assert caught.value.sqlstate == "LK002"
    assert "READ COMMITTED" in str(caught.value)


def rounds_of_concurrent_claims(connect, queue: str, claimers: int, rounds: int, n: int) -> list[int]:
    """``rounds`` times: ``claimers`` connections claim up to ``n`` each at
    the same instant (a barrier); how many jobs the round claimed in all.
    Everything claimed is cancelled (deleted) between rounds."""
    conns = [connect() for _ in range(claimers)]
    barrier = threading.Barrier(claimers)
    claimed: list[list[tuple[int, int]]] = [[] for _ in range(rounds)]
    errors: list[BaseException] = []

    def run(conn: psycopg.Connection, me: int) -> None:
        try:
            for r in range(rounds):
                barrier.wait()
                rows = conn.execute("SELECT id, attempts FROM alk.claim(%s, %s, %s)",
                                    [queue, f"w{me}", n]).fetchall()
                claimed[r].extend(rows)
                barrier.wait()  # every claim of the round is in
                if me == 0:
                    for job_id, _ in claimed[r]:
                        conn.execute("SELECT alk.cancel(%s, %s)", [queue, job_id])
                barrier.wait()  # acked before the next round
        except BaseException as error:  # surfaced by the caller
            errors.append(error)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(c, i)) for i, c in enumerate(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return [len(r) for r in claimed]


def test_sixteen_concurrent_claimers_never_hold_more_than_max_running(db, connect):
    db.execute("SELECT alk.enqueue_batch('q', array_fill('{}'::jsonb, ARRAY[200]))")
    limit(db, max_running=3)
    assert rounds_of_concurrent_claims(connect, "q", claimers=16, rounds=8, n=2) == [3] * 8


def test_sixteen_concurrent_claimers_take_one_job_of_a_group_at_a_time(db, connect):
    # No limits row: the default of one per group holds without the claim lock.
    db.execute("SELECT alk.enqueue_batch('q', array_fill('{}'::jsonb, ARRAY[100]), "
               "group_keys => array_fill('g'::text, ARRAY[100]))")
    assert rounds_of_concurrent_claims(connect, "q", claimers=16, rounds=8, n=3) == [1] * 8


# rate ------------------------------------------------------------------------

def test_rate_allows_rate_claims_per_fixed_window(clocked):
    for _ in range(10):
        enqueue(clocked)
    limit(clocked, rate=3, rate_period_s=10)
    assert len(claim(clocked, 2)) == 2  # opens the window [NOW, NOW + 10)
    pin_clock(clocked, NOW + 5)
    assert len(claim(clocked, 5)) == 1
    assert claim(clocked, 5) == []
    assert next_claim_at(clocked) == NOW + 10
    pin_clock(clocked, NOW + 9)
    assert claim(clocked, 5) == []  # the window's last second
    pin_clock(clocked, NOW + 10)
    assert len(claim(clocked, 5)) == 3  # a new window, opened now
    assert one(clocked, "SELECT started_at FROM alk.queue_rate_windows WHERE queue = 'q'") == NOW + 10
    pin_clock(clocked, NOW + 12)
    assert next_claim_at(clocked) == NOW + 20
    pin_clock(clocked, NOW + 3)  # a clock set back stays in the window in force
    assert claim(clocked, 5) == []


def test_an_empty_claim_opens_no_window(clocked):
    limit(clocked, rate=1, rate_period_s=10)
    assert claim(clocked, 5) == []
    assert one(clocked, "SELECT count(*) FROM alk.queue_rate_windows") == 0
    enqueue(clocked)
    assert len(claim(clocked, 5)) == 1


def test_rate_windows_at_the_clocks_edges(clocked):
    for _ in range(6):
        enqueue(clocked, run_at=MIN)
    limit(clocked, rate=2, rate_period_s=MAX)
    pin_clock(clocked, MIN)
    assert len(claim(clocked, 5)) == 2
    assert next_claim_at(clocked) == MIN + MAX  # = -1: the window's end, exactly
    pin_clock(clocked, -2)
    assert claim(clocked, 5) == []
    pin_clock(clocked, -1)
    assert len(claim(clocked, 5)) == 2  # a new window, [-1, MAX - 1)
    pin_clock(clocked, MAX - 2)
    assert claim(clocked, 5) == []
    assert next_claim_at(clocked) == MAX - 1
    pin_clock(clocked, MAX - 1)
    assert len(claim(clocked, 5)) == 2  # [MAX - 1, ...): its end saturates
    pin_clock(clocked, MAX)
    assert claim(clocked, 5) == []  # it never ends: the end is past the clock's range
    assert next_claim_at(clocked) is None


def test_a_window_opened_near_the_maximum_saturates(clocked):
    for _ in range(4):
        enqueue(clocked, run_at=MIN)
    limit(clocked, rate=1, rate_period_s=10)
    pin_clock(clocked, MAX - 10)
    assert len(claim(clocked, 5)) == 1
    assert next_claim_at(clocked) == MAX  # [MAX - 10, MAX): the clock's last second is a new window
    pin_clock(clocked, MAX - 1)
    assert claim(clocked, 5) == []
    pin_clock(clocked, MAX)
    assert len(claim(clocked, 5)) == 1
    assert next_claim_at(clocked) is None  # [MAX, MAX + 10) ends past the range


def test_lifting_the_rate_forgets_the_window(clocked):
    limit(clocked, rate=1, rate_period_s=100)
    enqueue(clocked)
    enqueue(clocked)
    assert len(claim(clocked, 5)) == 1
    limit(clocked, max_running=10)
    assert one(clocked, "SELECT count(*) FROM alk.queue_rate_windows") == 0
    assert len(claim(clocked, 5)) == 1


# serial groups -------------------------------------------------------------------

def test_one_job_of_a_group_at_a_time_in_claim_order_and_others_pass(clocked):
    a1 = enqueue(clocked, group_key="a")
    a2 = enqueue(clocked, group_key="a")
    b1 = enqueue(clocked, group_key="b")
    free = enqueue(clocked)
    assert ids(claim(clocked, 10)) == [a1, b1, free]  # a2 waits behind a1, nobody waits behind a
    assert claim(clocked, 10) == []
    assert one(clocked, "SELECT alk.ack(%s, 'w1', 1)", a1) is True
    assert ids(claim(clocked, 10)) == [a2]
    assert job(clocked, a2)["group_key"] == "a"


def test_a_busy_group_does_not_hold_back_lower_priorities(clocked):
    for _ in range(20):
        enqueue(clocked, group_key="busy", priority=9)
    low = enqueue(clocked, priority=-5)
    first = claim(clocked, 1)
    assert first[0]["group_key"] == "busy"
    assert ids(claim(clocked, 10)) == [low]
    assert next_claim_at(clocked) == NOW + 301  # every due job waits on a full group: the lease's end


def test_the_group_runs_its_jobs_in_priority_order(clocked):
    low = enqueue(clocked, group_key="g", priority=1)
    high = enqueue(clocked, group_key="g", priority=5)
    assert ids(claim(clocked, 10)) == [high]
    one(clocked, "SELECT alk.ack(%s, 'w1', 1)", high)
    assert ids(claim(clocked, 10)) == [low]


def test_a_job_backing_off_after_a_retry_does_not_hold_its_group(clocked):
    first = enqueue(clocked, group_key="g")
    second = enqueue(clocked, group_key="g")
    assert ids(claim(clocked, 10)) == [first]
    assert one(clocked, "SELECT alk.retry(%s, 'w1', 1, 'boom', 30)", first) is True
    assert ids(claim(clocked, 10)) == [second]  # first waits out its backoff
    pin_clock(clocked, NOW + 30)
    assert claim(clocked, 10) == []  # due again, but second runs
    assert next_claim_at(clocked) == NOW + 301
    one(clocked, "SELECT alk.ack(%s, 'w1', 1)", second)
    again = claim(clocked, 10)
    assert (ids(again), again[0]["attempts"]) == ([first], 2)


def test_a_lapsed_group_job_is_claimed_again_before_its_group_moves_on(clocked):
    first = enqueue(clocked, group_key="g", visibility_timeout_s=10)
    enqueue(clocked, group_key="g")
    assert ids(claim(clocked, 10)) == [first]
    pin_clock(clocked, NOW + 11)
    assert ids(claim(clocked, 10)) == [first]


def test_a_buried_head_lets_the_next_job_of_its_group_run_in_the_same_claim(clocked):
    dead = enqueue(clocked, group_key="g", max_attempts=1)
    nxt = enqueue(clocked, group_key="g")
    claim(clocked, 1)
    one(clocked, "SELECT alk.retry(%s, 'w1', 1, 'x', 0)", dead)  # out of attempts: buried
    assert job(clocked, dead)["state"] == "dead"
    assert ids(claim(clocked, 10)) == [nxt]


def test_max_running_per_group_lets_that_many_run(clocked):
    jobs = [enqueue(clocked, group_key="g") for _ in range(5)]
    limit(clocked, per_group=2)
    assert ids(claim(clocked, 10)) == jobs[:2]
    assert claim(clocked, 10) == []
    one(clocked, "SELECT alk.ack(%s, 'w1', 1)", jobs[0])
    assert ids(claim(clocked, 10)) == [jobs[2]]


def test_group_keys_must_match_the_payloads_and_be_names(clocked):
    with pytest.raises(psycopg.Error) as caught:
        clocked.execute("SELECT alk.enqueue_batch('q', ARRAY['{}', '{}']::jsonb[], group_keys => ARRAY['a'])")
    assert caught.value.sqlstate == "LK002"
    assert "group_keys must have one entry per payload" in str(caught.value)
    for call in ("SELECT alk.enqueue('q', '{}', group_key => '')",
                 "SELECT alk.enqueue_batch('q', ARRAY['{}']::jsonb[], group_keys => ARRAY[''])",
                 "SELECT alk.enqueue_batch('q', ARRAY['{}']::jsonb[], dedup_keys => ARRAY['k'], "
                 "group_keys => ARRAY[''])"):
        with pytest.raises(psycopg.Error) as caught:
            clocked.execute(call)
        assert caught.value.sqlstate == "LK001"
    assert one(clocked, "SELECT count(*) FROM alk.jobs") == 0
    got = clocked.execute("SELECT * FROM alk.enqueue_batch('q', ARRAY['{}', '{}']::jsonb[], "
                          "dedup_keys => ARRAY['k', NULL], group_keys => ARRAY['a', NULL])").fetchall()
    assert [job(clocked, i)["group_key"] for (i,) in got] == ["a", None]
