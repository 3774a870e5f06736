"""Fixtures of the router tests: one PostgreSQL 15 server holding, as
databases, a single pyalk server and two routers with their 2 and 4
partitions. The same test body runs on each ("single" is the reference)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from uuid import uuid4

import psycopg
import pytest

from bench.pg15 import Pg15, missing
from pyalk.schema import migrate, router


@dataclass(frozen=True)
class Target:
    """Where a test calls alk.*: ``dsn``; ``partitions`` are empty for the single server."""

    name: str
    dsn: str
    partitions: tuple[str, ...]

    @property
    def routed(self) -> bool:
        return bool(self.partitions)

    def partition_of(self, name: str) -> str:
        """The conninfo of the database that holds ``name``."""
        if not self.routed:
            return self.dsn
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            row = conn.execute("SELECT alk.partition_of(%s)", [name]).fetchone()
        assert row is not None
        return self.partitions[row[0]]


@pytest.fixture(scope="session")
def pg15() -> Iterator[Pg15]:
    reason = missing()
    if reason:
        pytest.skip(reason)
    server = Pg15()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _create(server: Pg15, dbname: str, template: str = "template1") -> str:
    with psycopg.connect(server.dsn("postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{dbname}" TEMPLATE "{template}"')
    return server.dsn(dbname)


@pytest.fixture(scope="session")
def targets(pg15: Pg15) -> dict[str, Target]:
    migrate.upgrade(_create(pg15, "alk_template"))
    found = {"single": Target("single", _create(pg15, "single", "alk_template"), ())}
    for count in (2, 4):
        partitions = tuple(_create(pg15, f"r{count}_p{i}", "alk_template") for i in range(count))
        dsn = _create(pg15, f"router{count}")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(router.router_install(partitions))
        found[f"router{count}"] = Target(f"router{count}", dsn, partitions)
    return found


@pytest.fixture(params=["single", "router2", "router4"])
def target(request: pytest.FixtureRequest, targets: dict[str, Target]) -> Target:
    return targets[request.param]


@pytest.fixture(params=["router2", "router4"])
def routed(request: pytest.FixtureRequest, targets: dict[str, Target]) -> Target:
    return targets[request.param]


@pytest.fixture
def db(target: Target) -> Iterator[psycopg.Connection]:
    with psycopg.connect(target.dsn, autocommit=True) as conn:
        yield conn


@pytest.fixture
def tag() -> str:
    """A prefix that keeps each test's names apart (the databases are shared)."""
    return f"t{uuid4().hex[:8]}"
