"""0026 drops and re-creates the functions that gain a trailing parameter
(ack's result, settle's and settle_and_claim's results, the enqueue forms'
headers): the roles an administrator granted them, and the role kinds, keep
EXECUTE on the new ones, PUBLIC still has none, and the jobs already queued
keep their dedup keys under the new jobs_dedup."""

from __future__ import annotations

import secrets

import psycopg
from psycopg import sql

from pyalk.schema import migrate


def test_the_upgrade_keeps_grants_and_queued_jobs(empty_db):
    dsn = empty_db()
    migrate.upgrade(dsn, "0025")
    granted_by_hand = f"pyalk_hand_{secrets.token_hex(4)}"
    granted_a_kind = f"pyalk_kind_{secrets.token_hex(4)}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name in (granted_by_hand, granted_a_kind):
            conn.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(name)))
        try:
            conn.execute(sql.SQL("GRANT USAGE ON SCHEMA alk TO {}").format(sql.Identifier(granted_by_hand)))
            conn.execute(sql.SQL("GRANT EXECUTE ON FUNCTION alk.ack(bigint, text, bigint, text), "
                                 "alk.enqueue(text, jsonb, bigint, bigint, bigint, bigint, bigint, bigint, bigint, "
                                 "bigint, text) TO {}").format(sql.Identifier(granted_by_hand)))
            conn.execute("SELECT alk.grant_admin(%s)", [granted_a_kind])
            held = conn.execute("SELECT alk.enqueue('q', '{}', dedup_key => 'k')").fetchone()
            migrate.upgrade(dsn, "0026")

            def can(role: str, function: str) -> bool:
                row = conn.execute("SELECT has_function_privilege(%s, %s, 'EXECUTE')", [role, function]).fetchone()
                return bool(row and row[0])

            ack = "alk.ack(bigint, text, bigint, text, jsonb)"
            enqueue = ("alk.enqueue(text, jsonb, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, text, "
                       "jsonb)")
            assert can(granted_by_hand, ack) and can(granted_by_hand, enqueue)
            settle = "alk.settle(bigint[], text, bigint[], text[], text[], bigint[], text, jsonb[])"
            assert not can(granted_by_hand, settle)
            for function in (ack, enqueue, "alk.set_queue_retention(text, bigint)", "alk.queue_retention(text)",
                             "alk.settle_and_claim(text, text, bigint, bigint[], bigint[], text[], text[], bigint[], "
                             "jsonb[])"):
                assert can(granted_a_kind, function), function
                acl = conn.execute("SELECT proacl::text[] FROM pg_proc WHERE oid = %s::regprocedure",
                                   [function]).fetchone()
                assert acl is not None and not any(entry.startswith("=") for entry in acl[0]), acl  # no PUBLIC
            assert conn.execute("SELECT alk.enqueue('q', '{}', dedup_key => 'k')").fetchone() == held
            assert conn.execute("SELECT headers, result, completed_at FROM alk.get_job('q', %s)",
                                [held[0]]).fetchone() == (None, None, None)
        finally:
            for name in (granted_by_hand, granted_a_kind):
                conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
                conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))
