"""Assertions shared by the SQL-level tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest


@contextmanager
def raises_lk(code: str, *fragments: str) -> Iterator[None]:
    """The block raises SQLSTATE ``code`` with every fragment in its message."""
    with pytest.raises(psycopg.Error) as caught:
        yield
    assert caught.value.sqlstate == code, caught.value
    message = caught.value.diag.message_primary or ""
    for fragment in fragments:
        assert fragment in message, message
