"""tools/sqlversion.py: parsing the current files, and diff against the chain on a real server."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

import pyalk.schema.install

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("sqlversion", ROOT / "tools" / "sqlversion.py")
assert _spec and _spec.loader
sqlversion = importlib.util.module_from_spec(_spec)
sys.modules["sqlversion"] = sqlversion  # dataclasses look their module up
_spec.loader.exec_module(sqlversion)


def test_every_current_function_parses_into_one_create_and_comment_block():
    blocks = sqlversion.current_blocks()
    creates = sum(path.read_text().count("\nCREATE FUNCTION alk.") for path in pyalk.schema.install.current_files())
    assert len(blocks) == creates
    claim = blocks["alk.claim(text,text,bigint)"]
    assert claim.create.startswith("CREATE FUNCTION alk.claim(") and claim.create.endswith("$$;")
    replaced = claim.replace_sql()
    assert replaced.startswith("CREATE OR REPLACE FUNCTION alk.claim(")
    assert "\nCOMMENT ON FUNCTION alk.claim(text, text, bigint) IS" in replaced


def test_a_function_without_its_comment_is_refused():
    with pytest.raises(ValueError, match=r"without a COMMENT ON: alk\.f"):
        sqlversion.function_blocks("CREATE FUNCTION alk.f() RETURNS int LANGUAGE sql AS $$ SELECT 1; $$;")


def test_every_installed_function_has_a_block_under_its_catalog_signature(db):
    keys = {row[0] for row in db.execute("SELECT oid::regprocedure::text FROM pg_proc "
                                         "WHERE pronamespace = 'alk'::regnamespace")}
    assert keys == set(sqlversion.current_blocks())


def test_diff_finds_an_edited_comment_and_prints_its_replacement(pg_server, tmp_path, monkeypatch):
    assert sqlversion.diff(pg_server.dsn).empty()
    copies = []
    for path in pyalk.schema.install.current_files():
        copies.append(tmp_path / pyalk.schema.install.current_name(path))  # queue/10_table.sql keeps its folder
        copies[-1].parent.mkdir(exist_ok=True)
        shutil.copy(path, copies[-1])
    lock = tmp_path / "lock.sql"
    text = lock.read_text().replace("'A lock as alk.get_lock returns it", "'A lock, as alk.get_lock returns it")
    lock.write_text(text)
    lock.write_text(lock.read_text().replace("COMMENT ON FUNCTION alk.get_lock(text) IS\n'",
                                             "COMMENT ON FUNCTION alk.get_lock(text) IS\n'Edited. "))
    monkeypatch.setattr(pyalk.schema.install, "current_files", lambda: copies)
    monkeypatch.setattr(sqlversion, "current_files", lambda: copies)
    found = sqlversion.diff(pg_server.dsn)
    assert [block.key for block in found.functions] == ["alk.get_lock(text)"]
    assert list(found.other) == ["types"] and not found.dropped
    text = sqlversion.render_diff(found)
    assert "CREATE OR REPLACE FUNCTION alk.get_lock(name text)" in text
    assert "COMMENT ON FUNCTION alk.get_lock(text) IS\n'Edited. " in text


def test_new_writes_the_version_its_revision_and_its_pin(tmp_path, monkeypatch):
    versions_dir = tmp_path / "sql" / "versions"
    (tmp_path / "alembic" / "versions").mkdir(parents=True)
    versions_dir.mkdir(parents=True)
    (versions_dir / "MANIFEST").write_text("00  0001_core.sql\n")
    monkeypatch.setattr(sqlversion, "ROOT", tmp_path)
    monkeypatch.setattr(sqlversion, "VERSIONS", versions_dir)
    monkeypatch.setattr(sqlversion, "MANIFEST", versions_dir / "MANIFEST")
    monkeypatch.setattr(sqlversion, "head", lambda: "0008")
    path = sqlversion.new_version("claim_order", "CREATE OR REPLACE FUNCTION alk.x() ...;")
    assert path.name == "0009_claim_order.sql"
    assert path.read_text().endswith(sqlversion.REVOKE + "\n")
    revision = (tmp_path / "alembic" / "versions" / "0009_claim_order.py").read_text()
    assert 'revision = "0009"' in revision and 'down_revision = "0008"' in revision
    assert sqlversion.manifest_lines() == {"0001_core.sql": "00"}  # closed: never written
    assert sqlversion.own_pins() == {path.name: sqlversion._sha256(path)}
    assert (versions_dir / "0009_claim_order.sql.sha256").read_text() == f"{sqlversion._sha256(path)}  {path.name}\n"
    with pytest.raises(ValueError, match="name must be"):
        sqlversion.new_version("Bad Name", "")
