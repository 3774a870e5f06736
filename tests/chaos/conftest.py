"""Fixtures of the chaos suite: a private server per test module (restartable),
a fresh migrated database per test, the ledger directory, worker spawning and
the report every phase writes (printed, and JSON under the test's tmp dir and
the session's base tmp dir: chaos-report.json)."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pyalk.schema import migrate
from tests.chaos.harness import WorkerProcess
from tests.chaos.servers import PgServer


@pytest.fixture(scope="module")
def server_root() -> Iterator[Path]:
    # Short and outside pytest's tmp tree: a unix socket path must stay under 107 bytes.
    root = Path(tempfile.mkdtemp(prefix="alk-chaos-"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def server(server_root: Path) -> Iterator[PgServer]:
    pg = PgServer(server_root, "pg", 5432).init()
    pg.start()
    yield pg
    pg.destroy()


@pytest.fixture
def chaos_dsn(server: PgServer) -> str:
    if not server.running():
        server.start()
    dsn = server.create_database("chaos")
    migrate.upgrade(dsn)
    return dsn


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    path = tmp_path / "ledger"
    path.mkdir()
    return path


@pytest.fixture
def spawn(ledger: Path) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start(dsn: str, name: str, *options: str, handler: str = "work") -> WorkerProcess:
        process = WorkerProcess(dsn, ledger, name, *options, handler=handler)
        started.append(process)
        return process

    yield start
    for process in started:
        if process.proc.poll() is None:
            process.kill()


@pytest.fixture
def report(request: pytest.FixtureRequest, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[dict[str, Any]]:
    figures: dict[str, Any] = {}
    yield figures
    name = request.node.name
    (tmp_path / "recovery.json").write_text(json.dumps(figures, indent=2))
    session = tmp_path_factory.getbasetemp() / "chaos-report.json"
    everything = json.loads(session.read_text()) if session.exists() else {}
    everything[name] = figures
    session.write_text(json.dumps(everything, indent=2))
    print(f"\nchaos {name}: {json.dumps(figures)}")
