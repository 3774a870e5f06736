"""Landed version files are immutable: each one's sha256 is pinned (0001-0048
in sql/versions/MANIFEST, closed since, each later one in its own
NNNN_<name>.sql.sha256), and each version has its one Alembic revision. The rule lives in
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


def test_every_version_file_matches_its_pin_and_has_its_revision():
    assert sqlversion.manifest_problems() == []


@pytest.fixture
def copied_tree(tmp_path, monkeypatch):
    """sql/versions and alembic/versions copied, and the tool pointed at the copy."""
    versions_dir = tmp_path / "sql" / "versions"
    alembic_dir = tmp_path / "alembic" / "versions"
    shutil.copytree(ROOT / "sql" / "versions", versions_dir)
    shutil.copytree(ROOT / "alembic" / "versions", alembic_dir, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(sqlversion, "MANIFEST", versions_dir / "MANIFEST")
    monkeypatch.setattr(sqlversion, "VERSIONS", versions_dir)
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
    assert "9999_extra.sql is not pinned: run python tools/sqlversion.py new (or pin)" in problems
    assert "version 0003 has 0 Alembic revisions in alembic/versions, not 1" in problems
    assert "version 9999 has 0 Alembic revisions in alembic/versions, not 1" in problems


def test_an_edited_version_pinned_by_its_own_file_is_refused(copied_tree):
    versions_dir, _ = copied_tree
    path = versions_dir / "0049_rotation_drains_first.sql"
    path.write_text(path.read_text() + "\n-- one more line\n")
    assert sqlversion.manifest_problems() == [f"0049_rotation_drains_first.sql changed: {sqlversion.IMMUTABLE}"]


def test_manifest_is_closed(copied_tree):
    # It pins 0001-0048 and landed with them: a line more is refused, even a
    # right one, and a later version pinned there as well as in its own file.
    versions_dir, _ = copied_tree
    manifest = versions_dir / "MANIFEST"
    own = (versions_dir / "0049_rotation_drains_first.sql.sha256").read_text()
    manifest.write_text(manifest.read_text() + own)
    assert sqlversion.manifest_problems() == [
        "sql/versions/MANIFEST changed: it is closed since 0049 (it pins 0001-0048, landed); "
        "a newer version pins itself in NNNN_<name>.sql.sha256",
        "0049_rotation_drains_first.sql is pinned twice: in MANIFEST and in 0049_rotation_drains_first.sql.sha256",
    ]


def test_a_pin_file_pins_its_own_version_only(copied_tree):
    versions_dir, _ = copied_tree
    own = versions_dir / "0049_rotation_drains_first.sql.sha256"
    other = next(line for line in (versions_dir / "MANIFEST").read_text().splitlines() if "0048_" in line)
    own.write_text(own.read_text() + other + "\n")
    assert "0049_rotation_drains_first.sql.sha256 pins 0048_rotation_counts_by_statistics.sql, not its own version" \
        in sqlversion.manifest_problems()


def test_pin_refreshes_the_own_pin_of_a_version_not_landed_and_never_manifest(copied_tree, monkeypatch):
    versions_dir, _ = copied_tree
    manifest = (versions_dir / "MANIFEST").read_text()
    path = versions_dir / "0049_rotation_drains_first.sql"
    path.write_text(path.read_text() + "\n-- edited before it lands\n")
    monkeypatch.setattr(sqlversion, "_landed", lambda version, base: False)
    assert sqlversion.pin() == [path.name]
    assert sqlversion.manifest_problems() == []
    assert (versions_dir / "MANIFEST").read_text() == manifest
    path.write_text(path.read_text() + "-- and after it landed\n")
    monkeypatch.setattr(sqlversion, "_landed", lambda version, base: True)
    with pytest.raises(SystemExit, match="a landed version is immutable"):
        sqlversion.pin()
