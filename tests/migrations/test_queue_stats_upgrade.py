"""0018 drops and re-creates alk.queue_stats (it gains exact_limit and its
row the estimated column): the roles an administrator granted it keep
EXECUTE on the new one, and PUBLIC still has none."""

from __future__ import annotations

import secrets

import psycopg
from psycopg import sql

from pyalk.schema import migrate


def test_the_upgrade_keeps_the_grants_on_queue_stats(empty_db):
    dsn = empty_db()
    migrate.upgrade(dsn, "0017")
    name = f"pyalk_watcher_{secrets.token_hex(4)}"
    role = sql.Identifier(name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {}").format(role))
        try:
            conn.execute(sql.SQL("GRANT USAGE ON SCHEMA alk TO {}").format(role))
            conn.execute(sql.SQL("GRANT EXECUTE ON FUNCTION alk.queue_stats(text), alk.now() TO {}").format(role))
            conn.execute("SELECT alk.enqueue('q', '{}')")
            migrate.upgrade(dsn, "0018")
            function = "alk.queue_stats(text, bigint)"
            granted = conn.execute("SELECT has_function_privilege(%s, %s, 'EXECUTE')", [name, function]).fetchone()
            assert granted == (True,)
            acl = conn.execute("SELECT proacl::text[] FROM pg_proc WHERE oid = %s::regprocedure", [function]).fetchone()
            assert acl is not None and not any(entry.startswith("=") for entry in acl[0]), acl  # no PUBLIC
            conn.execute(sql.SQL("SET ROLE {}").format(role))
            assert conn.execute("SELECT queue, ready, estimated FROM alk.queue_stats(exact_limit => 0)").fetchall() == [
                ("q", 1, True)]
            conn.execute("RESET ROLE")
        finally:
            conn.execute("RESET ROLE")
            conn.execute(sql.SQL("DROP OWNED BY {}").format(role))
            conn.execute(sql.SQL("DROP ROLE {}").format(role))
