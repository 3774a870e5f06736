"""The rotation of job storage (sql/queue/15_rotation.sql, docs/design.md
"Job storage"): alk.rotate_jobs moves what lives, keeps what is kept, empties
the slot, never loses a job or revalidates a token, and never waits behind
an old transaction."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

from tests.conftest import pin_clock
from tests.helpers import calls_of, guarded, one, sqlstate_of, until, until_a_second_old


def slot_of(db: psycopg.Connection, job_id: int) -> int:
    return one(db, "SELECT slot FROM alk.jobs WHERE id = %s", job_id)


def current_slot(db: psycopg.Connection) -> int:
    return one(db, "SELECT current_slot FROM alk.job_slots")


def rows(db: psycopg.Connection) -> list[tuple[Any, ...]]:
    """Every job as the functions see it, slot aside."""
    return db.execute("SELECT id, queue, state, payload, attempts, worker_id, claimed_at, claim_expires_at,"
                      " last_error, died_at, dedup_key, result FROM alk.jobs ORDER BY id").fetchall()


def slot_pages(db: psycopg.Connection, slot: int) -> int:
    """Heap and index bytes of one rotating slot."""
    return one(db, "SELECT pg_total_relation_size(%s::regclass)", f"alk.jobs_{slot}")


def settle(db: psycopg.Connection, n: int) -> None:
    """Claim and ack n jobs of queue q."""
    db.execute("SELECT alk.ack_batch(array_agg(id), 'w', array_agg(attempts), 'q') FROM alk.claim('q', 'w', %s)",
               [n])


def locked(db: psycopg.Connection, relation: str, mode: str | None = None) -> bool:
    """Whether this session's transaction holds a lock on ``relation`` (in
    ``mode``, or in any mode)."""
    return bool(one(db, "SELECT count(*) > 0 FROM pg_locks WHERE pid = pg_backend_pid()"
                        " AND relation = %s::regclass AND mode = coalesce(%s, mode)", relation, mode))


def test_a_rotation_moves_live_jobs_keeps_dead_and_completed_and_empties_the_slot(db):
    db.execute("SELECT alk.set_queue_retention('kept', 3600)")
    pending = one(db, "SELECT alk.enqueue('q', '{\"n\": 1}')")
    scheduled = one(db, "SELECT alk.enqueue('q', '{\"n\": 2}', delay => 600)")
    running = one(db, "SELECT id FROM alk.claim('q', 'w', 1)")
    held_token = one(db, "SELECT attempts FROM alk.jobs WHERE id = %s", running)
    dead = one(db, "SELECT alk.enqueue('q', '{\"n\": 3}', max_attempts => 1, priority => 9)")
    assert one(db, "SELECT id FROM alk.claim('q', 'w', 1)") == dead
    assert one(db, "SELECT alk.fail(%s, 'w', 1, 'boom', queue => 'q')", dead) is True
    done = one(db, "SELECT alk.enqueue('kept', '{}')")
    one(db, "SELECT id FROM alk.claim('kept', 'w', 1)")
    assert one(db, "SELECT alk.ack(%s, 'w', 1, 'kept', '{\"r\": 1}')", done) is True
    before = rows(db)
    old = current_slot(db)

    assert one(db, "SELECT alk.rotate_jobs(0)") == "rotated"

    assert current_slot(db) == 1 - old
    assert rows(db) == before  # every job as it was: ids, attempts, leases, errors, results
    assert slot_of(db, pending) == slot_of(db, scheduled) == slot_of(db, running) == 1 - old
    assert slot_of(db, dead) == slot_of(db, done) == 2
    assert one(db, f"SELECT count(*) FROM alk.jobs_{old}") == 0
    # The token the claim returned still holds, in its new slot; a wrong one does not.
    assert one(db, "SELECT alk.heartbeat(%s, 'w', %s, queue => 'q')", running, held_token + 1) is False
    assert one(db, "SELECT alk.heartbeat(%s, 'w', %s, queue => 'q')", running, held_token) is True
    assert one(db, "SELECT alk.ack(%s, 'w', %s, 'q')", running, held_token) is True
    assert one(db, "SELECT alk.get_job('kept', %s)", done) is not None
    assert one(db, "SELECT (alk.get_job('kept', %s)).result", done) == {"r": 1}


def test_a_rotation_gives_the_space_back_while_a_snapshot_is_held(db, connect):
    holder = connect()
    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    holder.execute("SELECT 1")  # a snapshot, and no lock on the jobs
    slot = current_slot(db)
    empty = slot_pages(db, slot)
    db.execute("SELECT alk.enqueue_batch('q', array_fill('{}'::jsonb, ARRAY[5000]))")
    settle(db, 5000)
    db.execute("VACUUM alk.jobs")  # can remove nothing: the holder's snapshot is older
    assert slot_pages(db, slot) > 10 * empty

    assert one(db, "SELECT alk.rotate_jobs(0)") == "rotated"

    assert slot_pages(db, slot) <= 2 * empty
    holder.rollback()


def after_the_drain(db: psycopg.Connection) -> str:
    """alk.rotate_jobs once the switch's drain (2 s of alk.now()) is over: the
    live jobs the claims have not taken then move (0049). The clock is pinned
    past it for this one call."""
    pin_clock(db, one(db, "SELECT rotated_at FROM alk.job_slots") + 2)
    try:
        return str(one(db, "SELECT alk.rotate_jobs()"))
    finally:
        pin_clock(db, None)


def held_for_a_second(db: psycopg.Connection) -> None:
    """Until alk._horizon_held says a snapshot holds dead rows back: the
    holder's transaction is then over a second old (polling the answer, a
    second at most)."""
    until(lambda: one(db, "SELECT alk._horizon_held()") is True, "the holder's transaction a second old")


def test_not_due_until_min_jobs_of_the_slot_are_settled(db):
    db.execute("SELECT alk.enqueue_batch('q', array_fill('{}'::jsonb, ARRAY[10]))")
    assert one(db, "SELECT alk.rotate_jobs(5)") == "not due"  # ten taken, none settled
    settle(db, 4)
    assert one(db, "SELECT alk.rotate_jobs(5)") == "not due"
    settle(db, 1)
    assert one(db, "SELECT alk.rotate_jobs(5)") == "moving"  # five settled, five live: the switch
    assert after_the_drain(db) == "rotated"
    assert one(db, "SELECT moved_in FROM alk.job_slots") == 5
    assert one(db, "SELECT alk.rotate_jobs(1)") == "not due"  # counted from the rotation on
    assert one(db, "SELECT rotations FROM alk.job_slots") == 1


def test_no_more_live_jobs_are_moved_than_settled_ones_cleared(db):
    # A burst's live jobs move under the slot's lock, every claim and settle
    # waiting: a rotation moves them only with as many settled entries.
    db.execute("SELECT alk.enqueue_batch('q', array_fill('{}'::jsonb, ARRAY[30]))")
    settle(db, 10)
    assert one(db, "SELECT alk.rotate_jobs(10)") == "not due"  # 10 settled, 20 live
    settle(db, 4)
    assert one(db, "SELECT alk.rotate_jobs(10)") == "not due"  # 14 settled, 16 live
    settle(db, 1)
    assert one(db, "SELECT alk.rotate_jobs(10)") == "moving"  # 15 and 15: the switch
    assert after_the_drain(db) == "rotated"
    assert one(db, "SELECT moved_in FROM alk.job_slots") == 15


def test_live_jobs_are_left_to_the_claims_for_the_drain(db):
    # 0049: moving a live job costs the slot's lock; a claim takes it for free.
    db.execute("SELECT alk.enqueue_batch('q', array_fill('{}'::jsonb, ARRAY[30]))")
    settle(db, 15)
    old = current_slot(db)
    assert one(db, "SELECT alk.rotate_jobs(10)") == "moving"  # due: 15 settled, 15 live
    assert current_slot(db) == 1 - old  # new jobs go to the other slot at once
    assert one(db, "SELECT draining_slot FROM alk.job_slots") == old
    assert one(db, "SELECT moved_in FROM alk.job_slots") == 0  # none moved
    assert one(db, f"SELECT count(*) FROM alk.jobs_{old} WHERE state = 'pending'") == 15
    newer = one(db, "SELECT alk.enqueue('q', '{}')")
    assert slot_of(db, newer) == 1 - old
    with db.transaction():  # within the drain: an answer, no lock, nothing moved
        assert one(db, "SELECT alk.rotate_jobs(10)") == "moving"
        assert not locked(db, f"alk.jobs_{old}")
    settle(db, 16)  # the claims take the old slot's jobs first (the oldest), then the newer one
    assert one(db, "SELECT count(*) FROM alk.jobs") == 0
    assert after_the_drain(db) == "rotated"
    assert one(db, "SELECT moved_in FROM alk.job_slots") == 0  # nothing was left to move
    assert one(db, "SELECT draining_slot FROM alk.job_slots") is None
    assert one(db, "SELECT rotations FROM alk.job_slots") == 1


def test_what_the_claims_left_moves_after_the_drain_with_every_token(db):
    db.execute("SELECT alk.enqueue_batch('q', array_fill('{}'::jsonb, ARRAY[30]))")
    settle(db, 15)
    running = one(db, "SELECT id FROM alk.claim('q', 'w', 1)")
    old = current_slot(db)
    assert one(db, "SELECT alk.rotate_jobs(10)") == "moving"
    assert after_the_drain(db) == "rotated"
    assert one(db, "SELECT moved_in FROM alk.job_slots") == 15  # 14 pending and the running one
    assert one(db, f"SELECT count(*) FROM alk.jobs_{1 - old}") == 15
    assert one(db, "SELECT alk.heartbeat(%s, 'w', 2, queue => 'q')", running) is False
    assert one(db, "SELECT alk.ack(%s, 'w', 1, 'q')", running) is True


def test_min_jobs_0_ends_a_drain_now(db):
    db.execute("SELECT alk.enqueue_batch('q', array_fill('{}'::jsonb, ARRAY[30]))")
    settle(db, 15)
    assert one(db, "SELECT alk.rotate_jobs(10)") == "moving"
    assert one(db, "SELECT alk.rotate_jobs(0)") == "rotated"  # asked for now: no drain
    assert one(db, "SELECT moved_in FROM alk.job_slots") == 15


def test_under_a_held_snapshot_the_live_jobs_move_at_once(db, connect):
    # Nothing clears the old slot's settled entries then, and every claim
    # walks them: moving the live jobs at once is the cheaper way (0049).
    holder = connect()
    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    holder.execute("SELECT 1")
    db.execute("SELECT alk.enqueue_batch('q', array_fill('{}'::jsonb, ARRAY[30]))")
    settle(db, 15)
    held_for_a_second(db)
    assert one(db, "SELECT alk.rotate_jobs(10)") == "rotated"
    assert one(db, "SELECT moved_in FROM alk.job_slots") == 15
    holder.rollback()


def test_a_drain_ends_once_a_snapshot_is_held(db, connect):
    db.execute("SELECT alk.enqueue_batch('q', array_fill('{}'::jsonb, ARRAY[30]))")
    settle(db, 15)
    assert one(db, "SELECT alk.rotate_jobs(10)") == "moving"  # no snapshot held: left to drain
    holder = connect()
    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    holder.execute("SELECT 1")
    held_for_a_second(db)
    assert one(db, "SELECT alk.rotate_jobs(10)") == "rotated"  # within the drain, yet moved now
    assert one(db, "SELECT moved_in FROM alk.job_slots") == 15
    holder.rollback()


def test_what_holds_dead_rows_back(db, connect):
    assert one(db, "SELECT alk._horizon_held()") is False
    # A snapshot in this database, once its transaction is a second old.
    holder = connect()
    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    holder.execute("SELECT 1")
    held_for_a_second(db)
    holder.rollback()
    assert one(db, "SELECT alk._horizon_held()") is False
    # An open transaction with an id, idle between its statements.
    writer = connect()
    writer.execute("BEGIN")
    writer.execute("SELECT pg_current_xact_id()")
    held_for_a_second(db)
    writer.rollback()
    assert one(db, "SELECT alk._horizon_held()") is False


def test_a_snapshot_in_another_database_holds_nothing_here(db, connect, second_dsn):
    other = psycopg.connect(second_dsn, autocommit=True)
    try:
        other.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        other.execute("SELECT 1")
        until_a_second_old(db, other, "the other database's transaction a second old")
        assert one(db, "SELECT alk._horizon_held()") is False
    finally:
        other.close()


def test_min_jobs_0_rotates_now(db):
    db.execute("SELECT alk.enqueue_batch('q', array_fill('{}'::jsonb, ARRAY[10]))")
    assert one(db, "SELECT alk.rotate_jobs(0)") == "rotated"  # all ten live
    assert one(db, "SELECT moved_in FROM alk.job_slots") == 10


@pytest.mark.parametrize("bad", [-1, None])
def test_min_jobs_must_be_a_count(db, bad):
    code, message = sqlstate_of(db, "SELECT alk.rotate_jobs(%s::bigint)", bad)
    assert code == "LK002" and "min_jobs" in message


def test_an_old_transaction_on_the_jobs_makes_it_return_at_once_and_block_nobody(db, connect):
    reader = connect()
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM alk.jobs")  # a pg_dump-like reader: ACCESS SHARE on every slot
    until_a_second_old(db, reader, "the reader a second old")  # the rule is about the holder's age
    started = time.monotonic()
    assert one(db, "SELECT alk.rotate_jobs(0)") == "locked"
    assert time.monotonic() - started < 0.05  # no wait behind an old holder
    assert one(db, "SELECT alk.enqueue('q', '{}')") > 0  # and nothing waits behind the rotation
    reader.rollback()
    assert one(db, "SELECT alk.rotate_jobs(0)") == "rotated"


def test_a_vacuum_of_the_slot_makes_it_return_at_once_and_block_nobody(db, connect):
    # VACUUM and ANALYZE (autovacuum's too) hold SHARE UPDATE EXCLUSIVE on the
    # slot for as long as they run, and autovacuum yields to a waiting lock
    # only after deadlock_timeout: a young transaction holding that mode
    # stands in for them.
    vacuum = connect()
    vacuum.execute("BEGIN")
    vacuum.execute(f"LOCK TABLE alk.jobs_{current_slot(db)} IN SHARE UPDATE EXCLUSIVE MODE")
    started = time.monotonic()
    assert one(db, "SELECT alk.rotate_jobs(0)") == "locked"
    assert time.monotonic() - started < 0.09  # not its 100 ms wait
    vacuum.rollback()
    assert one(db, "SELECT alk.rotate_jobs(0)") == "rotated"


def test_a_young_transaction_is_waited_for_briefly(db, connect):
    worker = connect()
    worker.execute("BEGIN")
    worker.execute("SELECT alk.enqueue('q', '{}')")
    started = time.monotonic()
    assert one(db, "SELECT alk.rotate_jobs(0)") == "locked"  # it stays open past the wait
    waited = time.monotonic() - started
    assert 0.08 <= waited < 1.0
    worker.commit()


def test_a_held_snapshot_blocks_no_rotation(db, connect):
    holder = connect()
    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    holder.execute("SELECT 1")
    db.execute("SELECT alk.enqueue('q', '{}')")
    started = time.monotonic()
    assert one(db, "SELECT alk.rotate_jobs(0)") == "rotated"
    assert time.monotonic() - started < 0.1
    holder.rollback()


#: The longest a statement on the jobs waits behind a rotation (docs/design.md,
#: "Job storage", "Getting the lock"): the rotation's lock wait (at most
#: 100 ms) plus its hold (one step: at most 20,000 rows moved, then a TRUNCATE).
BLOCKED_AT_MOST = 1.0


@pytest.mark.parametrize("reads_jobs", [False, True], ids=["snapshot", "snapshot-that-read-the-jobs"])
def test_under_a_held_snapshot_rotations_hold_up_work_at_most_the_bound(dsn, connect, reads_jobs):
    """Producers and claimers that ack on real connections, timing each
    statement, while a REPEATABLE READ snapshot is held and a rotator calls
    alk.rotate_jobs(0) again and again. A snapshot that never read the jobs
    holds no lock: every rotation goes through. One that read them holds
    every slot: each rotation answers 'locked', after at most its 100 ms
    wait while the holder is young and at once after. Either way no
    statement waits longer than the bound."""
    holder = connect()
    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    holder.execute("SELECT count(*) FROM alk.jobs" if reads_jobs else "SELECT 1")
    stop = threading.Event()
    errors: list[BaseException] = []
    waits: list[float] = []
    answers: list[str] = []

    def timed(conn: psycopg.Connection, query: str) -> None:
        started = time.monotonic()
        conn.execute(query)
        waits.append(time.monotonic() - started)

    def work(conn: psycopg.Connection) -> None:
        while not stop.is_set():
            timed(conn, "SELECT alk.enqueue_batch('q', array_fill('{}'::jsonb, ARRAY[10]))")
            timed(conn, "SELECT alk.ack_batch(array_agg(id), 'w', array_agg(attempts), 'q')"
                        " FROM alk.claim('q', 'w', 10)")

    workers = [guarded(dsn, errors, work) for _ in range(2)]
    for thread in workers:
        thread.start()
    rotator = connect()
    try:
        # Past the holder's first second (a reader's case crosses the old-holder rule), and
        # until ten calls answered (ten rotated, when nothing holds the slots).
        past_a_second = time.monotonic() + 1.5
        give_up = time.monotonic() + 60
        while time.monotonic() < give_up and (
                time.monotonic() < past_a_second
                or (len(answers) if reads_jobs else answers.count("rotated")) < 10):
            answers.append(one(rotator, "SELECT alk.rotate_jobs(0)"))
    finally:
        stop.set()
        for thread in workers:
            thread.join(30)
    holder.rollback()
    assert not errors, errors
    assert len(waits) > 100, len(waits)  # the work went on meanwhile
    print(f"rotations {answers.count('rotated')} of {len(answers)}; statements {len(waits)},"
          f" longest {max(waits) * 1000:.1f} ms")  # the figure docs/design.md gives
    assert max(waits) < BLOCKED_AT_MOST, sorted(waits)[-5:]
    if reads_jobs:
        assert set(answers) == {"locked"}, answers
    else:
        assert answers.count("rotated") >= 10, answers


def test_a_dedup_key_stays_unique_across_a_rotation(db):
    first = one(db, "SELECT alk.enqueue('q', '{}', dedup_key => 'k')")
    assert one(db, "SELECT alk.rotate_jobs(0)") == "rotated"
    assert one(db, "SELECT alk.enqueue('q', '{}', dedup_key => 'k')") == first
    assert one(db, "SELECT count(*) FROM alk.jobs WHERE dedup_key = 'k'") == 1


def test_a_keyed_enqueue_in_flight_holds_off_the_rotation(db, connect):
    producer = connect()
    producer.execute("BEGIN")
    producer.execute("SELECT alk.enqueue('q', '{}', dedup_key => 'k')")
    assert one(db, "SELECT alk.rotate_jobs(0)") == "locked"  # the shared advisory lock, at once
    producer.commit()
    assert one(db, "SELECT alk.rotate_jobs(0)") == "rotated"
    assert one(db, "SELECT alk.enqueue('q', '{}', dedup_key => 'k')") == one(
        db, "SELECT id FROM alk.jobs WHERE dedup_key = 'k'")


def test_requeued_dead_jobs_come_back_to_the_current_slot_and_run(db):
    dead = one(db, "SELECT alk.enqueue('q', '{}', max_attempts => 1, dedup_key => 'k')")
    one(db, "SELECT id FROM alk.claim('q', 'w', 1)")
    assert one(db, "SELECT alk.fail(%s, 'w', 1, 'boom', queue => 'q')", dead) is True
    assert one(db, "SELECT alk.rotate_jobs(0)") == "rotated"
    assert slot_of(db, dead) == 2
    assert one(db, "SELECT alk.requeue_dead('q')") == 1
    assert slot_of(db, dead) == current_slot(db)
    assert one(db, "SELECT alk.enqueue('q', '{}', dedup_key => 'k')") == dead  # the key is held again
    assert one(db, "SELECT id FROM alk.claim('q', 'w', 1)") == dead


def test_a_backlog_over_a_step_is_moved_in_steps(db):
    # 0044: until then a slot of over 20,000 live jobs never rotated.
    db.execute("SELECT alk.enqueue_batch('q', array_fill('{}'::jsonb, ARRAY[20001]))")
    old = current_slot(db)
    assert one(db, "SELECT alk.rotate_jobs(0)") == "moving"
    assert current_slot(db) == 1 - old  # new jobs go to the other slot at once
    assert one(db, "SELECT draining_slot FROM alk.job_slots") == old
    assert one(db, f"SELECT count(*) FROM alk.jobs_{old}") == 1
    assert one(db, "SELECT alk.rotate_jobs(0)") == "rotated"
    assert one(db, "SELECT draining_slot FROM alk.job_slots") is None
    assert one(db, f"SELECT count(*) FROM alk.jobs_{1 - old}") == 20001
    assert one(db, "SELECT moved_in FROM alk.job_slots") == 20001
    assert one(db, "SELECT rotations FROM alk.job_slots") == 1


def rotate_in_steps(db: psycopg.Connection, min_jobs: int = 0, step: int = 4, max_live: int = 1000) -> str:
    """alk.rotate_jobs with small bounds (alk._rotate_jobs): a step of at
    most ``step`` rows, counts of at most ``max_live`` live jobs."""
    return str(one(db, "SELECT alk._rotate_jobs(%s, %s, %s, 0)", min_jobs, step, max_live))


def test_while_a_slot_is_emptied_in_steps_every_job_and_token_holds(db):
    db.execute("SELECT alk.set_queue_retention('kept', 3600)")
    dead = one(db, "SELECT alk.enqueue('q', '{}', max_attempts => 1, priority => 9)")
    assert one(db, "SELECT id FROM alk.claim('q', 'w', 1)") == dead
    assert one(db, "SELECT alk.fail(%s, 'w', 1, 'boom', queue => 'q')", dead) is True
    done = one(db, "SELECT alk.enqueue('kept', '{}')")
    one(db, "SELECT id FROM alk.claim('kept', 'w', 1)")
    assert one(db, "SELECT alk.ack(%s, 'w', 1, 'kept')", done) is True
    keyed = one(db, "SELECT alk.enqueue('q', '{}', dedup_key => 'k')")
    db.execute("SELECT alk.enqueue_batch('q', array_fill('{}'::jsonb, ARRAY[10]))")
    running, token = db.execute("SELECT id, attempts FROM alk.claim('q', 'w', 1)").fetchone() or (None, None)
    before = rows(db)
    old = current_slot(db)

    assert rotate_in_steps(db) == "moving"

    assert rows(db) == before  # every job as it was, wherever it sits
    assert slot_of(db, keyed) == 1 - old  # a key's live holder is where keyed enqueues look
    assert one(db, "SELECT alk.enqueue('q', '{}', dedup_key => 'k')") == keyed
    fresh = one(db, "SELECT alk.enqueue('q', '{}')")
    assert slot_of(db, fresh) == 1 - old
    # Jobs still in the slot being emptied are claimed, acked and requeued as ever.
    assert one(db, "SELECT alk.heartbeat(%s, 'w', %s, queue => 'q')", running, token + 1) is False
    assert one(db, "SELECT alk.heartbeat(%s, 'w', %s, queue => 'q')", running, token) is True
    assert one(db, "SELECT alk.requeue_dead('q', ARRAY[%s::bigint])", dead) == 1
    assert slot_of(db, dead) == 1 - old
    steps = 1
    while (answer := rotate_in_steps(db)) == "moving":
        steps += 1
    assert answer == "rotated" and steps >= 3
    assert one(db, f"SELECT count(*) FROM alk.jobs_{old}") == 0
    assert slot_of(db, done) == 2
    assert one(db, "SELECT alk.ack(%s, 'w', %s, 'q')", running, token) is True
    claimed = {r[0] for r in db.execute("SELECT id FROM alk.claim('q', 'w', 100)")}
    assert claimed == {j[0] for j in before if j[1] == 'q' and j[2] == 'pending'} | {fresh, dead}
    assert one(db, "SELECT rotations FROM alk.job_slots") == 1


def test_a_slot_emptied_in_steps_gives_the_space_back_while_a_snapshot_is_held(db, connect):
    holder = connect()
    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    holder.execute("SELECT 1")
    slot = current_slot(db)
    empty = slot_pages(db, slot)
    db.execute("SELECT alk.enqueue_batch('q', array_fill('{}'::jsonb, ARRAY[6000]))")
    settle(db, 4000)
    db.execute("VACUUM alk.jobs")  # can remove nothing: the holder's snapshot is older
    assert slot_pages(db, slot) > 10 * empty
    answers = [rotate_in_steps(db, min_jobs=1000, step=1000, max_live=5000)]
    while answers[-1] == "moving":
        answers.append(rotate_in_steps(db, min_jobs=1000, step=1000, max_live=5000))
    assert answers == ["moving", "moving", "rotated"]  # 2,000 live jobs, 1,000 a step
    assert slot_pages(db, slot) <= 2 * empty
    holder.rollback()


def test_above_a_step_twice_as_many_settled_as_live_are_needed(db):
    # A burst's live jobs move only late, as they did before steps (0044).
    db.execute("SELECT alk.enqueue_batch('q', array_fill('{}'::jsonb, ARRAY[30]))")
    settle(db, 19)
    assert rotate_in_steps(db, min_jobs=1) == "too many live jobs"  # 11 live over a step of 4: 19 < 22
    settle(db, 1)
    assert rotate_in_steps(db, min_jobs=1) == "moving"  # 10 live, 20 settled
    assert rotate_in_steps(db, min_jobs=1) == "moving"
    assert rotate_in_steps(db, min_jobs=1) == "rotated"
    assert one(db, "SELECT moved_in FROM alk.job_slots") == 10
    # Within a step, no more live than settled is enough.
    settle(db, 4)
    assert rotate_in_steps(db, min_jobs=1, step=10) == "not due"  # 6 live, 4 settled
    settle(db, 1)
    assert rotate_in_steps(db, min_jobs=1, step=10) == "rotated"  # 5 and 5


def test_under_a_held_snapshot_no_more_live_than_settled_is_enough_above_a_step(db, connect):
    # Every claim walks every settled entry then, so waiting for twice as
    # many costs more than the moves it saves (0050).
    db.execute("SELECT alk.enqueue_batch('q', array_fill('{}'::jsonb, ARRAY[30]))")
    settle(db, 15)
    assert rotate_in_steps(db, min_jobs=1) == "too many live jobs"  # 15 live over a step of 4: 15 < 30
    holder = connect()
    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    holder.execute("SELECT 1")
    held_for_a_second(db)
    answers = [rotate_in_steps(db, min_jobs=1)]
    while answers[-1] == "moving":
        answers.append(rotate_in_steps(db, min_jobs=1))
    assert answers == ["moving"] * 3 + ["rotated"]  # 15 live rows, 4 a step: the fourth call finds three
    assert one(db, "SELECT moved_in FROM alk.job_slots") == 15
    holder.rollback()
    # Released, twice as many again.
    settle(db, 14)  # 15 live jobs moved in, 14 settled: 1 live
    db.execute("SELECT alk.enqueue_batch('q', array_fill('{}'::jsonb, ARRAY[20]))")
    settle(db, 6)  # 35 entries: 15 live, 20 settled
    assert rotate_in_steps(db, min_jobs=1) == "too many live jobs"


def test_a_backlog_not_yet_due_or_too_big_to_count_answers_without_the_lock(db, connect):
    db.execute("SELECT alk.enqueue_batch('q', array_fill('{}'::jsonb, ARRAY[30]))")
    settle(db, 10)
    worker = connect()
    worker.execute("BEGIN")
    worker.execute("SELECT alk.enqueue('q', '{}')")  # it holds the slot: asking for the lock answers 'locked'
    with db.transaction():
        # 20 live, 10 settled: not due; over a step of 4, so said as a backlog.
        assert rotate_in_steps(db, min_jobs=5) == "too many live jobs"
        assert rotate_in_steps(db, min_jobs=5, step=50) == "not due"
        assert rotate_in_steps(db, min_jobs=0, max_live=15) == "too many live jobs"  # over max_live: not counted
        assert rotate_in_steps(db, min_jobs=0, max_live=25) == "locked"  # due: it asked for the lock
        assert not locked(db, f"alk.jobs_{current_slot(db)}", "AccessExclusiveLock")
    worker.commit()


def test_more_keyed_live_jobs_than_a_step_wait_for_their_backlog(db):
    db.execute("SELECT alk.enqueue_batch('q', array_fill('{}'::jsonb, ARRAY[5]),"
               " dedup_keys => ARRAY['a', 'b', 'c', 'd', 'e'])")
    assert rotate_in_steps(db) == "too many live jobs"  # five keyed jobs would move at once
    settle(db, 1)
    assert rotate_in_steps(db) == "rotated"


def test_the_jobs_a_rotation_moved_in_count_once_settled(db):
    db.execute("SELECT alk.enqueue_batch('q', array_fill('{}'::jsonb, ARRAY[300]))")
    assert one(db, "SELECT alk.rotate_jobs(0)") == "rotated"
    assert one(db, "SELECT moved_in FROM alk.job_slots") == 300
    # No new id: only the moved jobs count, and only once settled.
    assert one(db, "SELECT alk.rotate_jobs(100)") == "not due"
    settle(db, 99)
    assert one(db, "SELECT alk.rotate_jobs(100)") == "not due"
    settle(db, 1)
    assert one(db, "SELECT alk.rotate_jobs(100)") == "not due"  # 100 settled, but 200 live
    settle(db, 50)
    assert one(db, "SELECT alk.rotate_jobs(100)") == "moving"
    assert after_the_drain(db) == "rotated"
    assert one(db, "SELECT moved_in FROM alk.job_slots") == 150


def test_a_drained_slot_is_due_at_a_tenth_of_min_jobs(db):
    db.execute("SELECT alk.enqueue_batch('q', array_fill('{}'::jsonb, ARRAY[100]))")
    assert one(db, "SELECT alk.rotate_jobs(0)") == "rotated"
    settle(db, 99)
    assert one(db, "SELECT alk.rotate_jobs(991)") == "not due"  # one live job: min_jobs settled needed
    settle(db, 1)
    assert one(db, "SELECT alk.rotate_jobs(1001)") == "not due"  # a tenth of 1001, rounded up, is 101
    assert one(db, "SELECT alk.rotate_jobs(1000)") == "rotated"  # none live: 100 settled is a tenth
    assert one(db, "SELECT moved_in FROM alk.job_slots") == 0
    assert one(db, "SELECT alk.rotate_jobs(1)") == "not due"  # an empty slot took nothing since


def test_live_moved_jobs_answer_without_the_lock(db):
    db.execute("SELECT alk.enqueue_batch('q', array_fill('{}'::jsonb, ARRAY[500]))")
    assert one(db, "SELECT alk.rotate_jobs(0)") == "rotated"
    with db.transaction():
        assert one(db, "SELECT alk.rotate_jobs(100)") == "not due"  # 500 moved in, all live
        assert not locked(db, f"alk.jobs_{current_slot(db)}", "AccessExclusiveLock")


@pytest.mark.parametrize("rotation", [
    "SELECT alk.rotate_jobs(0)",
    "SELECT alk._rotate_jobs(0, 7, 100000, 0)",  # slots emptied 7 rows a call
], ids=["whole", "in_steps"])
def test_concurrent_work_and_rotations_lose_nothing_and_run_nothing_twice(dsn, connect, rotation):
    """Producers, claimers that ack, retry or let leases lapse, and a rotator,
    all at once on real connections: every job ends acked exactly once per
    valid claim, and no token is ever honoured twice."""
    setup = connect()
    setup.execute("CREATE TABLE public.acked (job_id bigint, attempt bigint)")
    stop = threading.Event()
    errors: list[BaseException] = []
    enqueued: list[int] = []
    rotations: list[str] = []

    def produce(conn: psycopg.Connection) -> None:
        for n in range(60):
            enqueued.extend(r[0] for r in conn.execute(
                "SELECT alk.enqueue_batch('q', array_fill('{}'::jsonb, ARRAY[25]), visibility_timeout_s => 1,"
                " max_attempts => 1000)"))
            if n % 10 == 0:
                enqueued.append(one(conn, "SELECT alk.enqueue('q', '{}', dedup_key => %s, visibility_timeout_s => 1,"
                                        " max_attempts => 1000)", f"k{n}"))

    def work(conn: psycopg.Connection) -> None:
        turn = 0
        while not stop.is_set():
            turn += 1
            claimed = conn.execute("SELECT id, attempts FROM alk.claim('q', 'w', 10)").fetchall()
            for job_id, attempt in claimed:
                if turn % 7 == 0:
                    conn.execute("SELECT alk.retry(%s, 'w', %s, 'again', 0, queue => 'q')", [job_id, attempt])
                elif turn % 11 == 0:
                    continue  # left to its lease: claimed again later, at a new attempt
                else:
                    with conn.transaction():
                        if one(conn, "SELECT alk.ack(%s, 'w', %s, 'q')", job_id, attempt):
                            conn.execute("INSERT INTO public.acked VALUES (%s, %s)", [job_id, attempt])

    def rotate(conn: psycopg.Connection) -> None:
        while not stop.is_set():
            rotations.append(one(conn, rotation))

    producers = [guarded(dsn, errors, produce) for _ in range(2)]
    others = [guarded(dsn, errors, work) for _ in range(3)] + [guarded(dsn, errors, rotate)]
    for thread in producers + others:
        thread.start()
    for thread in producers:
        thread.join(120)
    deadline = time.monotonic() + 120
    while one(setup, "SELECT count(*) FROM alk.jobs WHERE state IN ('pending', 'processing')") and not errors:
        assert time.monotonic() < deadline, ("jobs left undone", setup.execute(
            "SELECT id, state, slot, attempts, run_at - alk.now(), claim_expires_at - alk.now(), worker_id"
            " FROM alk.jobs WHERE state IN ('pending', 'processing') LIMIT 5").fetchall(), rotations[-5:])
        setup.execute("SELECT pg_sleep(0.05)")  # polling the database for the end, not synchronising
    stop.set()
    for thread in others:
        thread.join(60)
    assert not errors, errors
    acked = setup.execute("SELECT job_id, count(*) FROM public.acked GROUP BY job_id").fetchall()
    assert sorted(job_id for job_id, _ in acked) == sorted(set(enqueued))
    assert all(times == 1 for _, times in acked)
    assert one(setup, "SELECT count(*) FROM alk.jobs") == 0
    assert rotations.count("rotated") >= 3, rotations[-20:]
    if "_rotate_jobs" in rotation:
        assert "moving" in rotations, rotations[-20:]


def kept_slot_locked(db: psycopg.Connection) -> bool:
    """Whether this session's transaction has touched alk.jobs_kept at all."""
    return locked(db, "alk.jobs_kept")


