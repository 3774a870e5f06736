"""Hostile input over every public alk.* function (issue 13, item 4).

The functions and their argument types come from pg_proc, so a new function
is fuzzed the day it lands. Each call gets bigint edges, NULLs, empty and
2 KB names, quotes, Unicode, invalid JSON and (in their own test) 10 MB
values, and may only fail with a pyalk code (LK001..LK005) or a PostgreSQL
code docs/errors.md lists for hostile input: never XX000 (internal error),
never 22003 (out of range: every stamp saturates), never a hang
(statement_timeout). Every call runs in a transaction that is rolled back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

#: What a hostile argument may come back as; docs/errors.md ("Hostile input") says why each is there.
ALLOWED = {
    "LK001", "LK002", "LK003", "LK004", "LK005",
    "22P02",  # invalid text representation: JSON text that is not JSON, cast by the caller
    "22P05",  # untranslatable character: a \u0000 escape in JSON text, which jsonb cannot store
}
#: Functions the fuzzer leaves alone, and why.
SKIP: dict[str, str] = {}
TIMEOUT_MS = 10_000

BIGINT_EDGES = [-(2**63), -(2**63) + 1, -(2**31) - 1, -(2**31), -1, 0, 1, 2**31 - 1, 2**31, 2**63 - 2, 2**63 - 1]
NAMES = ["", " ", "q", "o'hara", 'a"b', "x'); DROP TABLE alk.jobs; --", "alk:", "alk:outbox:x", "é☃𝄞",
         "\u202e\u200b", "x" * 2048, "é" * 1024, "UTC", "Europe/Berlin", "@every 1s", "* * * * *", "60 * * * *",
         "@every 0s", "@every 9223372036854775807d", "reader", "postgres"]
JSON = ["{}", "null", "0", "1e23", "-0", "1e400", '"x"', "[1, [2, [3]]]", '{"a": "é☃"}', '{"a": "\\u0000"}',
        "{", "nan", "{'a': 1}", "", "[1,]", '{"a": 1, "a": 2}', '"' + "y" * 2048 + '"']
BIG = "x" * (10 * 1024 * 1024)


@dataclass(frozen=True)
class Function:
    name: str
    types: tuple[str, ...]  # argument types, format_type spelling
    required: int  # arguments without a default

    def call(self, n: int) -> str:
        casts = ", ".join(f"%s::{t}" for t in self.types[:n])
        return f"SELECT * FROM alk.{self.name}({casts})"


def public_functions(db: psycopg.Connection) -> list[Function]:
    rows = db.execute("""
        SELECT p.proname, ARRAY(SELECT format_type(t, NULL) FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY
                                 AS a(t, i) ORDER BY i), p.pronargs - p.pronargdefaults
          FROM pg_proc p
         WHERE p.pronamespace = 'alk'::regnamespace AND p.proname !~ '^_' AND p.prokind = 'f'
         ORDER BY 1, 2""").fetchall()
    return [Function(name, tuple(types), required) for name, types, required in rows if name not in SKIP]


def _value(kind: str) -> st.SearchStrategy[Any]:
    if kind == "bigint":
        return st.one_of(st.none(), st.sampled_from(BIGINT_EDGES), st.integers(-(2**63), 2**63 - 1))
    if kind == "text":
        return st.one_of(st.none(), st.sampled_from(NAMES),
                         st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), max_size=30))
    if kind == "jsonb":
        return st.one_of(st.none(), st.sampled_from(JSON))
    if kind.endswith("[]"):
        return st.one_of(st.none(), st.lists(_value(kind[:-2]), max_size=4))
    raise AssertionError(f"no strategy for argument type {kind}: add one to tests/sql/test_hostile.py")


@st.composite
def calls(draw: Callable[..., Any], functions: list[Function]) -> tuple[Function, list[Any]]:
    function = draw(st.sampled_from(functions))
    n = draw(st.integers(function.required, len(function.types)))
    return function, [draw(_value(t)) for t in function.types[:n]]


def _call(conn: psycopg.Connection, function: Function, args: list[Any]) -> None:
    """Run one call, rolled back; fail unless it succeeds or raises an allowed code."""
    statement = function.call(len(args))
    try:
        with conn.transaction(force_rollback=True):
            conn.execute(f"SET LOCAL statement_timeout = {TIMEOUT_MS}")
            conn.execute(statement, args).fetchall()
    except psycopg.Error as error:
        shown = [a if not isinstance(a, str) or len(a) <= 80 else f"<{len(a)} chars>" for a in args]
        assert error.sqlstate in ALLOWED, f"alk.{function.name}{tuple(shown)} -> {error.sqlstate}: {error}"


@pytest.fixture
def fuzz_db(db: psycopg.Connection) -> psycopg.Connection:
    # Some state for the calls to find: a job held by a worker, a schedule, a lock, a stream.
    db.execute("SELECT alk.enqueue('q', '1'), alk.publish('s', '1'), alk.try_lock('l', 'o', 60)")
    db.execute("SELECT alk.schedule('n', '* * * * *', 'q')")
    db.execute("SELECT * FROM alk.claim('q', 'w', 1)")
    return db


def _fuzz(conn: psycopg.Connection, examples: int) -> None:
    functions = public_functions(conn)
    assert len(functions) > 40

    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(calls(functions))
    def check(call: tuple[Function, list[Any]]) -> None:
        _call(conn, *call)

    check()


def test_hostile_arguments_raise_only_documented_codes(fuzz_db):
    _fuzz(fuzz_db, 400)


@pytest.mark.slow
def test_hostile_arguments_raise_only_documented_codes_long(fuzz_db):
    _fuzz(fuzz_db, 5000)


def test_every_argument_type_has_a_strategy(db):
    for function in public_functions(db):
        for kind in function.types:
            _value(kind)


#: A well-formed value per type, for the slots the 10 MB test is not filling.
PLAIN: dict[str, Any] = {"bigint": 1, "text": "q", "jsonb": "{}", "bigint[]": [1], "text[]": ["q"], "jsonb[]": ["{}"]}


def test_ten_megabyte_values_in_every_text_and_json_slot(fuzz_db):
    for function in public_functions(fuzz_db):
        for i, kind in enumerate(function.types):
            if kind.rstrip("[]") not in ("text", "jsonb"):
                continue
            big = f'"{BIG}"' if kind.startswith("jsonb") else BIG
            args = [PLAIN[t] for t in function.types]
            args[i] = [big] if kind.endswith("[]") else big
            _call(fuzz_db, function, args)
