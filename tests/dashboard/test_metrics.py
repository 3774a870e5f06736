"""Prometheus metrics: the dashboard's /metrics, the `pyalk metrics`
exporter, a worker's observer, and the CLI's entry points."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from pyalk import Alk, QueueOpts
from pyalk.cli import dashboard as cli_dashboard
from pyalk.cli.common import literal_console
from pyalk.dashboard import metrics
from pyalk.worker.observer import WorkerObserver
from tests.dashboard.conftest import HOSTILE, ROOT, free_port
from tests.helpers import until


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_dashboard_metrics_depth_dead_age_and_consumer_lag(client):
    response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    got = samples(response.text)
    assert got[("pyalk_up", ())] == 1
    assert got[("pyalk_queue_jobs", (("queue", "emails"), ("state", "ready")))] == 28
    assert got[("pyalk_queue_jobs", (("queue", "emails"), ("state", "scheduled")))] == 1
    assert got[("pyalk_queue_jobs", (("queue", "emails"), ("state", "processing")))] == 2
    assert got[("pyalk_queue_dead_jobs", (("queue", HOSTILE),))] == 1  # label values are data, quoted
    assert got[("pyalk_queue_oldest_ready_age_seconds", (("queue", "emails"),))] >= 0
    assert got[("pyalk_stream_head_offset", (("stream", HOSTILE),))] == 75
    assert got[("pyalk_stream_consumer_lag", (("consumer", HOSTILE), ("stream", HOSTILE)))] == 15
    assert all(name.startswith("pyalk_") for name, _ in got)


def test_the_exporter_serves_the_database_metrics_and_reports_down(seeded):
    port = free_port()
    metrics.serve(port, conninfo=seeded.dsn)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    assert samples(text)[("pyalk_queue_jobs", (("queue", "reports"), ("state", "dead")))] == 1
    down = metrics.QueueMetrics("host=/nonexistent-socket-dir dbname=x connect_timeout=1")
    assert samples(down.render().decode())[("pyalk_up", ())] == 0


def test_worker_metrics_count_outcomes_in_flight_and_latencies():
    registry = CollectorRegistry()
    observer: WorkerObserver = metrics.WorkerMetrics("emails", registry)
    observer.on_claimed(5, 0.002)
    observer.on_claimed(0, 0.001)
    for _ in range(5):
        observer.on_handler(0.03)
    observer.on_settled("acked", 3, 0.004)
    observer.on_settled("retried", 1, 0.002)
    with pytest.raises(ValueError, match="outcome must be one of"):
        observer.on_settled("exploded", 1, 0.1)
    got = samples(metrics.generate_latest(registry).decode())
    q = (("queue", "emails"),)
    assert got[("pyalk_worker_claimed_total", q)] == 5
    assert got[("pyalk_worker_in_flight", q)] == 1
    assert got[("pyalk_worker_settled_total", (("outcome", "acked"), ("queue", "emails")))] == 3
    assert got[("pyalk_worker_settled_total", (("outcome", "lost"), ("queue", "emails")))] == 0
    assert got[("pyalk_worker_claim_seconds_count", q)] == 2
    assert got[("pyalk_worker_handler_seconds_count", q)] == 5
    assert got[("pyalk_worker_handler_seconds_bucket", (("le", "0.05"), ("queue", "emails")))] == 5
    assert got[("pyalk_worker_settle_seconds_count", (("outcome", "acked"), ("queue", "emails")))] == 1


def test_cli_has_dashboard_and_metrics_and_worker_metrics_port():
    for command in (["dashboard", "--help"], ["metrics", "--help"], ["worker", "--help"]):
        result = subprocess.run([sys.executable, "-m", "pyalk", *command], capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 0, result.stderr
    dashboard = subprocess.run([sys.executable, "-m", "pyalk", "dashboard", "--help"], capture_output=True, text=True)
    assert "127.0.0.1" in dashboard.stdout and "8080" in dashboard.stdout
    worker = subprocess.run([sys.executable, "-m", "pyalk", "worker", "--help"], capture_output=True, text=True)
    assert "--metrics-port" in worker.stdout
    refused = subprocess.run([sys.executable, "-m", "pyalk", "dashboard", "--exact-limit", "-2"], capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 2 and "--exact-limit" in refused.stderr and "-1" in refused.stderr


def test_without_the_extra_the_cli_says_how_to_get_it(monkeypatch):
    real = cli_dashboard.importlib.util.find_spec
    monkeypatch.setattr(cli_dashboard.importlib.util, "find_spec",
                        lambda name, *a: None if name == "uvicorn" else real(name, *a))
    with pytest.raises(cli_dashboard.ExtraMissing) as caught:
        cli_dashboard.cmd_dashboard(cli_dashboard.argparse.Namespace(read_only=False), literal_console())
    assert str(caught.value).endswith("pip install 'pyalk[dashboard]'")
    assert "\n" not in str(caught.value)


def test_pyalk_dashboard_serves_on_loopback(seeded):
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "pyalk", "dashboard", "--dsn", seeded.dsn, "--port", str(port),
                                "--exact-limit", "5"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        body = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # poll until it answers
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as response:
                    body = response.read().decode()
                break
            except OSError:
                if process.poll() is not None:
                    raise AssertionError(process.stderr.read().decode() if process.stderr else "exited") from None
                time.sleep(0.1)
        assert body and "emails" in body
        assert 'class="estimate"' in body  # emails' 28 ready jobs, past --exact-limit 5
    finally:
        process.terminate()
        process.wait(10)


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return samples(response.read().decode())
    except OSError:
        return None


@pytest.mark.parametrize("target", ["observed", "observed_async"])
def test_a_cli_worker_serves_its_counters_and_latencies(dsn, db, target):
    # Two attempts, retries due at once: each outcome the SQL reports, one lost and one snoozed.
    kinds = ["ok"] * 20 + ["flaky"] * 5 + ["broken"] * 3 + ["permanent"] * 2 + ["self-ack"] + ["sleepy"]
    with Alk(dsn) as alk:
        alk.queue("q", QueueOpts(backoff_base_s=0, max_attempts=2)).enqueue_batch(
            [{"kind": kind, "i": i} for i, kind in enumerate(kinds)])
    runs = 20 + 5 * 2 + 3 * 2 + 2 + 1 + 2
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "pyalk", "worker", f"tests.dashboard.worker_handlers:{target}", "-q", "q",
         "--concurrency", "4", "--metrics-port", str(port), "--dsn", dsn],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    q = (("queue", "q"),)

    def settled(outcome: str) -> tuple[str, tuple[tuple[str, str], ...]]:
        return "pyalk_worker_settled_total", (("outcome", outcome), ("queue", "q"))

    got: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def every_run_settled() -> bool:
        if process.poll() is not None:
            raise AssertionError(process.stderr.read().decode() if process.stderr else "exited")
        got.clear()
        got.update(scrape(port) or {})
        # One scrape reads the queue's rows before it renders the worker's
        # counters: wait for one that began after the last settle.
        return (bool(got) and sum(got[settled(o)] for o in metrics.OUTCOMES) >= runs
                and got[("pyalk_queue_dead_jobs", q)] == 5)

    try:
        until(every_run_settled, "/metrics to count every handler run and the queue's 5 dead jobs", deadline=60)
        assert {o: got[settled(o)] for o in metrics.OUTCOMES} == {
            "acked": 26, "retried": 8, "failed": 5, "lost": 1, "snoozed": 1}
        assert got[("pyalk_worker_claimed_total", q)] == runs
        assert got[("pyalk_worker_in_flight", q)] == 0
        assert got[("pyalk_worker_released_total", q)] == 0
        assert got[("pyalk_worker_handler_seconds_count", q)] == runs
        assert got[("pyalk_worker_handler_seconds_bucket", (("le", "+Inf"), ("queue", "q")))] == runs
        assert got[("pyalk_worker_claim_seconds_count", q)] >= 1  # every call, the empty ones too
        for outcome in metrics.OUTCOMES:  # one observation per settle call that carried the outcome
            calls = got[("pyalk_worker_settle_seconds_count", (("outcome", outcome), ("queue", "q")))]
            assert 1 <= calls <= got[settled(outcome)]
        # The same port serves the database's view of the queue (5 dead: awaited above).
        assert got[("pyalk_up", ())] == 1
    finally:
        process.terminate()
        process.wait(30)
    assert process.returncode == 0, process.stderr.read().decode() if process.stderr else ""
