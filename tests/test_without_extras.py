"""pyalk installed without its extras: ``import pyalk`` and building both
workers never import prometheus_client (the ``dashboard`` extra's), so a
worker's observer protocol lives with the worker, not with the metrics; and
without opentelemetry (the ``otel`` extra's) tracing is a no-op that leaves
headers as given."""

from __future__ import annotations

import subprocess
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = """
import importlib.util, sys
assert importlib.util.find_spec("prometheus_client") is None, "the venv has the dashboard extra"
assert importlib.util.find_spec("opentelemetry") is None, "the venv has the otel extra"
import pyalk
from pyalk import tracing

async def handler(job):
    pass

with pyalk.Alk("dbname=nowhere") as alk:
    worker = alk.worker("q", lambda job: None, listen_conninfo="dbname=nowhere")
async_worker = pyalk.AsyncWorker(pyalk.AsyncAlk("dbname=nowhere").queue("q"), handler, listen_conninfo="dbname=nowhere")
assert (worker.state, async_worker.state) == (pyalk.worker.WorkerState.NEW,) * 2
assert pyalk.__file__.startswith(sys.prefix), pyalk.__file__
with tracing.Enqueue("q", {"tenant": "a"}) as span:
    assert span.headers == {"tenant": "a"}
assert tracing.process(None) is None
loaded = sorted(name for name in sys.modules
                if name.partition(".")[0] in ("prometheus_client", "starlette", "opentelemetry"))
print(",".join(loaded) or "none")
"""


@pytest.mark.slow
def test_pyalk_and_its_workers_need_no_prometheus_nor_opentelemetry(tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env_dir)
    python = str(env_dir / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", str(ROOT)], check=True, timeout=600, capture_output=True)
    # Run from tmp_path so the source checkout is not importable.
    result = subprocess.run([python, "-c", SCRIPT], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "none"
