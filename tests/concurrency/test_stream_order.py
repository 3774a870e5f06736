"""Commit order: a reader that has seen offset k never later finds a newly
committed event at or below k, whatever concurrent publishers do.

Real connections in real threads; waits are barriers, events and polling
with deadlines, never sleeps.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

DEADLINE = 60.0
#: Share of the stress test's publisher transactions that roll back.
ROLLBACK_RATE = 0.15


def wait_until_blocked(db: psycopg.Connection, pid: int) -> None:
    """Poll pg_stat_activity, with a deadline, until backend pid waits on a lock."""
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        row = db.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()
        if row and row[0] == "Lock":
            return
    raise AssertionError(f"backend {pid} never waited on a lock")


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Run fn in a thread; its result (or exception) lands in the list."""
    out: list[Any] = []

    def target() -> None:
        try:
            out.append(fn())
        except BaseException as error:  # surfaced by the caller
            out.append(error)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, out


def publish(conn: psycopg.Connection, stream: str, payload: Any = None) -> int:
    row = conn.execute("SELECT alk.publish(%s, %s)", [stream, Jsonb(payload)]).fetchone()
    assert row is not None
    return row[0]


def offsets(conn: psycopg.Connection, stream: str, after: int = 0) -> list[int]:
    rows = conn.execute("SELECT event_offset FROM alk.read_since(%s, %s, 1000000)", [stream, after]).fetchall()
    return [row[0] for row in rows]


def test_a_sequence_is_not_commit_ordered_and_publish_is(db, connect):
    """The failure a bare sequence has, and publish's answer to it, step by step."""
    # The naive design: offsets from an identity column.
    db.execute("CREATE TABLE naive_log (event_offset bigint GENERATED ALWAYS AS IDENTITY, payload int)")
    first, second = connect(autocommit=False), connect(autocommit=False)
    first.execute("INSERT INTO naive_log (payload) VALUES (1)")  # draws offset 1, stays open
    second.execute("INSERT INTO naive_log (payload) VALUES (2)")  # draws offset 2
    second.commit()
    seen = [r[0] for r in db.execute("SELECT event_offset FROM naive_log ORDER BY 1")]
    assert seen == [2]  # a reader has seen offset 2...
    first.commit()
    late = [r[0] for r in db.execute("SELECT event_offset FROM naive_log WHERE event_offset <= 2 ORDER BY 1")]
    assert late == [1, 2]  # ...and now finds offset 1, committed behind its back.

    # alk.publish: the second publisher of the stream waits for the first.
    first, second = connect(autocommit=False), connect(autocommit=False)
    assert publish(first, "s", 1) == 1
    thread, result = in_thread(lambda: publish(second, "s", 2))
    wait_until_blocked(db, second.info.backend_pid)
    assert offsets(db, "s") == []  # nothing visible, and offset 2 not even drawn
    first.commit()
    thread.join(DEADLINE)
    assert result == [2]
    assert offsets(db, "s") == [1]  # the second is not committed yet
    second.commit()
    assert offsets(db, "s") == [1, 2]


def test_a_rolled_back_first_publisher_hands_its_offset_on(db, connect):
    first, second = connect(autocommit=False), connect(autocommit=False)
    assert publish(first, "s") == 1
    thread, result = in_thread(lambda: publish(second, "s"))
    wait_until_blocked(db, second.info.backend_pid)
    first.rollback()
    thread.join(DEADLINE)
    assert result == [1]  # offset 1 was never visible, so it is drawn again
    second.commit()
    assert offsets(db, "s") == [1]


def test_publishers_of_unrelated_streams_do_not_wait(db, connect):
    holder = connect(autocommit=False)
    assert publish(holder, "a") == 1  # holds stream a's head until it ends
    other = connect()
    other.execute("SET statement_timeout = '10s'")  # a wait would fail the test, not hang it
    assert publish(other, "b") == 1
    assert publish(other, "b") == 2
    assert offsets(db, "b") == [1, 2]
    assert offsets(db, "a") == []
    holder.commit()
    assert offsets(db, "a") == [1]


def test_a_repeatable_read_publisher_behind_a_newer_head_must_retry(db, connect):
    """Under REPEATABLE READ (or SERIALIZABLE) a publisher whose snapshot
    predates the stream's last commit gets a serialization failure (40001)
    rather than an offset: retry the transaction, as for any such conflict."""
    publish(db, "s")
    rr = connect(autocommit=False)
    rr.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    assert offsets(rr, "s") == [1]  # the snapshot is taken here
    publish(db, "s")
    with pytest.raises(psycopg.errors.SerializationFailure):
        publish(rr, "s")
    rr.rollback()
    rr.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    assert publish(rr, "s") == 3  # the retry, with a fresh snapshot, goes through
    rr.commit()
    assert offsets(db, "s") == [1, 2, 3]


def test_first_publishes_racing_on_a_new_stream_draw_distinct_offsets(dsn, db):
    n = 12
    start = threading.Barrier(n)
    results: list[Any] = []
    lock = threading.Lock()

    def racer() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                start.wait(DEADLINE)
                got = publish(conn, "fresh")
        except BaseException as error:
            got = error  # type: ignore[assignment]
        with lock:
            results.append(got)

    threads = [threading.Thread(target=racer) for _ in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE)
    assert sorted(results) == list(range(1, n + 1))
    assert offsets(db, "fresh") == list(range(1, n + 1))


