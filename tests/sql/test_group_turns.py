"""Serial groups' turns (sql/queue/38_group_turns.sql): a pending job that is
not one of its group's turns is parked (after_left = -1), out of the claim
index, so a claim does not walk the jobs of busy groups; every settle,
burial, cancel and share change gives the group its turns back. Checked
through alk.* and the table's rows, on a pinned clock, and with real
concurrent connections (nothing left parked, one job of a group at a time)."""

from __future__ import annotations

import threading

import psycopg
import pytest

from tests.conftest import pin_clock
from tests.helpers import calls_of, one
from tests.sql.test_limits import ids, limit, open_on_the_clock
from tests.sql.test_queue import NOW, claim, enqueue


@pytest.fixture
def clocked(db: psycopg.Connection) -> psycopg.Connection:
    pin_clock(db, NOW)
    return db


def parked(db: psycopg.Connection, queue: str = "q") -> list[int]:
    """The ids of the queue's parked jobs, in id order."""
    return [r[0] for r in db.execute(
        "SELECT id FROM alk.jobs WHERE queue = %s AND state = 'pending' AND after_left = -1 ORDER BY id", [queue])]


def ack(db: psycopg.Connection, job_id: int, attempt: int = 1, worker: str = "w1") -> bool:
    return one(db, "SELECT alk.ack(%s, %s, %s)", job_id, worker, attempt)


def test_a_busy_groups_next_jobs_are_parked_and_the_claim_takes_what_is_free(clocked):
    heads = [enqueue(clocked, group_key=f"g{i}") for i in range(50)]
    assert parked(clocked) == []  # every group's first job is its turn
    assert sorted(ids(claim(clocked, 50))) == heads
    behind = [enqueue(clocked, group_key=f"g{i}") for i in range(50)]
    assert parked(clocked) == behind  # full groups: none of these is a turn
    free = enqueue(clocked)
    # The claim's index holds only the free job: nothing to walk past.
    assert one(clocked, "SELECT count(*) FROM alk.jobs WHERE queue = 'q' AND state = 'pending' "
                        "AND after_left = 0") == 1
    assert ids(claim(clocked, 10)) == [free]
    stats = clocked.execute("SELECT pending, ready, scheduled FROM alk.queue_stats('q')").fetchone()
    assert stats == (50, 50, 0)  # parked jobs are pending, and ready when due


def test_an_ack_unparks_the_next_job_of_its_group_in_claim_order(clocked):
    first = enqueue(clocked, group_key="g")
    second = enqueue(clocked, group_key="g")
    third = enqueue(clocked, group_key="g")
    assert parked(clocked) == [second, third]  # first is the turn
    assert ids(claim(clocked, 10)) == [first]
    assert ack(clocked, first) is True
    assert parked(clocked) == [third]
    assert ids(claim(clocked, 10)) == [second]
    assert ack(clocked, second) is True
    assert ids(claim(clocked, 10)) == [third]
    assert parked(clocked) == []


@pytest.mark.parametrize("settle", [
    "SELECT alk.retry(%(id)s, 'w1', 1, 'boom', 60)",
    "SELECT alk.fail(%(id)s, 'w1', 1, 'boom')",
    "SELECT alk.snooze(%(id)s, 'w1', 1, 60)",
    "SELECT alk.release_jobs(ARRAY[%(id)s]::bigint[], 'w1', ARRAY[1]::bigint[])",
    "SELECT alk.cancel('q', %(id)s)",
    "SELECT alk.settle(ARRAY[%(id)s]::bigint[], 'w1', ARRAY[1]::bigint[], ARRAY['retry'])",
    "SELECT * FROM alk.settle_and_claim('q', 'w1', 0, ARRAY[%(id)s]::bigint[], ARRAY[1]::bigint[])",
])
def test_every_way_out_of_processing_gives_the_group_its_next_turn(clocked, settle):
    head = enqueue(clocked, group_key="g")
    nxt = enqueue(clocked, group_key="g")
    assert ids(claim(clocked, 10)) == [head]
    assert parked(clocked) == [nxt]
    clocked.execute(settle, {"id": head})
    # release_jobs puts head back at its place, ahead of nxt: head is the turn.
    expected = [head] if "release_jobs" in settle else [nxt]
    claimed = ids(claim(clocked, 10))
    assert claimed == expected
    # Whatever is left pending is parked again behind the running job, or
    # waits for its run_at (a retry's or snooze's backoff).
    assert one(clocked, "SELECT count(*) FROM alk.jobs WHERE queue = 'q' AND state = 'pending' "
                        "AND after_left = 0 AND run_at <= %s", NOW) == 0


