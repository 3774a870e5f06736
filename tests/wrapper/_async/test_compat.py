"""The schema compatibility check: before its first statement a client asks
``alk.schema_info()`` once, and refuses a schema it cannot run on with one
line (pyalk.schema.compat has the rule)."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from pyalk import AsyncAlk, SchemaMismatch
from pyalk.schema.install import head
from tests.conftest import Server, _janitor

NEEDS = head()
MISSING = f"schema alk is not installed, or older than 0008 (this pyalk needs {NEEDS}): run pyalk migrate"
OLDER = f"schema 0007 is older than this pyalk needs ({NEEDS}): run pyalk migrate"
NEWER = f"schema {NEEDS} is newer than this pyalk understands (it knows up to {NEEDS}): upgrade pyalk"


@pytest.fixture
def empty_dsn(pg_server: Server) -> Iterator[str]:
    """conninfo of a fresh database pyalk was never installed in."""
    name = f"pyalk_empty_{secrets.token_hex(6)}"
    janitor = _janitor(pg_server, name)
    janitor.init()
    try:
        yield pg_server.dsn_for(name)
    finally:
        janitor.drop()


@pytest.fixture(params=["conninfo", "pool", "connection"])
def source_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def client_on(source_kind: str) -> AsyncIterator[object]:
    """Build a client on a dsn from an owned pool, a borrowed pool or a borrowed connection."""
    opened: list[psycopg.AsyncConnection | AsyncConnectionPool | AsyncAlk] = []

    async def build(dsn: str) -> AsyncAlk:
        if source_kind == "conninfo":
            client = AsyncAlk(dsn)
        elif source_kind == "pool":
            pool = AsyncConnectionPool(dsn, min_size=1, max_size=2, kwargs={"autocommit": True}, open=False)
            await pool.open()
            opened.append(pool)
            client = AsyncAlk(pool)
        else:
            conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
            opened.append(conn)
            client = AsyncAlk(conn)
        opened.append(client)
        return client

    yield build
    for item in reversed(opened):
        await item.close()


def one_line(error: pytest.ExceptionInfo[SchemaMismatch]) -> str:
    text = str(error.value)
    assert "\n" not in text
    return text


async def test_an_unmigrated_database_is_refused_at_the_first_call(client_on, empty_dsn):
    alk = await client_on(empty_dsn)
    with pytest.raises(SchemaMismatch) as error:
        await alk.queue("q").enqueue(1)
    assert one_line(error) == MISSING
    assert error.value.__cause__ is None  # the one line, not a psycopg chain


async def test_an_older_schema_is_refused(client_on, dsn, db):
    db.execute("UPDATE alk.alembic_version SET version_num = '0007'")
    alk = await client_on(dsn)
    with pytest.raises(SchemaMismatch) as error:
        await alk.stream("s").publish({"n": 1})
    assert one_line(error) == OLDER
    assert db.execute("SELECT count(*) FROM alk.stream_events").fetchone() == (0,)


async def test_a_schema_that_broke_this_client_is_refused(client_on, dsn, db):
    db.execute(f"""CREATE OR REPLACE FUNCTION alk.schema_info(OUT version text, OUT breaking_since text)
                   RETURNS record LANGUAGE sql AS $$ SELECT '{NEEDS}'::text, '9999'::text $$""")
    alk = await client_on(dsn)
    with pytest.raises(SchemaMismatch) as error:
        await alk.try_lock("report", "a", 60)
    assert one_line(error) == NEWER
    assert db.execute("SELECT count(*) FROM alk.locks").fetchone() == (0,)


async def test_a_migrated_database_works_and_is_checked_once(client_on, dsn, db):
    alk = await client_on(dsn)
    queue = alk.queue("q")
    job_id = await queue.enqueue(1)
    # Once checked, the client does not ask again: breaking the function now goes unnoticed.
    db.execute("DROP FUNCTION alk.schema_info()")
    assert (await queue.get_job(job_id)) is not None
    assert await queue.enqueue(2) > job_id


async def test_a_refusal_is_asked_again_after_migrating(dsn, db):
    db.execute("UPDATE alk.alembic_version SET version_num = '0007'")
    async with AsyncAlk(dsn) as alk:
        with pytest.raises(SchemaMismatch):
            await alk.queue("q").enqueue(1)
        db.execute("UPDATE alk.alembic_version SET version_num = %s", [NEEDS])
        assert await alk.queue("q").enqueue(1) > 0
