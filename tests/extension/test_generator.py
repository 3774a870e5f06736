"""The generated extension files follow sql/: one file per step of the chain,
the head installed from the current files, and only the listed statements
filtered out. Also from the installed wheel."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from pyalk import cli
from pyalk.schema import extension
from pyalk.schema.install import BOOTSTRAP, current_files, head, versions

ROOT = Path(__file__).resolve().parents[2]


def test_the_files_follow_the_chain():
    chain = versions()
    names = set(extension.files())
    steps = {f"alk--{a.number}--{b.number}.sql" for a, b in itertools.pairwise(chain)}
    assert names == {"alk.control", f"alk--{chain[0].number}.sql", f"alk--{head()}.sql", *steps}


def test_the_control_file_names_the_head_the_schema_and_no_superuser():
    settings = dict(re.findall(r"^(\w+) = (.*)$", extension.files()["alk.control"], re.MULTILINE))
    assert settings == {
        "comment": "'pyalk: job queues, streams, outbox, locks and a scheduler as SQL functions.'",
        "default_version": f"'{head()}'",
        "schema": "alk",
        "relocatable": "false",
        "superuser": "false",
        "trusted": "false",
    }


def test_each_script_runs_its_source_with_only_the_filtered_statements_removed():
    files = extension.files()
    chain = versions()
    sources = {f"alk--{chain[0].number}.sql": [chain[0].sql()],
               f"alk--{head()}.sql": [p.read_text(encoding="utf-8") for p in current_files()]}
    for older, newer in itertools.pairwise(chain):
        sources[f"alk--{older.number}--{newer.number}.sql"] = [newer.sql()]
    for name, texts in sources.items():
        for text in texts:
            assert extension.filter_sql(text) in files[name], f"{name} does not carry its source"
        assert not re.search(r"^\s*CREATE SCHEMA", files[name], re.MULTILINE | re.IGNORECASE), name
        assert f"VALUES ('{name.removesuffix('.sql').split('--')[-1]}')" in files[name], f"{name} records its version"


def test_the_filter_removes_create_schema_and_nothing_else():
    for text in [BOOTSTRAP, *(v.sql() for v in versions()), *(p.read_text() for p in current_files())]:
        before, after = text.splitlines(), extension.filter_sql(text).splitlines()
        assert len(before) == len(after)
        changed = [(b, a) for b, a in zip(before, after, strict=True) if b != a]
        assert all(b.strip() in extension.FILTERED and a.startswith("-- filtered") for b, a in changed)
        assert len(changed) == text.count("CREATE SCHEMA")


def test_cli_and_module_write_the_generated_files(tmp_path: Path):
    assert cli.main(["extension", "--out", str(tmp_path / "cli")]) == 0
    assert extension.main([str(tmp_path / "module")]) == 0
    for where in ("cli", "module"):
        written = {p.name: p.read_text(encoding="utf-8") for p in (tmp_path / where).iterdir()}
        assert written == extension.files()


@pytest.mark.slow
def test_the_installed_wheel_writes_the_same_files(tmp_path: Path):
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(ROOT)],
                   check=True, capture_output=True, timeout=600)
    (wheel,) = dist.glob("pyalk-*.whl")
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    subprocess.run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)], check=True,
                   timeout=600, capture_output=True)
    out = tmp_path / "out"
    # From tmp_path, so the source checkout is not importable: the wheel's pyalk/sql is read.
    result = subprocess.run([str(env_dir / "bin" / "pyalk"), "extension", "--out", str(out)], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert {p.name: p.read_text(encoding="utf-8") for p in out.iterdir()} == extension.files()
