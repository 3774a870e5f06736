"""The wrapper's codec refuses every value PostgreSQL cannot hold with
CodecError, naming the argument, before anything is sent: lone surrogates in
payloads (jsonb refuses them, 22P02) and in text arguments (UTF-8 cannot
encode them), and payloads nested deeper than the encoder can go."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pyalk import Alk, CodecError, Lock, _codec


def nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


@pytest.fixture
def alk(dsn: str) -> Iterator[Alk]:
    with Alk(dsn) as client:
        yield client


def rows(db: psycopg.Connection, table: str) -> int:
    return int(db.execute(f"SELECT count(*) FROM alk.{table}").fetchone()[0])  # type: ignore[index]


@pytest.mark.parametrize("value", ["\ud800", "a\udfffb", ["ok", {"k": "\udc00"}], {"\ud800": 1}, "\udc00\ud800"])
def test_a_lone_surrogate_payload_is_refused(value):
    with pytest.raises(CodecError, match="payload contains a lone surrogate"):
        _codec.payload(value)


def test_a_surrogate_pair_and_an_escaped_backslash_are_kept():
    # json.dumps escapes both halves; jsonb joins them into one character.
    assert _codec.payload("\ud83d\ude00") == '"\\ud83d\\ude00"'
    assert _codec.payload("\\ud800") == '"\\\\ud800"'  # a backslash, then "ud800": plain text


def test_a_payload_nested_5000_deep_is_refused():
    with pytest.raises(CodecError, match="payload is nested too deeply"):
        _codec.payload(nested(5000))
    with pytest.raises(CodecError, match=r"payloads\[1\] is nested too deeply"):
        _codec.payloads([1, nested(5000)])


@pytest.mark.parametrize("value", ["\ud800", "name\udc00", "\ud83d\ude00"])
def test_a_surrogate_in_text_is_refused_with_its_position(value):
    with pytest.raises(CodecError, match=r"worker_id contains the surrogate code point U\+D[0-9A-F]{3} at index \d"):
        _codec.text(value, "worker_id")


def test_valid_unicode_text_passes():
    assert _codec.text("ünïcødé 😀", "name") == "ünïcødé 😀"


def test_the_bindings_refuse_before_sending(alk, db):
    queue = alk.queue("q")
    with pytest.raises(CodecError, match="payload"):
        queue.enqueue("\ud800")
    with pytest.raises(CodecError, match="payload"):
        queue.enqueue(nested(5000))
    with pytest.raises(CodecError, match=r"payloads\[0\]"):
        queue.enqueue_batch(["\udfff"])
    with pytest.raises(CodecError, match="queue"):
        alk.queue("q\ud800")
    with pytest.raises(CodecError, match="worker_id"):
        queue.claim_batch("w\ud800", 1)
    stream = alk.stream("s")
    with pytest.raises(CodecError, match="key"):
        stream.publish({"a": 1}, key="k\ud800")
    with pytest.raises(CodecError, match="payload"):
        stream.publish("\ud800")
    with pytest.raises(CodecError, match="name"):
        Lock(alk, "l\ud800", "owner")
    assert rows(db, "jobs") == 0
    assert rows(db, "stream_events") == 0


def test_error_text_with_a_surrogate_is_refused_and_the_job_stays_claimed(alk, db):
    queue = alk.queue("q")
    queue.enqueue({"n": 1})
    handle = queue.claim_one("w")
    assert handle is not None
    with pytest.raises(CodecError, match="err"):
        handle.retry("boom \ud800")
    with pytest.raises(CodecError, match="err"):
        handle.fail("boom \ud800")
    assert db.execute("SELECT state, attempts FROM alk.jobs").fetchall() == [("processing", 1)]


def test_deep_but_encodable_payloads_still_round_trip(alk):
    queue = alk.queue("q")
    queue.enqueue(nested(500))
    handle = queue.claim_one("w")
    assert handle is not None and handle.payload == nested(500)
    assert queue.enqueue("\ud83d\ude00") > 0



def test_a_failed_jobs_error_text_shows_a_lone_surrogate_escaped_not_as_a_codec_failure():
    from pyalk.worker.errors import error_text

    text = error_text(ValueError("bad \ud800 byte"))
    assert text == "ValueError: bad \\ud800 byte"
    text.encode("utf-8")  # what the worker sends is always encodable
