"""``pyalk server start|stop|status|url`` and what the demo says about its
server, on a real embedded PostgreSQL of its own (PYALK_EMBEDDED_DIR)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from pyalk import embedded
from pyalk.schema.install import head
from tests.cli.test_cli import no_ambient_database, run

__all__ = ["no_ambient_database"]

pytestmark = pytest.mark.slow


@pytest.fixture
def data_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="pyalk-cli-server-"))
    root.chmod(0o755)  # as root, the server runs as another user and must reach it
    monkeypatch.setenv("PYALK_EMBEDDED_DIR", str(root / "pg"))
    try:
        yield root / "pg"
    finally:
        embedded.stop(root / "pg")
        shutil.rmtree(root, ignore_errors=True)


def printed(out: str, label: str) -> str:
    match = re.search(rf"^  {label}:\s+(.*)$", out, re.M)
    assert match, out
    return match.group(1)


def test_start_status_url_stop_and_the_printed_commands_work(capsys, data_dir):
    code, out, err = run(capsys, "server", "status")
    assert code == 3 and "not running" in out and str(data_dir) in out, err

    code, out, err = run(capsys, "server", "start")
    assert code == 0, err
    assert f"data in {data_dir}" in out
    dsn = printed(out, "dsn")
    # The psql command as printed, run by a shell.
    result = subprocess.run(printed(out, "psql") + " -X -A -t -c 'SELECT version FROM alk.schema_info()'",
                            shell=True, capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout.strip()) == (0, head()), result.stderr
    export = printed(out, "pyalk")
    assert export.startswith("export PYALK_DSN=")
    result = subprocess.run(f"{export} && printenv PYALK_DSN", shell=True, capture_output=True, text=True)
    assert result.stdout.strip() == dsn

    code, out, _ = run(capsys, "server", "url")
    assert (code, out.strip()) == (0, dsn)
    code, out, _ = run(capsys, "server", "status")
    assert code == 0 and printed(out, "dsn") == dsn
    assert run(capsys, "enqueue", "q", "1", "--dsn", dsn)[0] == 0  # a pyalk database, migrated

    code, out, _ = run(capsys, "server", "stop")
    assert code == 0 and f"stopped; its data stays in {data_dir}" in out
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(dsn, connect_timeout=5).close()
    code, _, err = run(capsys, "server", "url")
    assert code == 1 and "not running" in err and "pyalk server start" in err
    code, out, _ = run(capsys, "server", "stop", "--delete")
    assert code == 0 and f"was not running; removed {data_dir}" in out
    assert not data_dir.exists()


def test_delete_goes_with_stop(capsys, data_dir):
    code, _, err = run(capsys, "server", "status", "--delete")
    assert code == 2 and "--delete goes with pyalk server stop" in err


def test_the_demo_says_where_its_data_lives_and_how_to_remove_it(capsys, data_dir):
    code, out, err = run(capsys, "demo", "--jobs", "50", "--workers", "2")
    assert code == 0, err
    assert f"its data stays in {data_dir}" in out and "pyalk server stop --delete" in out
    assert "pyalk migrated to version" in out  # styled, not markup printed as text
    assert not embedded.info(data_dir).running

    code, out, err = run(capsys, "demo", "--jobs", "50", "--workers", "2", "--keep-server")
    assert code == 0, err
    assert f"keeps running: data in {data_dir}" in out
    result = subprocess.run(printed(out, "psql") + " -X -A -t -c 'SELECT 1'", shell=True,
                            capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "1", result.stderr
    assert "pyalk server stop --delete" in out
