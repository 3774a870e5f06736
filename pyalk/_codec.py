"""Encoding of Python values into query parameters, refusing what PostgreSQL
cannot hold before anything is sent. These are codec limits, not queue rules:
the queue's own rules live in sql/."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any, overload

from pyalk.errors import CodecError, InvalidArgument

BIGINT_MIN = -(2**63)
BIGINT_MAX = 2**63 - 1

# jsonb refuses the \u0000 escape; match it only when the backslash itself is
# not escaped (an odd run of backslashes before "u0000").
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def payload(value: Any, argument: str = "payload") -> str:
    """JSON text for a payload, or CodecError naming the argument."""
    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as error:
        raise CodecError(f"{argument} is not encodable as JSON: {error}") from error
    except RecursionError as error:
        # The C encoder recurses once per level; Python's limit comes first.
        raise CodecError(f"{argument} is nested too deeply to encode as JSON") from error
    if _JSON_NUL.search(text):
        raise CodecError(f"{argument} contains a NUL character, which PostgreSQL jsonb cannot store")
    # json.dumps escapes surrogates as \udXXX; jsonb takes a high+low pair as
    # one character and refuses a lone one (22P02). Only text holding such an
    # escape needs the exact check, so the usual payload costs one search.
    if "\\ud" in text:
        _no_lone_surrogate(value, argument)
    return text


def _no_lone_surrogate(value: Any, argument: str) -> None:
    raw = json.dumps(value, ensure_ascii=False, allow_nan=False)
    try:
        # UTF-16 joins each high+low pair into one character; a lone one fails.
        raw.encode("utf-16-le", "surrogatepass").decode("utf-16-le")
    except UnicodeDecodeError as error:
        raise CodecError(f"{argument} contains a lone surrogate code point, which is not valid Unicode text"
                         ) from error


def payloads(values: Iterable[Any], argument: str = "payloads") -> list[str]:
    return [payload(value, f"{argument}[{index}]") for index, value in enumerate(values)]


def bigint(value: int | None, argument: str) -> int | None:
    """An optional bigint argument, refused unless it is a true int in range."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{argument} must be an int, got {type(value).__name__} {value!r}")
    if not BIGINT_MIN <= value <= BIGINT_MAX:
        raise InvalidArgument(f"{argument} must fit in a signed 64-bit integer, got {value}")
    return value


@overload
def text(value: str, argument: str) -> str: ...
@overload
def text(value: None, argument: str) -> None: ...
@overload
def text(value: str | None, argument: str) -> str | None: ...
def text(value: str | None, argument: str) -> str | None:
    """An optional text argument: a str without NUL (PostgreSQL text cannot hold it)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidArgument(f"{argument} must be a str, got {type(value).__name__} {value!r}")
    if "\x00" in value:
        raise CodecError(f"{argument} contains a NUL character, which PostgreSQL text cannot store")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as error:
            code = ord(value[error.start])
            raise CodecError(f"{argument} contains the surrogate code point U+{code:04X} at index {error.start}, "
                             "which UTF-8 cannot encode") from error
    return value


# durations and instants ----------------------------------------------------------
# The SQL counts whole seconds (bigint). A timedelta or a datetime with a
# sub-second part is rounded UP to the next whole second: a delay, a ttl or a
# run_at is never shorter or earlier than asked.

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SECOND = timedelta(seconds=1)


def seconds(value: int | timedelta | None, argument: str) -> int | None:
    """A duration argument as whole seconds: an int (seconds) or a
    :class:`~datetime.timedelta` (a sub-second part rounds up); None stays
    None. Whether it must be positive is the SQL's rule, not this one."""
    if isinstance(value, timedelta):
        whole = -(-value // _SECOND)  # ceiling division of two timedeltas: an int
        return bigint(whole, argument)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise InvalidArgument(
            f"{argument} must be an int (seconds) or a datetime.timedelta, got {type(value).__name__} {value!r}")
    return bigint(value, argument)


def instant(value: int | datetime | None, argument: str) -> int | None:
    """A point in time as unix seconds: an int (unix seconds) or an aware
    :class:`~datetime.datetime` (a sub-second part rounds up). A naive
    datetime is refused: its zone would be a guess."""
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise InvalidArgument(
                f"{argument} must be a timezone-aware datetime (e.g. datetime.now(UTC)), got the naive {value!r}")
        return bigint(-(-(value - _EPOCH) // _SECOND), argument)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise InvalidArgument(
            f"{argument} must be an int (unix seconds) or an aware datetime, got {type(value).__name__} {value!r}")
    return bigint(value, argument)
