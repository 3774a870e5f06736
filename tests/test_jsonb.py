"""pyalk's jsonb decoding (pyalk/_jsonb.py) gives exactly what psycopg's stock
loader gives, for every shape jsonb prints, on a real server; a pool pyalk
owns uses it and a borrowed connection keeps its own adapters."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from pyalk import Alk, _jsonb

VALUES: list[Any] = [
    {"n": 1}, [], {}, "", "text", 'q"uote\\back\nline\t\u00e9\u4e2d\U0001f600', 0, -17, 2**70, 1.5, -2.5e-300,
    1e300, True, False, None, [1, [2, [3, {"k": [None]}]]], {"a": {"b": {"c": "d"}}, "z": [1.0, "x"]},
    {"dup": 1, "other": "\u0001"},
]


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_the_fast_loader_decodes_what_the_stock_one_does(db: psycopg.Connection, value: Any):
    text = json.dumps(value)
    stock = db.execute("SELECT %s::jsonb", [text]).fetchone()
    fast = db.cursor()
    fast.adapters.register_loader(_jsonb.JSONB_OID, _jsonb.JsonbLoader)
    got = fast.execute("SELECT %s::jsonb", [text]).fetchone()
    # repr: the same types too (1 and 1.0 compare equal).
    assert stock is not None and repr(got) == repr(stock)


@pytest.mark.parametrize("data", [b' {"a": 1} ', b'{"a": 1} x', b"nope", b""])
def test_text_jsonb_never_prints_falls_back_to_json_loads(data: bytes):
    loader = _jsonb.JsonbLoader(_jsonb.JSONB_OID)
    try:
        expected = json.loads(data)
    except json.JSONDecodeError as error:
        with pytest.raises(json.JSONDecodeError, match=error.msg):
            loader.load(data)
    else:
        assert loader.load(data) == expected


def test_an_owned_pool_decodes_with_it_and_a_borrowed_connection_keeps_its_own(dsn: str, db: psycopg.Connection):
    with Alk(dsn) as alk:
        queue = alk.queue("jsonb")
        queue.enqueue({"k": [1, "two"]})
        [handle] = queue.claim_batch("w1", 5)
        assert handle.payload == {"k": [1, "two"]}
        pool = alk.executor._pool
        assert pool is not None
        with pool.connection() as conn:
            assert conn.adapters.get_loader(_jsonb.JSONB_OID, psycopg.pq.Format.TEXT) is _jsonb.JsonbLoader
    with Alk(db) as borrowed:
        queue = borrowed.queue("jsonb")
        queue.enqueue({"k": "three"})
        assert [handle.payload for handle in queue.claim_batch("w2", 5)] == [{"k": "three"}]
    assert db.adapters.get_loader(_jsonb.JSONB_OID, psycopg.pq.Format.TEXT) is not _jsonb.JsonbLoader