class Tail:
    """A reader tailing a stream with read_since in small batches.

    Every batch must continue exactly where the last ended (committed offsets
    are dense and ordered), and every few batches a full re-read of offsets
    1..k must find exactly k events: nothing newly committed at or below k.
    """

    def __init__(self, dsn: str, stream: str, batch: int) -> None:
        self.dsn, self.stream, self.batch = dsn, stream, batch
        self.seen: list[int] = []
        self.payloads: list[tuple[int, int, int]] = []
        self.error: BaseException | None = None
        self.done = threading.Event()  # publishers finished: read to the end, then stop

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                self._run(conn)
        except BaseException as error:
            self.error = error

    def _run(self, conn: psycopg.Connection) -> None:
        last = 0
        reads = 0
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            finished = self.done.is_set()  # read before the batch: a final pass follows it
            rows = conn.execute(
                "SELECT event_offset, payload FROM alk.read_since(%s, %s, %s)", [self.stream, last, self.batch]
            ).fetchall()
            got = [row[0] for row in rows]
            assert got == list(range(last + 1, last + 1 + len(got))), f"after {last} the reader got {got}"
            for offset, payload in rows:
                self.seen.append(offset)
                self.payloads.append((payload["p"], payload["i"], payload["j"]))
            if got:
                last = got[-1]
            reads += 1
            if reads % 5 == 0:
                at_or_below = conn.execute(
                    "SELECT count(*), coalesce(max(event_offset), 0) FROM alk.read_since(%s, 0, %s)",
                    [self.stream, last],
                ).fetchone()
                assert at_or_below == (last, last), f"re-reading 1..{last} found {at_or_below}"
            if finished and not got:
                return
        raise AssertionError(f"reader of {self.stream} timed out at offset {last}")


def test_tailing_readers_see_every_committed_offset_once_in_order(dsn, db):
    """Six publishers in overlapping transactions on two streams: some hold
    their transaction open until other commits happened, some roll back, some
    publish batches; two readers per stream tail with read_since."""
    publishers, transactions = 6, 40
    t_commits = 0
    t_commit_cv = threading.Condition()
    committed: dict[str, list[tuple[int, int, int]]] = {"s": [], "t": []}
    record = threading.Lock()
    errors: list[BaseException] = []
    stop_t = threading.Event()

    def t_only(index: int) -> None:
        """Publishes to t, never to s: never blocked by a holder of s."""
        nonlocal t_commits
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                i = 0
                while not stop_t.is_set():
                    publish(conn, "t", {"p": 100 + index, "i": i, "j": 0})
                    with record:
                        committed["t"].append((100 + index, i, 0))
                    with t_commit_cv:
                        t_commits += 1
                        t_commit_cv.notify_all()
                    i += 1
        except BaseException as error:
            errors.append(error)

    def wait_for_t_commits(k: int) -> None:
        with t_commit_cv:
            target = t_commits + k
            assert t_commit_cv.wait_for(lambda: t_commits >= target or bool(errors), DEADLINE)

    start = threading.Barrier(publishers)

    def publisher(index: int) -> None:
        rng = random.Random(index)
        try:
            with psycopg.connect(dsn) as conn:
                start.wait(DEADLINE)
                for i in range(transactions):
                    mine: dict[str, list[tuple[int, int, int]]] = {"s": [], "t": []}
                    rolled_back = rng.random() < ROLLBACK_RATE
                    with conn.transaction():
                        for j in range(rng.randint(1, 3)):
                            if rng.random() < 0.3:
                                items = [{"p": index, "i": i, "j": 10 * j + k} for k in range(rng.randint(1, 4))]
                                conn.execute("SELECT alk.publish_batch('s', %s::jsonb[])", [[Jsonb(x) for x in items]])
                                mine["s"] += [(x["p"], x["i"], x["j"]) for x in items]
                            else:
                                publish(conn, "s", {"p": index, "i": i, "j": 10 * j})
                                mine["s"].append((index, i, 10 * j))
                        if rng.random() < 0.25:
                            # Hold s open until others committed on t; the
                            # other s publishers queue up behind this one.
                            # (Nobody holds t while this holds s: every
                            # transaction publishes s before t.)
                            wait_for_t_commits(2)
                        if rng.random() < 0.3:  # s before t, always: no lock-order deadlocks
                            publish(conn, "t", {"p": index, "i": i, "j": 99})
                            mine["t"].append((index, i, 99))
                        if rolled_back:
                            raise psycopg.Rollback()
                    if not rolled_back:
                        with record:
                            for stream in mine:
                                committed[stream] += mine[stream]
        except BaseException as error:
            errors.append(error)

    tails = [Tail(dsn, "s", 3), Tail(dsn, "s", 17), Tail(dsn, "t", 5), Tail(dsn, "t", 50)]
    threads = [threading.Thread(target=tail.run) for tail in tails]
    threads += [threading.Thread(target=t_only, args=(k,)) for k in range(2)]
    pubs = [threading.Thread(target=publisher, args=(k,)) for k in range(publishers)]
    for thread in threads + pubs:
        thread.start()
    for thread in pubs:
        thread.join(DEADLINE)
    stop_t.set()
    for thread in threads[len(tails) :]:
        thread.join(DEADLINE)
    for tail in tails:
        tail.done.set()
    for thread in threads[: len(tails)]:
        thread.join(DEADLINE)
    assert errors == []
    for tail in tails:
        assert tail.error is None, f"{tail.stream}/{tail.batch}: {tail.error!r}"
        expected = committed[tail.stream]
        # Every offset exactly once, in order, no gaps.
        assert tail.seen == list(range(1, len(expected) + 1))
        # Exactly the committed events, none of the rolled-back ones.
        assert Counter(tail.payloads) == Counter(expected)
        # Each publisher's events appear in its own commit order.
        for p in {p for p, _, _ in expected}:
            own = [(i, j) for q, i, j in tail.payloads if q == p]
            assert own == sorted(own)
    assert offsets(db, "s") == list(range(1, len(committed["s"]) + 1))