def test_a_completion_and_a_burial_of_the_running_job_give_the_next_its_turn(clocked):
    clocked.execute("SELECT alk.set_queue_retention('q', 3600)")
    head = enqueue(clocked, group_key="g")
    nxt = enqueue(clocked, group_key="g")
    last = enqueue(clocked, group_key="g", max_attempts=1)
    assert ids(claim(clocked, 10)) == [head]
    assert ack(clocked, head) is True  # kept as completed
    assert ids(claim(clocked, 10)) == [nxt]
    assert one(clocked, "SELECT alk.fail(%s, 'w1', 1, 'no')", nxt) is True  # dead
    assert ids(claim(clocked, 10)) == [last]


def test_cancelling_a_waiting_turn_gives_the_next_job_its_turn(clocked):
    head = enqueue(clocked, group_key="g")
    second = enqueue(clocked, group_key="g")
    third = enqueue(clocked, group_key="g")
    assert parked(clocked) == [second, third]
    assert one(clocked, "SELECT alk.cancel('q', %s)", head) is True
    assert parked(clocked) == [third]
    assert one(clocked, "SELECT alk.cancel('q', %s)", second) is True
    assert ids(claim(clocked, 10)) == [third]


def test_a_turn_buried_by_the_sweep_gives_the_next_job_its_turn(clocked):
    head = enqueue(clocked, group_key="g", expires=10)
    nxt = enqueue(clocked, group_key="g")
    assert parked(clocked) == [nxt]
    pin_clock(clocked, NOW + 11)
    assert one(clocked, "SELECT alk.sweep_expired('q')") == 1
    assert one(clocked, "SELECT state FROM alk.jobs WHERE id = %s", head) == "dead"
    assert ids(claim(clocked, 10)) == [nxt]


def test_each_priority_keeps_a_turn_so_a_later_due_job_is_never_left_parked(clocked):
    # urgent is ahead in claim order but not due; low is due now: both are
    # turns, so low runs now and urgent runs when it is due.
    urgent = enqueue(clocked, group_key="g", priority=10, delay=30)
    low = enqueue(clocked, group_key="g")
    low2 = enqueue(clocked, group_key="g")
    assert parked(clocked) == [low2]
    assert ids(claim(clocked, 10)) == [low]
    assert ack(clocked, low) is True
    pin_clock(clocked, NOW + 30)
    assert ids(claim(clocked, 10)) == [urgent]  # due now, and ahead of low2
    assert ack(clocked, urgent) is True
    assert ids(claim(clocked, 10)) == [low2]


def test_a_larger_share_unparks_that_many_turns(clocked):
    jobs = [enqueue(clocked, group_key="g") for _ in range(5)]
    assert parked(clocked) == jobs[1:]
    limit(clocked, per_group=3)  # a new share: the groups' turns again
    assert parked(clocked) == jobs[3:]
    assert ids(claim(clocked, 10)) == jobs[:3]
    assert ack(clocked, jobs[0]) is True
    assert ids(claim(clocked, 10)) == [jobs[3]]


def test_a_rotation_moves_parked_jobs_as_they_are(clocked):
    head = enqueue(clocked, group_key="g")
    behind = [enqueue(clocked, group_key="g") for _ in range(3)]
    assert ids(claim(clocked, 10)) == [head]
    assert one(clocked, "SELECT alk.rotate_jobs(0)") == "rotated"
    assert parked(clocked) == behind
    assert ack(clocked, head) is True
    assert ids(claim(clocked, 10)) == [behind[0]]


