"""Landed version files are immutable: sql/versions/MANIFEST pins each one's
sha256, and each version has its one Alembic revision. The rule lives in
tools/sqlversion.py (``check``, which tools/check runs in seconds); these
tests run it and prove it can fail."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

from pyalk.schema.install import Version

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("sqlversion", ROOT / "tools" / "sqlversion.py")
assert _spec and _spec.loader
sqlversion = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("sqlversion", sqlversion)
_spec.loader.exec_module(sqlversion)


def test_every_version_file_matches_its_manifest_line_and_has_its_revision():
    assert sqlversion.manifest_problems() == []


@pytest.fixture
def copied_tree(tmp_path, monkeypatch):
    """sql/versions and alembic/versions copied, and the tool pointed at the copy."""
    versions_dir = tmp_path / "sql" / "versions"
    alembic_dir = tmp_path / "alembic" / "versions"
    shutil.copytree(ROOT / "sql" / "versions", versions_dir)
    shutil.copytree(ROOT / "alembic" / "versions", alembic_dir, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(sqlversion, "MANIFEST", versions_dir / "MANIFEST")
    monkeypatch.setattr(sqlversion, "ALEMBIC_VERSIONS", alembic_dir)
    monkeypatch.setattr(sqlversion, "versions", lambda: [
        Version(path.name[:4], path.stem[5:], path) for path in sorted(versions_dir.glob("[0-9]*.sql"))])
    return versions_dir, alembic_dir


def test_an_edited_landed_version_is_refused(copied_tree):
    versions_dir, _ = copied_tree
    path = versions_dir / "0002_queue.sql"
    path.write_text(path.read_text() + "\n-- one more line\n")
    assert sqlversion.manifest_problems() == [f"0002_queue.sql changed: {sqlversion.IMMUTABLE}"]


def test_an_unpinned_version_and_a_missing_revision_are_refused(copied_tree):
    versions_dir, alembic_dir = copied_tree
    (versions_dir / "9999_extra.sql").write_text("SELECT 1;\n")
    next(alembic_dir.glob("0003_*.py")).unlink()
    problems = sqlversion.manifest_problems()
    assert "9999_extra.sql is not in sql/versions/MANIFEST: run python tools/sqlversion.py new" in problems
    assert "version 0003 has 0 Alembic revisions in alembic/versions, not 1" in problems
    assert "version 9999 has 0 Alembic revisions in alembic/versions, not 1" in problems
