"""A comparable snapshot of everything pyalk installs in schema alk: function
definitions, comments (schema, functions, types, tables, columns), grants,
tables, columns and composite type attributes with their types, indexes,
constraints, types, triggers and the recorded version."""

from __future__ import annotations

from typing import Any

import psycopg

QUERIES = {
    "schema": """
        SELECT nspname, nspacl::text, obj_description(oid, 'pg_namespace')
        FROM pg_namespace WHERE nspname = 'alk'""",
    "default_acl": """
        SELECT defaclobjtype, defaclacl::text FROM pg_default_acl
        WHERE defaclnamespace = 'alk'::regnamespace ORDER BY 1""",
    "functions": """
        SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid), p.proacl::text,
               obj_description(p.oid, 'pg_proc'), p.proconfig::text, p.prosecdef, p.provolatile
        FROM pg_proc p WHERE p.pronamespace = 'alk'::regnamespace ORDER BY 1""",
    "relations": """
        SELECT c.relname, c.relkind, c.reloptions::text, c.relacl::text, obj_description(c.oid, 'pg_class')
        FROM pg_class c WHERE c.relnamespace = 'alk'::regnamespace ORDER BY 1""",
    # Tables' columns and composite types' attributes (relkind 'c') alike.
    "columns": """
        SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               pg_get_expr(d.adbin, d.adrelid), a.attidentity, col_description(c.oid, a.attnum), a.attacl::text
        FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE c.relnamespace = 'alk'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY 1, 2""",
    "indexes": """
        SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'alk' ORDER BY 1""",
    "constraints": """
        SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid)
        FROM pg_constraint WHERE connamespace = 'alk'::regnamespace ORDER BY 1, 2""",
    "types": """
        SELECT t.typname, t.typtype, obj_description(t.oid, 'pg_type'), t.typacl::text
        FROM pg_type t WHERE t.typnamespace = 'alk'::regnamespace ORDER BY 1""",
    "triggers": """
        SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(oid)
        FROM pg_trigger WHERE NOT tgisinternal AND tgrelid IN (
            SELECT oid FROM pg_class WHERE relnamespace = 'alk'::regnamespace) ORDER BY 1, 2""",
    "version": "SELECT version_num FROM alk.alembic_version",
}


def snapshot(dsn: str) -> dict[str, list[tuple[Any, ...]]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {name: conn.execute(query).fetchall() for name, query in QUERIES.items()}
