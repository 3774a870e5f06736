"""docs/migrations.md's "From your own Alembic environment", verbatim: a
user's Alembic project (made by ``alembic init``) runs pyalk's chain from one
of its revisions, or from its env.py, with ``alembic upgrade head`` in a
subprocess; afterwards pyalk's schema and the user's own tables are there."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy.engine import URL

from pyalk.schema.install import head

DOC = Path(__file__).resolve().parents[2] / "docs" / "migrations.md"


def recipe_blocks() -> tuple[str, str]:
    """The section's two python blocks: a revision file, then an env.py."""
    text = DOC.read_text()
    section = text[text.index("## From your own Alembic environment"):]
    section = section[:section.index("\n## ", 1)]
    revision, env = re.findall(r"```python\n(.*?)```", section, re.S)
    return revision, env


def alembic_project(tmp_path: Path, dsn: str) -> Path:
    """What ``alembic init`` gives a user, pointed at the test database."""
    alembic = Path(sys.executable).with_name("alembic")
    subprocess.run([str(alembic), "init", "migrations"], cwd=tmp_path, check=True, capture_output=True)
    params = {key: str(value) for key, value in conninfo_to_dict(dsn).items()}
    host = params.get("host", "localhost")
    socket = host.startswith("/")  # a unix socket directory goes in the query
    url = URL.create("postgresql+psycopg", username=params.get("user", "postgres"), password=params.get("password"),
                     host=None if socket else host, port=int(params["port"]) if "port" in params else None,
                     database=params["dbname"], query={"host": host} if socket else {})
    ini = tmp_path / "alembic.ini"
    rendered = url.render_as_string(hide_password=False).replace("%", "%%")
    ini.write_text(re.sub(r"(?m)^sqlalchemy\.url = .*$", lambda _: f"sqlalchemy.url = {rendered}", ini.read_text()))
    return tmp_path / "migrations"


def alembic_upgrade(project: Path) -> None:
    alembic = Path(sys.executable).with_name("alembic")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    result = subprocess.run([str(alembic), "upgrade", "head"], cwd=project.parent, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def installed(dsn: str, table: str) -> tuple[object, ...]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT (SELECT version FROM alk.schema_info()),"
            " (SELECT version_num FROM alk.alembic_version),"
            " (SELECT version_num FROM public.alembic_version),"
            " to_regclass(%s) IS NOT NULL", [table]).fetchone()
    assert row is not None
    return tuple(row)


def test_the_doc_has_both_recipes():
    revision, env = recipe_blocks()
    assert "def upgrade()" in revision and "upgrade_connection(op.get_bind())" in revision
    assert "run_migrations_online()" in env and "upgrade_connection(connection)" in env


@pytest.mark.slow
def test_from_one_of_your_revisions(tmp_path, empty_db):
    dsn = empty_db()
    project = alembic_project(tmp_path, dsn)
    revision, _ = recipe_blocks()
    (project / "versions" / "app0001_invoices.py").write_text(revision)
    alembic_upgrade(project)
    assert installed(dsn, "public.invoices") == (head(), head(), "app0001", True)
    alembic_upgrade(project)  # again: nothing to do on either lineage
    assert installed(dsn, "public.invoices") == (head(), head(), "app0001", True)


@pytest.mark.slow
def test_from_your_env_py(tmp_path, empty_db):
    dsn = empty_db()
    project = alembic_project(tmp_path, dsn)
    _, env = recipe_blocks()
    (project / "env.py").write_text(env)
    (project / "versions" / "app0001_orders.py").write_text(
        'from alembic import op\n\nrevision = "app0001"\ndown_revision = None\n\n\n'
        'def upgrade() -> None:\n    op.execute("CREATE TABLE orders (id bigint PRIMARY KEY)")\n')
    alembic_upgrade(project)
    assert installed(dsn, "public.orders") == (head(), head(), "app0001", True)
