"""The stream's rules (docs/contract.md#ground-rules, #streams), checked through alk.* alone.

Commit ordering under concurrent publishers is proven in
tests/concurrency/test_stream_order.py; this file pins the single-session
rules, the checkpoint rules under interleaved transactions, and the wake-ups.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import pin_clock
from tests.helpers import one, sqlstate_of

NOW = 1_700_000_000
MAX = 2**63 - 1
MIN = -(2**63)
DEADLINE = 30.0
#: A 1024-byte name that does not compress (the longest a stream or consumer may have).
LONGEST = "".join(hashlib.sha512(b"pyalk %d" % i).hexdigest() for i in range(8))


def publish(db: psycopg.Connection, stream: str = "s", payload: str = "{}", key: str | None = None) -> int:
    return one(db, "SELECT alk.publish(%s, %s::jsonb, %s)", stream, payload, key)


def publish_batch(
    db: psycopg.Connection, stream: str, payloads: list[str], keys: list[str | None] | None = None
) -> list[int]:
    rows = db.execute("SELECT * FROM alk.publish_batch(%s, %s::jsonb[], %s::text[])", [stream, payloads, keys])
    return [row[0] for row in rows.fetchall()]


def read_since(db: psycopg.Connection, stream: str, after: int | None, n: int | None) -> list[dict[str, Any]]:
    cur = db.execute("SELECT * FROM alk.read_since(%s, %s::bigint, %s::bigint)", [stream, after, n])
    assert cur.description is not None
    names = [c.name for c in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def offsets(db: psycopg.Connection, stream: str = "s", after: int = MIN, n: int = MAX) -> list[int]:
    return [event["event_offset"] for event in read_since(db, stream, after, n)]


def save(db: psycopg.Connection, at: int | None, stream: str = "s", consumer: str = "c") -> bool:
    return one(db, "SELECT alk.save_offset(%s, %s, %s::bigint)", stream, consumer, at)


def saved(db: psycopg.Connection, stream: str = "s", consumer: str = "c") -> int:
    return one(db, "SELECT alk.get_offset(%s, %s)", stream, consumer)


# offsets -------------------------------------------------------------------


def test_offsets_start_at_1_per_stream_and_events_read_back_whole(db):
    pin_clock(db, NOW)
    assert publish(db, "a", '{"id": 1}') == 1
    assert publish(db, "a", '"two"', key="k2") == 2
    assert publish(db, "b", "null") == 1
    assert publish(db, "a", "[3, {\"x\": null}]") == 3
    assert read_since(db, "a", 0, 10) == [
        {"stream": "a", "event_offset": 1, "key": None, "payload": {"id": 1}, "created_at": NOW},
        {"stream": "a", "event_offset": 2, "key": "k2", "payload": "two", "created_at": NOW},
        {"stream": "a", "event_offset": 3, "key": None, "payload": [3, {"x": None}], "created_at": NOW},
    ]
    assert read_since(db, "b", 0, 10) == [
        {"stream": "b", "event_offset": 1, "key": None, "payload": None, "created_at": NOW}
    ]
    assert read_since(db, "never-published", 0, 10) == []


def test_each_call_stamps_its_own_clock(db):
    pin_clock(db, NOW)
    publish(db)
    pin_clock(db, NOW + 5)
    publish_batch(db, "s", ["1", "2"])
    assert [e["created_at"] for e in read_since(db, "s", 0, 10)] == [NOW, NOW + 5, NOW + 5]


def test_publish_batch_returns_consecutive_offsets_in_input_order(db):
    publish(db, "s", "0")
    ids = publish_batch(db, "s", ['"a"', '"b"', '"c"'], ["ka", None, "kc"])
    assert ids == [2, 3, 4]
    events = read_since(db, "s", 1, 10)
    assert [(e["event_offset"], e["key"], e["payload"]) for e in events] == [
        (2, "ka", "a"),
        (3, None, "b"),
        (4, "kc", "c"),
    ]
    # keys NULL: every key is NULL.
    assert publish_batch(db, "s", ["5", "6"]) == [5, 6]
    assert [e["key"] for e in read_since(db, "s", 4, 10)] == [None, None]


def test_empty_batch_publishes_nothing_and_draws_no_offset(db):
    assert publish_batch(db, "s", []) == []
    assert publish_batch(db, "s", [], []) == []
    assert one(db, "SELECT count(*) FROM alk.streams") == 0
    assert publish(db) == 1


def test_batch_refusals_write_nothing(db):
    publish(db)
    code, message = sqlstate_of(db, "SELECT * FROM alk.publish_batch('s', ARRAY['1', NULL]::jsonb[])")
    assert code == "LK002" and "payload 2" in message
    code, message = sqlstate_of(db, "SELECT * FROM alk.publish_batch('s', NULL::jsonb[])")
    assert code == "LK002" and "payloads" in message
    code, message = sqlstate_of(db, "SELECT * FROM alk.publish_batch('s', ARRAY['1', '2']::jsonb[], ARRAY['k'])")
    assert code == "LK002" and "keys" in message and "2 payloads and 1 keys" in message
    code, message = sqlstate_of(db, "SELECT alk.publish('s', NULL)")
    assert code == "LK002" and "payload" in message
    assert offsets(db) == [1]
    assert publish(db) == 2


def test_json_null_payload_is_a_value_not_sql_null(db):
    assert publish(db, "s", "null") == 1
    assert one(db, "SELECT payload = 'null'::jsonb FROM alk.read_since('s', 0, 1)") is True


def test_rolled_back_publish_leaves_no_gap(connect):
    conn = connect(autocommit=False)
    with conn.transaction():
        publish(conn)
    with conn.transaction():
        assert publish(conn) == 2
        assert publish(conn) == 3
        raise psycopg.Rollback()
    with conn.transaction():
        # The rolled-back offsets were never visible: they are drawn again.
        assert publish(conn) == 2
    assert offsets(conn) == [1, 2]


def test_offsets_are_never_reused_after_a_trim(db):
    assert publish_batch(db, "s", ["1", "2", "3", "4", "5"]) == [1, 2, 3, 4, 5]
    assert one(db, "SELECT alk.trim_to('s', 5)") == 5
    assert offsets(db) == []
    assert publish(db) == 6
    assert one(db, "SELECT alk.trim_to('s', %s::bigint)", MAX) == 1
    assert publish(db) == 7
    assert offsets(db) == [7]


# trim ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("horizon", "left"),
    [(MIN, [1, 2, 3]), (-1, [1, 2, 3]), (0, [1, 2, 3]), (1, [2, 3]), (2, [3]), (3, []), (4, []), (MAX, [])],
)
def test_trim_to_deletes_offsets_at_or_below_any_horizon(db, horizon, left):
    publish_batch(db, "s", ["1", "2", "3"])
    publish(db, "other")
    assert one(db, "SELECT alk.trim_to('s', %s::bigint)", horizon) == 3 - len(left)
    assert offsets(db) == left
    assert offsets(db, "other") == [1]  # other streams are untouched


def test_trim_twice_and_trim_of_unknown_stream_count_zero(db):
    publish_batch(db, "s", ["1", "2"])
    assert one(db, "SELECT alk.trim_to('s', 1)") == 1
    assert one(db, "SELECT alk.trim_to('s', 1)") == 0
    assert one(db, "SELECT alk.trim_to('nobody', %s::bigint)", MAX) == 0
    code, message = sqlstate_of(db, "SELECT alk.trim_to('s', NULL)")
    assert code == "LK002" and "horizon" in message


# read_since: extents and boundaries ---------------------------------------


@pytest.mark.parametrize("n", [0, -1, MIN, None])
def test_read_since_extent_non_positive_reads_nothing(db, n):
    publish_batch(db, "s", ["1", "2", "3"])
    assert read_since(db, "s", 0, n) == []
    assert db.execute("SELECT * FROM alk.read_from_consumer('s', 'c', %s::bigint)", [n]).fetchall() == []


@pytest.mark.parametrize(("n", "expected"), [(1, [1]), (2, [1, 2]), (3, [1, 2, 3]), (4, [1, 2, 3]), (MAX, [1, 2, 3])])
def test_read_since_returns_at_most_n_ascending(db, n, expected):
    publish_batch(db, "s", ["1", "2", "3"])
    assert offsets(db, "s", 0, n) == expected


@pytest.mark.parametrize(
    ("after", "expected"), [(MIN, [1, 2, 3]), (-5, [1, 2, 3]), (0, [1, 2, 3]), (1, [2, 3]), (3, []), (MAX, [])]
)
def test_read_since_after_any_offset(db, after, expected):
    publish_batch(db, "s", ["1", "2", "3"])
    assert offsets(db, "s", after, 10) == expected


def test_read_since_defaults_and_null_offset(db):
    publish_batch(db, "s", [str(i) for i in range(150)])
    assert [r[0] for r in db.execute("SELECT event_offset FROM alk.read_since('s')")] == list(range(1, 101))
    code, message = sqlstate_of(db, "SELECT * FROM alk.read_since('s', NULL, 5)")
    assert code == "LK002" and "after_offset" in message


# checkpoints ---------------------------------------------------------------


def test_get_offset_is_zero_when_absent(db):
    assert saved(db) == 0
    publish(db)
    assert saved(db) == 0


def test_save_offset_is_monotone(db):
    assert save(db, 5) is True
    assert saved(db) == 5
    assert save(db, 5) is False  # at the checkpoint: no-op
    assert save(db, 3) is False  # below: no-op
    assert saved(db) == 5
    assert save(db, 6) is True
    assert saved(db) == 6
    assert save(db, MAX) is True
    assert save(db, MAX) is False
    assert save(db, MIN) is False
    assert saved(db) == MAX


def test_negative_checkpoints_are_stored(db):
    assert save(db, -5) is True
    assert saved(db) == -5
    assert save(db, -7) is False
    assert save(db, -3) is True
    assert saved(db) == -3
    assert save(db, MIN, consumer="lowest") is True
    assert saved(db, consumer="lowest") == MIN
    assert save(db, 0, consumer="zero") is True  # stored, though it reads like "absent"
    assert save(db, 0, consumer="zero") is False
    code, message = sqlstate_of(db, "SELECT alk.save_offset('s', 'c', NULL)")
    assert code == "LK002" and "at_offset" in message
    assert saved(db) == -3


def test_checkpoints_are_per_stream_and_consumer(db):
    save(db, 10, "s", "a")
    save(db, 20, "s", "b")
    save(db, 30, "t", "a")
    assert (saved(db, "s", "a"), saved(db, "s", "b"), saved(db, "t", "a"), saved(db, "t", "b")) == (10, 20, 30, 0)


def test_save_offset_stamps_updated_at_when_it_advances(db):
    pin_clock(db, NOW)
    save(db, 1)
    pin_clock(db, NOW + 9)
    save(db, 0)
    assert one(db, "SELECT updated_at FROM alk.stream_consumers WHERE consumer = 'c'") == NOW
    save(db, 2)
    assert one(db, "SELECT updated_at FROM alk.stream_consumers WHERE consumer = 'c'") == NOW + 9


_consumers = itertools.count()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(min_value=MIN, max_value=MAX) | st.integers(min_value=-3, max_value=3), max_size=12))
def test_checkpoint_is_the_first_save_then_the_running_max(db, values):
    consumer = f"h{next(_consumers)}"
    model: int | None = None
    for value in values:
        advanced = save(db, value, consumer=consumer)
        assert advanced is (model is None or value > model)
        model = value if model is None else max(model, value)
    assert saved(db, consumer=consumer) == (0 if model is None else model)


def run_blocked(conn: psycopg.Connection, query: str, params: list[Any]) -> tuple[threading.Thread, list[Any]]:
    """Run query on conn in a thread; its result (or error) lands in the list."""
    result: list[Any] = []

    def target() -> None:
        try:
            result.append(conn.execute(query, params).fetchone()[0])  # type: ignore[index]
        except BaseException as error:  # surfaced by the caller
            result.append(error)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, result


def wait_until_blocked(db: psycopg.Connection, pid: int) -> None:
    """Poll (with a deadline) until backend pid waits on a lock."""
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        row = db.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()
        if row and row[0] == "Lock":
            return
    raise AssertionError(f"backend {pid} never waited on a lock")


@pytest.mark.parametrize(
    ("first", "second", "outcome", "second_advanced"),
    [
        (10, 7, "commit", False),  # the later, lower save must not move it down
        (7, 10, "commit", True),
        (10, 7, "rollback", True),  # the first never happened
        (10, 10, "commit", False),
    ],
)
def test_interleaved_saves_never_move_a_checkpoint_down(db, connect, first, second, outcome, second_advanced):
    save(db, 1)
    one_tx = connect(autocommit=False)
    other = connect()
    assert save(one_tx, first) is True  # holds the checkpoint row until it ends
    thread, result = run_blocked(other, "SELECT alk.save_offset('s', 'c', %s)", [second])
    wait_until_blocked(db, other.info.backend_pid)
    if outcome == "commit":
        one_tx.commit()
    else:
        one_tx.rollback()
    thread.join(DEADLINE)
    assert result == [second_advanced]
    expected = max(first, second) if outcome == "commit" else second
    assert saved(db) == expected


def test_concurrent_saves_end_at_the_maximum(dsn, db):
    values = [[(t * 7919 + i * 104729) % 1000 - 100 for i in range(60)] for t in range(6)]
    start = threading.Barrier(len(values))
    errors: list[BaseException] = []

    def saver(mine: list[int]) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                start.wait(DEADLINE)
                for value in mine:
                    save(conn, value)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=saver, args=(mine,)) for mine in values]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE)
    assert errors == []
    assert saved(db) == max(max(mine) for mine in values)


def test_read_from_consumer_reads_after_the_checkpoint(db):
    publish_batch(db, "s", ["1", "2", "3", "4"])
    assert [r[0] for r in db.execute("SELECT event_offset FROM alk.read_from_consumer('s', 'c', 10)")] == [1, 2, 3, 4]
    save(db, 2)
    assert [r[0] for r in db.execute("SELECT event_offset FROM alk.read_from_consumer('s', 'c', 1)")] == [3]
    assert [r[0] for r in db.execute("SELECT event_offset FROM alk.read_from_consumer('s', 'c')")] == [3, 4]
    save(db, -9, consumer="neg")
    assert len(db.execute("SELECT * FROM alk.read_from_consumer('s', 'neg', 10)").fetchall()) == 4
    save(db, MAX, consumer="done")
    assert db.execute("SELECT * FROM alk.read_from_consumer('s', 'done', 10)").fetchall() == []


# names ---------------------------------------------------------------------

CALLS_WITH_STREAM = [
    "SELECT alk.publish(%(name)s, '{}')",
    "SELECT * FROM alk.publish_batch(%(name)s, ARRAY['{}']::jsonb[])",
    "SELECT * FROM alk.read_since(%(name)s, 0, 10)",
    "SELECT * FROM alk.read_from_consumer(%(name)s, 'c', 10)",
    "SELECT alk.save_offset(%(name)s, 'c', 1)",
    "SELECT alk.get_offset(%(name)s, 'c')",
    "SELECT alk.trim_to(%(name)s, 1)",
    "SELECT alk.stream_channel(%(name)s)",
]
CALLS_WITH_CONSUMER = [
    "SELECT * FROM alk.read_from_consumer('s', %(name)s, 10)",
    "SELECT alk.save_offset('s', %(name)s, 1)",
    "SELECT alk.get_offset('s', %(name)s)",
]


@pytest.mark.parametrize("query", CALLS_WITH_STREAM)
@pytest.mark.parametrize("name", ["", None, "alk:", "alk:internal"])
def test_every_function_refuses_an_invalid_stream_name(db, query, name):
    code, message = sqlstate_of(db, query.replace("%(name)s", "%s"), name)
    assert code == "LK001" and message.startswith("stream")
    assert one(db, "SELECT count(*) FROM alk.stream_events") == 0


@pytest.mark.parametrize("query", CALLS_WITH_CONSUMER)
@pytest.mark.parametrize("name", ["", None, "alk:x"])
def test_consumer_functions_refuse_an_invalid_consumer_name(db, query, name):
    code, message = sqlstate_of(db, query.replace("%(name)s", "%s"), name)
    assert code == "LK001" and message.startswith("consumer")
    assert one(db, "SELECT count(*) FROM alk.stream_consumers") == 0


def test_names_are_data(db):
    odd = ["x'); DROP TABLE alk.stream_events; --", 'quo"te', "with space", "ünïcødé ✓", "Alk:not-reserved", LONGEST]
    for name in odd:
        assert publish(db, name) == 1
        assert save(db, 1, name, name) is True
        assert offsets(db, name) == [1]
        assert saved(db, name, name) == 1
    assert one(db, "SELECT count(DISTINCT stream) FROM alk.stream_events") == len(odd)


def test_names_are_at_most_1024_bytes(db):
    for too_long in ["x" * 1025, "é" * 513]:  # 1025 and 1026 bytes
        for query in CALLS_WITH_STREAM:
            code, message = sqlstate_of(db, query.replace("%(name)s", "%s"), too_long)
            assert code == "LK001" and "stream must be at most 1024 bytes" in message
        for query in CALLS_WITH_CONSUMER:
            code, message = sqlstate_of(db, query.replace("%(name)s", "%s"), too_long)
            assert code == "LK001" and "consumer must be at most 1024 bytes" in message
    # At the limit, incompressible, as both stream and consumer: every key fits.
    assert len(LONGEST.encode()) == 1024
    assert publish(db, "é" * 512) == 1
    assert save(db, 7, LONGEST, LONGEST[::-1]) is True
    assert saved(db, LONGEST, LONGEST[::-1]) == 7


def test_a_long_name_in_an_error_is_shortened(db):
    code, message = sqlstate_of(db, "SELECT alk.publish(%s, '{}')", "alk:" + "x" * 5000)
    assert code == "LK001" and "5004 characters" in message and len(message) < 300


# wake-ups ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["s", "orders.eu-west", "ünïcødé ✓", LONGEST, "quo\"te"])
def test_stream_channel_is_a_short_hash_of_the_name(db, name):
    channel = one(db, "SELECT alk.stream_channel(%s)", name)
    assert channel == "alk_s_" + hashlib.sha256(name.encode()).hexdigest()[:32]
    assert len(channel.encode()) == 38 <= 63
    db.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel)))  # a valid channel


def collect_until_sentinel(listener: psycopg.Connection, sentinel: str) -> list[str]:
    """Channels of every notification the listener got before the sentinel's.

    Notifications are delivered in commit order, so a NOTIFY on the sentinel
    channel committed last bounds the wait without any sleep."""
    got: list[str] = []
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        for note in listener.notifies(timeout=max(0.0, deadline - time.monotonic())):
            if note.channel == sentinel:
                return got
            got.append(note.channel)
    raise AssertionError(f"the sentinel never arrived; got {got}")


@pytest.fixture
def listen(
    connect: Callable[..., psycopg.Connection], db: psycopg.Connection
) -> Callable[..., Callable[[], list[str]]]:
    """listen(*streams) -> drain(): LISTENs on the streams' channels; drain()
    commits a sentinel NOTIFY and returns what arrived before it."""

    def start(*streams: str) -> Callable[[], list[str]]:
        listener = connect()
        for stream in streams:
            channel = one(db, "SELECT alk.stream_channel(%s)", stream)
            listener.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel)))
        listener.execute("LISTEN test_sentinel")

        def drain() -> list[str]:
            db.execute("NOTIFY test_sentinel")
            return collect_until_sentinel(listener, "test_sentinel")

        return drain

    return start


def channel_of(db: psycopg.Connection, stream: str) -> str:
    return one(db, "SELECT alk.stream_channel(%s)", stream)


def test_publish_notifies_its_streams_channel_at_commit(db, connect, listen):
    drain = listen("s")
    publish(db, "s")
    publish_batch(db, "s", ["1", "2"])
    publish(db, "unheard")
    assert drain() == [channel_of(db, "s")] * 2
    # Inside a transaction: nothing before commit.
    tx = connect(autocommit=False)
    publish(tx, "s")
    assert drain() == []
    tx.commit()
    assert drain() == [channel_of(db, "s")]


def test_a_rolled_back_publish_wakes_nobody(db, connect, listen):
    drain = listen("s")
    tx = connect(autocommit=False)
    publish(tx, "s")
    publish_batch(tx, "s", ["1"])
    tx.rollback()
    assert drain() == []
    assert offsets(db) == []


def test_one_notification_per_stream_per_transaction(db, connect, listen):
    drain = listen("a", "b")
    tx = connect(autocommit=False)
    for _ in range(5):
        publish(tx, "a")
    publish_batch(tx, "a", ["1", "2", "3"])
    publish(tx, "b")
    publish(tx, "b")
    tx.commit()
    assert sorted(drain()) == sorted([channel_of(db, "a"), channel_of(db, "b")])


# the schema ----------------------------------------------------------------

PUBLIC_FUNCTIONS = [
    "alk.publish(text,jsonb,text)",
    "alk.publish_batch(text,jsonb[],text[])",
    "alk.read_since(text,bigint,bigint)",
    "alk.read_from_consumer(text,text,bigint)",
    "alk.save_offset(text,text,bigint)",
    "alk.get_offset(text,text)",
    "alk.trim_to(text,bigint)",
    "alk.stream_channel(text)",
]


@pytest.mark.parametrize("signature", PUBLIC_FUNCTIONS)
def test_public_functions_are_documented_pinned_and_private(db, signature):
    row = db.execute(
        "SELECT obj_description(p.oid, 'pg_proc'), p.prosecdef, p.proconfig,"
        " has_function_privilege('public', p.oid, 'EXECUTE')"
        " FROM pg_proc p WHERE p.oid = %s::regprocedure",
        [signature],
    ).fetchone()
    assert row is not None
    comment, security_definer, config, public_can_execute = row
    assert comment and "Example: SELECT" in comment
    assert security_definer is True
    assert "search_path=pg_catalog, pg_temp" in config
    assert public_can_execute is False


def test_stream_event_type_columns_are_pinned(db):
    columns = db.execute(
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute"
        " WHERE attrelid = 'alk.stream_event'::regclass AND attnum > 0 ORDER BY attnum"
    ).fetchall()
    assert columns == [
        ("stream", "text"),
        ("event_offset", "bigint"),
        ("key", "text"),
        ("payload", "jsonb"),
        ("created_at", "bigint"),
    ]


@pytest.mark.parametrize("table", ["alk.streams", "alk.stream_events", "alk.stream_consumers"])
def test_tables_are_keyed_by_stream_first(db, table):
    first = one(
        db,
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]"
        " WHERE i.indrelid = %s::regclass AND i.indisprimary",
        table,
    )
    assert first == "stream"
