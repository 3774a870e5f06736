"""The Node examples of docs/clients.md run as they are against a migrated
database, with node and the `pg` package (installed once per session into the
test's temporary directory). Each example asserts what it prints, so a wrong
answer fails it. Skips, saying why, when node or npm is unavailable."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict

DOCS = Path(__file__).resolve().parent.parent / "docs" / "clients.md"
EXAMPLES = re.findall(r"```js\n(.*?)```", DOCS.read_text(), re.S)


@pytest.fixture(scope="session")
def node_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with `pg` in its node_modules."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are needed to run the Node examples of docs/clients.md")
    project = tmp_path_factory.mktemp("node-clients")
    (project / "package.json").write_text('{"name": "pyalk-clients-doc", "private": true}\n')
    try:
        result = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--silent", "pg@8"], cwd=project,
                                capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        pytest.skip("npm install pg timed out (is the npm registry reachable?)")
    if result.returncode != 0:
        pytest.skip(f"npm install pg failed (is the npm registry reachable?): {result.stderr.strip()[-500:]}")
    return project


def pg_environment(dsn: str) -> dict[str, str]:
    """The libpq-style PG* variables `pg` reads, from a conninfo."""
    params = conninfo_to_dict(dsn)
    names = {"host": "PGHOST", "port": "PGPORT", "user": "PGUSER", "dbname": "PGDATABASE", "password": "PGPASSWORD"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env.update({names[key]: str(value) for key, value in params.items() if key in names and value is not None})
    return env


def test_the_page_has_node_examples() -> None:
    assert len(EXAMPLES) == 3


@pytest.mark.parametrize("index", range(len(EXAMPLES)))
def test_node_example_runs(node_project: Path, dsn: str, index: int) -> None:
    script = node_project / f"example{index}.js"
    script.write_text(EXAMPLES[index])
    result = subprocess.run(["node", str(script)], cwd=node_project, env=pg_environment(dsn), capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
