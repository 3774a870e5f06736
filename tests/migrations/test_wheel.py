"""The built wheel carries sql/ and alembic/ and migrates a database on its own."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from pyalk.schema import migrate
from pyalk.schema.install import current_files, current_name, head, versions
from tests.migrations.catalog import snapshot

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_installs_into_a_fresh_venv_and_migrates(tmp_path, empty_db):
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(ROOT)],
                   check=True, capture_output=True, timeout=600)
    (wheel,) = dist.glob("pyalk-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for version in versions():
        assert f"pyalk/sql/versions/{version.path.name}" in names
        assert f"pyalk/alembic/versions/{version.number}_{version.mechanism}.py" in names
    for path in current_files():
        assert f"pyalk/sql/{current_name(path)}" in names
    assert "pyalk/sql/versions/MANIFEST" in names
    assert "pyalk/alembic/env.py" in names and "pyalk/py.typed" in names

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", str(wheel)], check=True, timeout=600,
                   capture_output=True)
    dsn = empty_db()
    # Run from tmp_path so the source checkout is not importable.
    result = subprocess.run([str(env_dir / "bin" / "pyalk"), "migrate", "--dsn", dsn], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert migrate.current(dsn) == head()
    where = subprocess.run([str(python), "-c", "import pyalk, pathlib; print(pathlib.Path(pyalk.__file__).parent)"],
                           cwd=tmp_path, capture_output=True, text=True, check=True).stdout.strip()
    assert where.startswith(str(env_dir))
    reference = empty_db()
    migrate.upgrade(reference)
    assert snapshot(dsn) == snapshot(reference)
