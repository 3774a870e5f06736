"""alk.enqueue's after (docs/queue.md "Dependencies"): a job waits, pending
and unclaimable, until none of the jobs it lists exists any more (acked,
cancelled, purged) or is completed; a listed job that dies buries it, and
requeue_dead of that job brings it back. Checked through alk.* alone."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from tests.conftest import pin_clock
from tests.helpers import one, raises_lk, until
from tests.sql.test_queue import NOW, claim, enqueue, job

ACK = "SELECT alk.ack(%s, %s, %s)"


@pytest.fixture
def clocked(db: psycopg.Connection) -> psycopg.Connection:
    pin_clock(db, NOW)
    return db


def run(db: psycopg.Connection, job_id: int, worker: str = "w1") -> dict[str, Any]:
    """Claim exactly this job (it must be the only one claimable) and ack it."""
    got = claim(db, 10, worker=worker)
    assert [g["id"] for g in got] == [job_id]
    assert one(db, ACK, job_id, worker, got[0]["attempts"]) is True
    return got[0]


def waiting(db: psycopg.Connection, job_id: int) -> int:
    return one(db, "SELECT after_left FROM alk.jobs WHERE id = %s", job_id)


def test_a_job_waits_until_every_listed_job_is_acked(clocked):
    a, b = enqueue(clocked), enqueue(clocked)
    child = enqueue(clocked, after=[a, b])
    assert job(clocked, child)["state"] == "pending"
    assert [j["id"] for j in claim(clocked, 10)] == [a, b]  # never the child
    assert one(clocked, ACK, a, "w1", 1) is True
    assert claim(clocked, 10) == []  # still waits for b
    assert one(clocked, "SELECT alk.next_claim_at('q')") == NOW + 301  # b's lease lapsing, not the child
    assert one(clocked, ACK, b, "w1", 1) is True
    assert [j["id"] for j in claim(clocked, 10)] == [child]


def test_ids_that_no_longer_exist_and_completed_jobs_count_as_done(clocked):
    gone = enqueue(clocked)
    run(clocked, gone)
    assert enqueue(clocked, after=[gone, 10**12]) > 0  # an acked id and one never issued
    kept = enqueue(clocked, queue="kept")
    one(clocked, "SELECT alk.set_queue_retention('kept', 3600)")
    got = claim(clocked, queue="kept")[0]
    assert one(clocked, "SELECT alk.ack(%s, 'w1', 1, 'kept', '{\"ok\": 1}')", kept) is True
    assert job(clocked, kept, "kept")["state"] == "completed"
    child = enqueue(clocked, queue="kept", after=[kept])
    assert [j["id"] for j in claim(clocked, 10, queue="kept")] == [child]
    assert got["id"] == kept
    assert one(clocked, "SELECT count(*) FROM alk.job_after") == 0


def test_completing_a_listed_job_releases_its_waiters(clocked):
    one(clocked, "SELECT alk.set_queue_retention('q', 3600)")
    parent = enqueue(clocked)
    child = enqueue(clocked, after=[parent])
    got = claim(clocked)[0]
    assert one(clocked, "SELECT alk.ack(%s, 'w1', %s, result => '1')", parent, got["attempts"]) is True
    assert job(clocked, parent)["state"] == "completed"
    assert [j["id"] for j in claim(clocked, 10)] == [child]


def test_enqueue_batch_shares_one_after_list(clocked):
    parent = enqueue(clocked)
    ids = one(clocked, "SELECT array_agg(i) FROM alk.enqueue_batch('q', ARRAY['1', '2']::jsonb[], after => %s) i",
              [parent])
    deduped = one(clocked, "SELECT array_agg(i) FROM alk.enqueue_batch('q', ARRAY['3']::jsonb[], "
                           "dedup_keys => ARRAY['k'], after => %s) i", [parent])
    assert [waiting(clocked, i) for i in [*ids, *deduped]] == [1, 1, 1]
    run(clocked, parent)
    assert [j["id"] for j in claim(clocked, 10)] == [*ids, *deduped]


def test_a_dedup_hit_writes_nothing_after_included(clocked):
    parent = enqueue(clocked)
    holder = enqueue(clocked, dedup_key="k")
    assert enqueue(clocked, dedup_key="k", after=[parent]) == holder
    assert waiting(clocked, holder) == 0
    assert one(clocked, "SELECT count(*) FROM alk.job_after") == 0


@pytest.mark.parametrize(
    ("after", "fragments"),
    [("ARRAY[NULL]::bigint[]", ("after", "NULL at position 1")),
     ("ARRAY[%(other)s, NULL]", ("after", "NULL at position 2")),
     ("ARRAY[%(other)s]", ("after", "another queue"))],
)
def test_bad_after_is_lk002_naming_it_and_writes_nothing(clocked, after, fragments):
    other = enqueue(clocked, queue="elsewhere")
    before = one(clocked, "SELECT count(*) FROM alk.jobs")
    for call in (f"SELECT alk.enqueue('q', '{{}}', after => {after})",
                 f"SELECT alk.enqueue_batch('q', ARRAY['1']::jsonb[], after => {after})",
                 f"SELECT alk.enqueue_batch('q', ARRAY['1']::jsonb[], dedup_keys => ARRAY['d'], after => {after})"):
        with raises_lk("LK002", *fragments):
            clocked.execute(call, {"other": other})
    assert one(clocked, "SELECT count(*) FROM alk.jobs") == before
    assert one(clocked, "SELECT count(*) FROM alk.job_after") == 0
    assert job(clocked, other, "elsewhere")["state"] == "pending"


def test_a_chain_of_1000_jobs_is_claimed_strictly_in_order(clocked):
    ids = [enqueue(clocked, priority=0)]
    for i in range(999):
        # Later links have a higher priority: only the dependencies order them.
        ids.append(enqueue(clocked, priority=i + 1, after=[ids[-1]]))
    for job_id in ids:
        run(clocked, job_id)
    assert claim(clocked, 10) == []
    assert one(clocked, "SELECT count(*) FROM alk.jobs") == 0
    assert one(clocked, "SELECT count(*) FROM alk.job_after") == 0


def test_a_failed_job_buries_its_waiters_transitively_naming_the_job_each_waited_for(clocked):
    parent = enqueue(clocked)
    child = enqueue(clocked, after=[parent])
    grandchild = enqueue(clocked, after=[child])
    other = enqueue(clocked)
    bystander = enqueue(clocked, after=[other])
    claim(clocked)
    assert one(clocked, "SELECT alk.fail(%s, 'w1', 1, 'boom')", parent) is True
    assert (job(clocked, child)["state"], job(clocked, child)["last_error"]) == ("dead", f"after job {parent} died")
    assert (job(clocked, grandchild)["state"], job(clocked, grandchild)["last_error"]) == (
        "dead", f"after job {child} died")
    assert job(clocked, child)["died_at"] == NOW
    assert job(clocked, bystander)["state"] == "pending"
    # Born dead: enqueued after a job that is dead already.
    late = enqueue(clocked, after=[parent])
    assert (job(clocked, late)["state"], job(clocked, late)["last_error"]) == ("dead", f"after job {parent} died")


@pytest.mark.parametrize("death", ["claim", "retry", "settle", "sweep", "lapsed"])
def test_every_way_of_dying_buries_the_waiters(clocked, death):
    parent = enqueue(clocked, max_attempts=1, expires=10, visibility_timeout_s=5)
    child = enqueue(clocked, after=[parent])
    if death == "claim":  # out of attempts at its claim
        claim(clocked)
        pin_clock(clocked, NOW + 6)
        assert claim(clocked) == []
        assert job(clocked, parent)["last_error"] == "max attempts exceeded"
    elif death == "retry":
        claim(clocked)
        assert one(clocked, "SELECT alk.retry(%s, 'w1', 1, 'x')", parent) is True
    elif death == "settle":
        claim(clocked)
        one(clocked, "SELECT count(*) FROM alk.settle(ARRAY[%s]::bigint[], 'w1', outcomes => ARRAY['fail'])", parent)
    elif death == "sweep":
        pin_clock(clocked, NOW + 10)
        assert one(clocked, "SELECT alk.sweep_expired('q')") >= 1
    else:  # a lapsed lease past expiry, buried by the claim
        claim(clocked)
        pin_clock(clocked, NOW + 11)
        claim(clocked)
    assert job(clocked, parent)["state"] == "dead"
    assert (job(clocked, child)["state"], job(clocked, child)["last_error"]) == ("dead", f"after job {parent} died")


def test_requeue_dead_of_the_job_brings_its_waiters_back_waiting(clocked):
    parent = enqueue(clocked)
    child = enqueue(clocked, after=[parent])
    grandchild = enqueue(clocked, after=[child])
    claim(clocked)
    one(clocked, "SELECT alk.fail(%s, 'w1', 1)", parent)
    assert one(clocked, "SELECT alk.requeue_dead('q', ARRAY[%s]::bigint[])", parent) == 3
    for waiter in (child, grandchild):
        row = job(clocked, waiter)
        assert (row["state"], row["last_error"], row["died_at"]) == ("pending", None, None)
    got = run(clocked, parent)  # only the parent is claimable
    assert got["attempts"] == 2
    run(clocked, child)
    run(clocked, grandchild)


def test_requeue_dead_of_a_whole_queue_keeps_the_waiters_waiting(clocked):
    parent = enqueue(clocked)
    child = enqueue(clocked, after=[parent])
    claim(clocked)
    one(clocked, "SELECT alk.fail(%s, 'w1', 1)", parent)
    assert one(clocked, "SELECT alk.requeue_dead('q')") == 2
    run(clocked, parent)
    run(clocked, child)


def test_cancel_of_a_listed_job_releases_its_waiters(clocked):
    held, pending = enqueue(clocked), enqueue(clocked)
    child = enqueue(clocked, after=[held, pending])
    assert [j["id"] for j in claim(clocked)] == [held]
    assert one(clocked, "SELECT alk.cancel('q', %s)", pending) is True
    assert (claim(clocked, 10), waiting(clocked, child)) == ([], 1)  # still waits for the held one
    assert one(clocked, "SELECT alk.cancel('q', %s)", held) is True
    assert [j["id"] for j in claim(clocked, 10)] == [child]


def test_purging_a_dead_job_releases_a_waiter_requeued_on_its_own(clocked):
    parent = enqueue(clocked, dead_letter_retention_s=60)
    child = enqueue(clocked, after=[parent])
    claim(clocked)
    one(clocked, "SELECT alk.fail(%s, 'w1', 1)", parent)
    assert one(clocked, "SELECT alk.requeue_dead('q', ARRAY[%s]::bigint[])", child) == 1
    assert claim(clocked, 10) == []  # waits for a job that is dead
    pin_clock(clocked, NOW + 60)
    one(clocked, "SELECT alk.sweep_expired('q')")
    assert job(clocked, parent) is None
    assert [j["id"] for j in claim(clocked, 10)] == [child]


def test_queue_stats_counts_waiting_jobs_as_scheduled(clocked):
    parent = enqueue(clocked)
    enqueue(clocked, after=[parent])
    row = clocked.execute("SELECT pending, ready, scheduled, next_run_at FROM alk.queue_stats('q')").fetchone()
    assert row == (2, 1, 1, None)
    limited = clocked.execute("SELECT scheduled, estimated FROM alk.queue_stats('q', exact_limit => 0)").fetchone()
    assert limited[1] is True and limited[0] >= 1


def test_release_wakes_an_idle_worker(clocked, connect):
    parent = enqueue(clocked)
    enqueue(clocked, after=[parent])
    got = claim(clocked)[0]
    listener = connect()
    listener.execute("LISTEN " + one(clocked, "SELECT quote_ident(alk.queue_channel('q'))"))
    one(listener, "SELECT alk.wait_for_jobs('q', 'idle-1')")
    assert one(clocked, ACK, parent, "w1", got["attempts"]) is True
    assert any(True for _ in listener.notifies(timeout=5, stop_after=1))


# concurrency ------------------------------------------------------------------


def in_thread(target: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(target()))
    thread.start()
    return thread, out


def blocked_on_lock(db: psycopg.Connection, pid: int) -> bool:
    return one(db, "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", pid) is True


def test_an_enqueue_that_locks_the_parent_first_is_seen_by_the_ack_that_waits(db, connect):
    parent = enqueue(db)
    got = claim(db)[0]
    enqueuer = connect(autocommit=False)
    child = enqueue(enqueuer, after=[parent])  # open: holds the parent's row
    acker = connect()
    thread, out = in_thread(lambda: one(acker, ACK, parent, "w1", got["attempts"]))
    until(lambda: blocked_on_lock(db, acker.info.backend_pid), "the ack waits for the enqueue")
    enqueuer.commit()
    thread.join()
    assert out == [True]
    assert [j["id"] for j in claim(db, 10)] == [child]


def test_an_enqueue_that_waits_for_the_parents_ack_sees_it_gone(db, connect):
    parent = enqueue(db)
    got = claim(db)[0]
    acker = connect(autocommit=False)
    assert one(acker, ACK, parent, "w1", got["attempts"]) is True  # open: the row is deleted, uncommitted
    enqueuer = connect()
    thread, out = in_thread(lambda: enqueue(enqueuer, after=[parent]))
    until(lambda: blocked_on_lock(db, enqueuer.info.backend_pid), "the enqueue waits for the ack")
    acker.commit()
    thread.join()
    assert [j["id"] for j in claim(db, 10)] == out
    assert one(db, "SELECT count(*) FROM alk.job_after") == 0


def test_racing_acks_and_enqueues_strand_no_waiter(db, connect):
    """Parents acked by one connection while another enqueues children after
    them, unordered: every child ends claimable, none waits on a gone job."""
    parents = [enqueue(db) for _ in range(200)]
    held = claim(db, 200)
    acker, enqueuer = connect(), connect()
    go = threading.Barrier(2)

    def ack_all() -> None:
        go.wait()
        for h in held:
            assert one(acker, ACK, h["id"], "w1", h["attempts"]) is True

    def enqueue_all() -> list[int]:
        go.wait()
        return [enqueue(enqueuer, after=[p]) for p in parents]

    t1, _ = in_thread(ack_all)
    t2, children = in_thread(enqueue_all)
    t1.join()
    t2.join()
    assert sorted(j["id"] for j in claim(db, 1000)) == sorted(children[0])
    assert one(db, "SELECT count(*) FROM alk.job_after") == 0


def test_two_listed_jobs_acked_at_once_by_two_connections_release_their_waiter(db, connect):
    first, second = connect(autocommit=False), connect()
    for _ in range(20):
        a, b = enqueue(db), enqueue(db)
        child = enqueue(db, after=[a, b])
        held = claim(db, 2)
        # The first ack's release holds the waiter's row; the second's
        # release waits for it, then subtracts from what the first left.
        assert one(first, ACK, held[0]["id"], "w1", 1) is True
        thread, out = in_thread(lambda job_id=held[1]["id"]: one(second, ACK, job_id, "w1", 1))
        until(lambda: blocked_on_lock(db, second.info.backend_pid), "the second release waits for the first")
        first.commit()
        thread.join()
        assert out == [True]
        assert [j["id"] for j in claim(db, 10)] == [child]
        assert one(db, ACK, child, "w1", 1) is True