def test_an_enqueue_under_repeatable_read_parks_nothing_and_the_claim_rule_still_holds(clocked, connect):
    head = enqueue(clocked, group_key="g")
    assert ids(claim(clocked, 10)) == [head]
    conn = open_on_the_clock(connect)
    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    nxt = enqueue(conn, group_key="g")
    conn.commit()
    assert parked(clocked) == []  # its reads would not be fresh: left unparked
    assert claim(clocked, 10) == []  # the group is busy all the same
    assert ack(clocked, head) is True
    assert ids(claim(clocked, 10)) == [nxt]


def test_the_sweep_heals_a_group_left_parked_with_room(clocked):
    # What a settle under REPEATABLE READ can leave: a parked job, nothing
    # running in its group. Made by hand, as such a race leaves it.
    job = enqueue(clocked, group_key="g")
    clocked.execute("UPDATE alk.jobs SET after_left = -1 WHERE id = %s", [job])
    assert claim(clocked, 10) == []
    assert one(clocked, "SELECT alk.sweep_expired('q')") == 0
    assert ids(claim(clocked, 10)) == [job]


def test_jobs_without_a_group_are_never_parked(clocked):
    for _ in range(3):
        enqueue(clocked)
    claim(clocked, 1)
    enqueue(clocked)
    assert parked(clocked) == []


# concurrency -------------------------------------------------------------------

def test_concurrent_workers_run_every_grouped_job_one_per_group_at_a_time(db, connect):
    """Eight connections claim, check and ack grouped jobs while two more
    enqueue into the same groups; every job runs once, no two of one group
    overlap, and the queue drains: no turn is left parked."""
    groups, per_group, workers, producers = 12, 15, 8, 2
    conns = [connect() for _ in range(workers + producers + 1)]
    monitor = conns[-1]
    overlaps: list[tuple[str, int]] = []
    ran: list[int] = []
    errors: list[BaseException] = []
    produced = threading.Event()
    total = groups * per_group * (1 + producers)

    def work(conn: psycopg.Connection, me: int) -> None:
        try:
            idle = 0
            while len(ran) < total and idle < 2000:
                rows = conn.execute("SELECT id, attempts, group_key FROM alk.claim('q', %s, 2)", [f"w{me}"]).fetchall()
                if not rows:
                    idle += 1 if produced.is_set() else 0
                    continue
                idle = 0
                for job_id, attempt, key in rows:
                    # Held, not yet acked: the only job of its group running.
                    running = one(conn, "SELECT count(*) FROM alk.jobs WHERE queue = 'q' AND group_key = %s "
                                        "AND state = 'processing'", key)
                    if running != 1:
                        overlaps.append((key, running))
                    ran.append(job_id)
                    assert one(conn, "SELECT alk.ack(%s, %s, %s)", job_id, f"w{me}", attempt) is True
        except BaseException as error:
            errors.append(error)

    def produce(conn: psycopg.Connection) -> None:
        try:
            for _ in range(per_group):
                conn.execute("SELECT alk.enqueue_batch('q', array_fill('{}'::jsonb, ARRAY[%s]), "
                             "group_keys => ARRAY(SELECT 'g' || i FROM generate_series(1, %s) i))", [groups, groups])
        except BaseException as error:
            errors.append(error)

    db.execute("SELECT alk.enqueue_batch('q', array_fill('{}'::jsonb, ARRAY[%s]), "
               "group_keys => ARRAY(SELECT 'g' || (i %% %s) FROM generate_series(1, %s) i))",
               [groups * per_group, groups, groups * per_group])
    threads = [threading.Thread(target=work, args=(c, i)) for i, c in enumerate(conns[:workers])]
    makers = [threading.Thread(target=produce, args=(c,)) for c in conns[workers:workers + producers]]
    for t in threads + makers:
        t.start()
    for t in makers:
        t.join()
    produced.set()
    for t in threads:
        t.join()
    assert not errors, errors
    assert overlaps == []
    assert len(ran) == len(set(ran)) == total
    assert one(monitor, "SELECT count(*) FROM alk.jobs WHERE queue = 'q'") == 0


def groups_turned(db: psycopg.Connection) -> int:
    """How many groups this database has given their turns so far: alk._group_turns
    takes each group's lock once (alk._group_lock)."""
    return calls_of(db, "alk._group_lock(text, text)")