def test_the_live_job_paths_leave_the_kept_slot_out(db):
    # Something kept, so a plan that visited the kept slot would have rows to read there.
    dead = one(db, "SELECT alk.enqueue('old', '{}', max_attempts => 1)")
    one(db, "SELECT id FROM alk.claim('old', 'w', 1)")
    assert one(db, "SELECT alk.fail(%s, 'w', 1, queue => 'old')", dead) is True
    assert one(db, "SELECT alk.rotate_jobs(0)") == "rotated"
    assert slot_of(db, dead) == 2
    db.execute("SELECT alk.set_queue_limits('lim', max_running => 5)")
    db.execute("SELECT alk.enqueue_batch('lim', array_fill('{}'::jsonb, ARRAY[8]))")
    db.execute("SELECT alk.enqueue_batch('q', array_fill('{}'::jsonb, ARRAY[8]))")
    def held(queue: str) -> tuple[int, int]:
        """A processing job of queue and its token, read outside the step's transaction."""
        found = db.execute("SELECT id, attempts FROM alk.jobs WHERE queue = %s AND state = 'processing'"
                           " ORDER BY id LIMIT 1", [queue]).fetchone()
        assert found is not None
        return found[0], found[1]

    # (statement, the queue of the processing job whose id and token it takes, if any)
    steps: list[tuple[str, str | None]] = [
        ("SELECT alk.enqueue('q', '{}', dedup_key => 'k')", None),
        ("SELECT alk.enqueue('q', '{}', dedup_key => 'k')", None),  # held: the dedup lookup
        ("SELECT alk.enqueue('g', '{}', group_key => 'a'), alk.enqueue('g', '{}', group_key => 'a')", None),
        ("SELECT alk.next_claim_at('q')", None),
        ("SELECT count(*) FROM alk.claim('q', 'w', 6)", None),
        ("SELECT count(*) FROM alk.claim('lim', 'w', 2)", None),
        ("SELECT count(*) FROM alk.claim('g', 'w', 1)", None),
        ("SELECT alk.heartbeat(%s, 'w', %s)", "q"),
        ("SELECT alk.ack(%s, 'w', %s)", "q"),
        ("SELECT alk.ack_batch(ARRAY[%s::bigint], 'w', ARRAY[%s::bigint])", "q"),
        ("SELECT alk.retry(%s, 'w', %s)", "q"),
        ("SELECT alk.snooze(%s, 'w', %s, 60)", "q"),
        ("SELECT alk.release_jobs(ARRAY[%s::bigint], 'w', ARRAY[%s::bigint])", "q"),
        ("SELECT alk.ack(%s, 'w', %s)", "lim"),
        ("SELECT alk.ack(%s, 'w', %s)", "g"),
        ("SELECT count(*) FROM alk.settle_and_claim('lim', 'w', 1, ARRAY[%s::bigint], ARRAY[%s::bigint])", "lim"),
        ("SELECT alk.cancel('q', %s) WHERE %s > 0", "q"),
    ]
    touched = []
    for sql, queue in steps:
        params = list(held(queue)) if queue else []
        with db.transaction():
            db.execute(sql, params)
            db.execute("SET CONSTRAINTS ALL IMMEDIATE")  # the commit-time work (a group's parking) too
            if kept_slot_locked(db):
                touched.append(sql)
    assert touched == []
    # The lookups that may find dead or completed jobs still read the kept slot.
    with db.transaction():
        assert one(db, "SELECT (alk.get_job('old', %s)).state", dead) == "dead"
        assert kept_slot_locked(db)


