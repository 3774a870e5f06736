"""Fixtures for migration tests: empty databases without pyalk."""

from __future__ import annotations

import secrets

import psycopg
import pytest
from psycopg import sql


@pytest.fixture
def empty_db(pg_server):
    """A factory of empty databases (no pyalk), dropped after the test."""
    made: list[str] = []

    def make() -> str:
        name = f"pyalk_empty_{secrets.token_hex(5)}"
        with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        made.append(name)
        return pg_server.dsn_for(name)

    yield make
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        for name in made:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
