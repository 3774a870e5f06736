"""The schedule/lock upgrade of issue 12 (bigint schedule columns, zero-row
get_schedule and get_lock, which are dropped and re-created): an installed
database keeps its schedules, and the roles an administrator granted the two
readers keep EXECUTE on them."""

from __future__ import annotations

import secrets

import psycopg
from psycopg import sql

from pyalk.schema import migrate
from pyalk.schema.install import versions


def test_the_upgrade_keeps_schedules_and_the_readers_grants(empty_db):
    version = next(v for v in versions() if v.mechanism == "schedule" and v.number > "0006")
    previous = f"{int(version.number) - 1:04d}"
    dsn = empty_db()
    migrate.upgrade(dsn, previous)
    name = f"pyalk_reader_{secrets.token_hex(4)}"
    role = sql.Identifier(name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {}").format(role))
        try:
            conn.execute(sql.SQL("GRANT USAGE ON SCHEMA alk TO {}").format(role))
            conn.execute(sql.SQL("GRANT EXECUTE ON FUNCTION alk.get_schedule(text), alk.get_lock(text) TO {}")
                         .format(role))
            conn.execute("SELECT alk.schedule('s', '@hourly', 'q', priority => 7, max_attempts => 9)")
            migrate.upgrade(dsn, version.number)
            for function in ("alk.get_schedule(text)", "alk.get_lock(text)"):
                granted = conn.execute("SELECT has_function_privilege(%s, %s, 'EXECUTE')", [name, function]).fetchone()
                assert granted == (True,), function
                acl = conn.execute("SELECT proacl::text[] FROM pg_proc WHERE oid = %s::regprocedure",
                                   [function]).fetchone()
                assert acl is not None and not any(entry.startswith("=") for entry in acl[0]), acl  # no PUBLIC
            row = conn.execute("SELECT priority, max_attempts, pg_typeof(priority)::text FROM alk.get_schedule('s')"
                               ).fetchall()
            assert row == [(7, 9, "bigint")]
            assert conn.execute("SELECT * FROM alk.get_schedule('gone')").fetchall() == []
        finally:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(role))
            conn.execute(sql.SQL("DROP ROLE {}").format(role))