def test_the_kept_slot_refuses_live_jobs(db):
    job = one(db, "SELECT alk.enqueue('q', '{}')")
    with pytest.raises(psycopg.errors.CheckViolation, match="jobs_kept_settled"):
        db.execute("UPDATE alk.jobs SET slot = 2 WHERE id = %s", [job])
    assert slot_of(db, job) == current_slot(db)


def test_an_insert_into_job_slots_replaces_its_one_row(db):
    # What a restore of the extension install does: CREATE EXTENSION wrote
    # the row, pg_restore copies the dumped one (tests/extension).
    db.execute("INSERT INTO alk.job_slots (current_slot, rotated_at_id, rotations, draining_slot) VALUES (1, 40, 3, 0)")
    assert db.execute("SELECT current_slot, rotated_at_id, rotations, draining_slot FROM alk.job_slots").fetchall() \
        == [(1, 40, 3, 0)]


def slot_counts(db: psycopg.Connection) -> int:
    """How many times this backend counted a slot's live jobs (alk._slot_live)."""
    return calls_of(db, "alk._slot_live(bigint, bigint, boolean)")


def test_a_backlog_over_max_live_is_counted_once_the_statistics_say_it_may_be_due(db):
    # 0048: a slot that could be due only with more than max_live live jobs
    # (here 10) never was. Now the statistics decide whether to count.
    db.execute("SET track_functions = 'all'")
    db.execute("SELECT alk.enqueue_batch('q', array_fill('{}'::jsonb, ARRAY[60]))")
    settle(db, 30)  # 30 live: due at 20 (twice as many settled as live above a step of 4)
    before = slot_counts(db)
    assert rotate_in_steps(db, min_jobs=1, max_live=10) == "too many live jobs"
    assert slot_counts(db) == before  # the statistics said 30 live tuples: no pass over the slot
    settle(db, 10)  # 20 live, 40 settled
    before = slot_counts(db)
    answers = [rotate_in_steps(db, min_jobs=1, max_live=10)]
    while answers[-1] == "moving":
        answers.append(rotate_in_steps(db, min_jobs=1, max_live=10))
    assert answers[-1] == "rotated" and len(answers) == 6  # 20 live rows, 4 a step: the sixth call finds none
    assert slot_counts(db) - before == 2  # its live jobs and its keyed ones, counted once
    assert one(db, "SELECT moved_in FROM alk.job_slots") == 20
