"""CREATE EXTENSION alk on PostgreSQL 15 and 18: the same catalog as Alembic and
the psql script, ALTER EXTENSION alk UPDATE from every version, the version
table kept, pyalk migrate refused where the extension owns the schema, and a
pg_dump round trip that keeps the jobs."""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pyalk import cli
from pyalk.schema import extension, migrate
from pyalk.schema.install import head, install_script, versions
from tests.extension.conftest import ExtServer
from tests.migrations.catalog import snapshot


def run(dsn: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


def extversion(dsn: str) -> str | None:
    rows = run(dsn, "SELECT extversion FROM pg_extension WHERE extname = 'alk'")
    return rows[0][0] if rows else None


def assert_same_catalog(got: dict[str, Any], reference: dict[str, Any], what: str) -> None:
    assert reference["functions"], "nothing was installed"
    for part, rows in reference.items():  # part by part, so a failure names what drifted
        assert got[part] == rows, f"{what}: {part} differs"


def test_create_extension_gives_the_catalog_of_alembic_and_the_psql_script(ext: ExtServer):
    by_extension, by_alembic, by_script = ext.db(), ext.db(), ext.db()
    run(by_extension, "CREATE EXTENSION alk")
    migrate.upgrade(by_alembic)
    run(by_script, install_script())
    reference = snapshot(by_alembic)
    assert_same_catalog(snapshot(by_script), reference, "psql script")
    assert_same_catalog(snapshot(by_extension), reference, "CREATE EXTENSION alk")
    assert extversion(by_extension) == head()
    assert run(by_extension, "SELECT * FROM alk.schema_info()")[0][0] == head()


def test_the_extension_owns_every_object_and_drop_extension_removes_them(ext: ExtServer):
    dsn = ext.db()
    run(dsn, "CREATE EXTENSION alk")
    outside = run(dsn, """
        WITH objects AS (
            SELECT 'pg_proc'::regclass AS classid, oid, oid::regprocedure::text AS name
            FROM pg_proc WHERE pronamespace = 'alk'::regnamespace
            UNION ALL
            SELECT 'pg_class'::regclass, oid, relname FROM pg_class
            WHERE relnamespace = 'alk'::regnamespace AND relkind IN ('r', 'S', 'v')
            UNION ALL  -- enums, domains and composite types (not a table's row type)
            SELECT 'pg_type'::regclass, t.oid, t.typname FROM pg_type t LEFT JOIN pg_class c ON c.oid = t.typrelid
            WHERE t.typnamespace = 'alk'::regnamespace AND (t.typtype IN ('e', 'd') OR c.relkind = 'c'))
        SELECT name FROM objects o WHERE NOT EXISTS (
            SELECT FROM pg_depend d WHERE d.classid = o.classid AND d.objid = o.oid AND d.deptype = 'e'
              AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'alk'))""")
    assert outside == []
    run(dsn, "DROP EXTENSION alk")
    left = run(dsn, """SELECT (SELECT count(*) FROM pg_proc WHERE pronamespace = 'alk'::regnamespace),
                              (SELECT count(*) FROM pg_class WHERE relnamespace = 'alk'::regnamespace)""")
    assert left == [(0, 0)]
    # CREATE EXTENSION made the schema before the extension existed: it stays, empty.
    assert run(dsn, "SELECT count(*) FROM pg_namespace WHERE nspname = 'alk'") == [(1,)]


def test_install_at_every_version_then_update_equals_a_fresh_install(ext: ExtServer):
    fresh = ext.db()
    migrate.upgrade(fresh)
    reference = snapshot(fresh)
    for version in versions()[:-1]:
        by_extension, by_alembic = ext.db(), ext.db()
        run(by_extension, sql.SQL("CREATE EXTENSION alk VERSION {}").format(sql.Literal(version.number)))
        migrate.upgrade(by_alembic, version.number)
        assert_same_catalog(snapshot(by_extension), snapshot(by_alembic),
                            f"CREATE EXTENSION alk VERSION {version.number}")
        run(by_extension, "ALTER EXTENSION alk UPDATE")
        assert extversion(by_extension) == head()
        assert_same_catalog(snapshot(by_extension), reference, f"ALTER EXTENSION alk UPDATE from {version.number}")


def test_pyalk_migrate_refuses_an_extension_behind_the_head_and_is_a_no_op_at_it(ext: ExtServer):
    behind = ext.db()
    run(behind, "CREATE EXTENSION alk VERSION '0003'")
    before = snapshot(behind)
    with pytest.raises(extension.ExtensionInstalled, match="ALTER EXTENSION alk UPDATE"):
        migrate.upgrade(behind)
    assert cli.main(["migrate", "--dsn", behind]) == 1
    assert snapshot(behind) == before
    assert extversion(behind) == "0003"

    at_head = ext.db()
    run(at_head, "CREATE EXTENSION alk")
    before = snapshot(at_head)
    migrate.upgrade(at_head)
    assert snapshot(at_head) == before


def test_an_update_refuses_a_schema_moved_on_outside_the_extension(ext: ExtServer):
    dsn = ext.db()
    run(dsn, "CREATE EXTENSION alk VERSION '0003'")
    run(dsn, "UPDATE alk.alembic_version SET version_num = '0004'")  # as a psql upgrade script would
    with pytest.raises(psycopg.Error, match="changed outside ALTER EXTENSION"):
        run(dsn, "ALTER EXTENSION alk UPDATE")
    assert extversion(dsn) == "0003"


def test_create_extension_refuses_a_plain_install(ext: ExtServer):
    dsn = ext.db()
    migrate.upgrade(dsn)
    before = snapshot(dsn)
    refusal = f"already installed in schema alk without the extension \\(version {head()}"
    with pytest.raises(psycopg.Error, match=refusal):
        run(dsn, "CREATE EXTENSION alk")
    assert extversion(dsn) is None
    assert snapshot(dsn) == before


def test_a_database_owner_who_is_not_a_superuser_installs_it_and_owns_the_functions(ext: ExtServer):
    role = f"pyalk_ext_owner_{secrets.token_hex(4)}"
    run(ext.maintenance, sql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER").format(sql.Identifier(role)))
    try:
        dsn = ext.db(owner=role)
        as_owner = make_conninfo(dsn, user=role)
        run(as_owner, "CREATE EXTENSION alk")
        owners = run(dsn, "SELECT DISTINCT proowner::regrole::text FROM pg_proc"
                          " WHERE pronamespace = 'alk'::regnamespace")
        assert owners == [(role,)]
        assert run(as_owner, "SELECT version FROM alk.schema_info()") == [(head(),)]
    finally:
        ext.drop_made()
        run(ext.maintenance, sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def dump_and_restore(ext: ExtServer, source: str, target: str, tmp_path: Path) -> None:
    dump = tmp_path / "alk.dump"
    tmp_path.chmod(0o755)
    for argv in ([str(ext.bindir / "pg_dump"), "-Fc", "-f", str(dump), "-d", source],
                 [str(ext.bindir / "pg_restore"), "--exit-on-error", "-d", target, str(dump)]):
        result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr


def test_pg_dump_and_restore_keep_the_jobs_and_the_version(ext: ExtServer, tmp_path: Path):
    source, target = ext.db(), ext.db()
    run(source, "CREATE EXTENSION alk")
    ids = [run(source, "SELECT alk.enqueue('mail', %s::jsonb)", [f'{{"n": {n}}}'])[0][0] for n in range(3)]
    dump_and_restore(ext, source, target, tmp_path)
    assert extversion(target) == head()
    assert run(target, "SELECT version FROM alk.schema_info()") == [(head(),)]
    assert run(target, "SELECT id, payload->>'n' FROM alk.jobs ORDER BY id") == [(i, str(n)) for n, i in enumerate(ids)]
    # The identity sequence came along: the next job does not reuse an id.
    assert run(target, "SELECT alk.enqueue('mail', '{}'::jsonb)")[0][0] > max(ids)



def test_a_restore_keeps_the_slots_so_a_keyed_enqueue_still_finds_its_holder(ext: ExtServer, tmp_path: Path):
    source, target = ext.db(), ext.db()
    run(source, "CREATE EXTENSION alk")
    holder = run(source, "SELECT alk.enqueue('mail', '{}'::jsonb, dedup_key => 'k')")[0][0]
    # The rotation sends new jobs to slot 1 and moves the key's holder there.
    assert run(source, "SELECT alk.rotate_jobs(0)") == [("rotated",)]
    slots = "SELECT current_slot, rotations, draining_slot FROM alk.job_slots"
    assert run(source, slots) == [(1, 1, None)]
    dump_and_restore(ext, source, target, tmp_path)
    assert run(target, slots) == [(1, 1, None)]
    assert run(target, "SELECT id, slot FROM alk.jobs") == [(holder, 1)]
    assert run(target, "SELECT alk.enqueue('mail', '{}'::jsonb, dedup_key => 'k')") == [(holder,)]
    assert run(target, "SELECT count(*) FROM alk.jobs") == [(1,)]


def test_an_updated_install_dumps_the_same_tables_as_a_fresh_one(ext: ExtServer, tmp_path: Path):
    fresh, updated, restored = ext.db(), ext.db(), ext.db()
    run(fresh, "CREATE EXTENSION alk")
    run(updated, "CREATE EXTENSION alk VERSION '0046'")  # before job_slots' trigger (0047)
    # A table marked by one version and dropped by a later one leaves its
    # oid in extconfig (PostgreSQL keeps it); pg_dump passes over it (the
    # dump below).
    dumped = ("SELECT array_agg(c::regclass::text ORDER BY c::regclass::text)"
              " FROM pg_extension e, unnest(e.extconfig) c"
              " WHERE e.extname = 'alk' AND c IN (SELECT oid FROM pg_class)")
    assert "alk.job_slots" not in run(updated, dumped)[0][0]
    run(updated, "ALTER EXTENSION alk UPDATE")
    assert run(updated, dumped) == run(fresh, dumped)
    assert "alk.job_slots" in run(fresh, dumped)[0][0]
    run(updated, "SELECT alk.rotate_jobs(0)")
    dump_and_restore(ext, updated, restored, tmp_path)
    assert run(restored, "SELECT current_slot FROM alk.job_slots") == [(1,)]

def test_create_schema_if_not_exists_fails_inside_an_extension_script_so_the_generator_filters_it(ext: ExtServer):
    """Why FILTERED exists: with ``schema = X`` in the control file, CREATE
    EXTENSION makes X itself, and the script may not skip an object the
    extension does not own."""
    name = f"alk_probe_{secrets.token_hex(4)}"
    control = ext.share / f"{name}.control"
    script = ext.share / f"{name}--1.sql"
    control.write_text(f"default_version = '1'\nschema = {name}\nrelocatable = false\nsuperuser = false\n")
    script.write_text(f"CREATE SCHEMA IF NOT EXISTS {name};\n")
    try:
        dsn = ext.db()
        with pytest.raises(psycopg.Error, match=f"schema {name} is not a member of extension"):
            run(dsn, sql.SQL("CREATE EXTENSION {}").format(sql.Identifier(name)))
        script.write_text(f"CREATE TABLE {name}.t (x int);\n")  # the same without the statement installs
        run(dsn, sql.SQL("CREATE EXTENSION {}").format(sql.Identifier(name)))
    finally:
        control.unlink(missing_ok=True)
        script.unlink(missing_ok=True)