@pytest.mark.parametrize("outcome", ["retry", "fail"])
def test_a_settle_that_retries_or_fails_a_grouped_job_gives_its_group_its_turns_once(clocked, outcome):
    clocked.execute("SET track_functions = 'all'")
    head = enqueue(clocked, group_key="g")
    nxt = enqueue(clocked, group_key="g")
    other = enqueue(clocked, group_key="h")
    assert sorted(ids(claim(clocked, 10))) == [head, other]
    before = groups_turned(clocked)
    # A retry or fail (its UPDATE's trigger gives g its turns) and an ack (settle gives h its turns).
    clocked.execute("SELECT * FROM alk.settle(ARRAY[%s, %s]::bigint[], 'w1', ARRAY[1, 1]::bigint[], ARRAY[%s, 'ack'])",
                    [head, other, outcome])
    # g's turns once (the trigger) and h's once (settle); a retried head is
    # pending again and parked at commit, which takes g's lock once more.
    assert groups_turned(clocked) - before == (3 if outcome == "retry" else 2)
    assert nxt not in parked(clocked)


def test_a_job_committed_late_ahead_of_a_claimed_one_waits_for_its_group(clocked, connect):
    # Ids are drawn at insert, visibility comes at commit: `ahead` is first
    # in claim order but commits after `behind`, which one claimer takes
    # before `ahead` is visible. A second claimer then sees `ahead` first
    # and `behind` still pending behind it: the group is busy all the same.
    early, late, first, second = (open_on_the_clock(connect) for _ in range(4))
    ahead = enqueue(early, group_key="g")
    behind = enqueue(late, group_key="g")
    late.commit()
    assert ids(claim(first, 10)) == [behind]  # open: its claim is not committed
    early.commit()
    assert claim(second, 10) == []
    second.commit()
    first.commit()
    assert claim(clocked, 10) == []  # committed: behind is running
    assert ack(clocked, behind) is True
    assert ids(claim(clocked, 10)) == [ahead]


def test_a_job_requeued_ahead_of_a_claimed_one_waits_for_its_group(clocked, connect):
    # The same race through requeue_dead: a dead job of the group comes back
    # pending, ahead of one a claimer holds uncommitted.
    old = enqueue(clocked, group_key="g", max_attempts=1)
    assert ids(claim(clocked, 10)) == [old]
    assert one(clocked, "SELECT alk.fail(%s, 'w1', 1, 'no')", old) is True
    nxt = enqueue(clocked, group_key="g")
    first, second = open_on_the_clock(connect), open_on_the_clock(connect)
    assert ids(claim(first, 10)) == [nxt]
    assert one(clocked, "SELECT alk.requeue_dead('q', ARRAY[%s]::bigint[])", old) == 1
    assert claim(second, 10) == []
    second.commit()
    first.commit()



def test_a_job_done_waiting_ahead_of_a_claimed_one_waits_for_its_group(clocked, connect):
    # The same race through after: a job of the group waiting for another
    # joins the claim order, ahead, once that one is done.
    parent = enqueue(clocked)
    waiting = enqueue(clocked, group_key="g", after=[parent])
    nxt = enqueue(clocked, group_key="g")
    assert ids(claim(clocked, 1)) == [parent]
    first, second = open_on_the_clock(connect), open_on_the_clock(connect)
    assert ids(claim(first, 10)) == [nxt]  # waiting is not ahead while it waits
    assert ack(clocked, parent) is True
    assert claim(second, 10) == []
    second.commit()
    first.commit()
    assert ack(clocked, nxt) is True
    assert ids(claim(clocked, 10)) == [waiting]

def test_a_claim_that_takes_a_grouped_job_needs_read_committed(clocked, connect):
    enqueue(clocked, group_key="g")
    plain = enqueue(clocked, queue="plain")
    conn = open_on_the_clock(connect)
    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    with pytest.raises(psycopg.Error) as caught:
        claim(conn, 1)
    assert caught.value.sqlstate == "LK002"
    assert "READ COMMITTED" in str(caught.value)
    conn.rollback()
    assert one(clocked, "SELECT count(*) FROM alk.jobs WHERE state = 'processing'") == 0
    # A claim that takes no grouped job takes no lock and may run under it.
    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    assert ids(claim(conn, 1, queue="plain")) == [plain]
    conn.commit()
