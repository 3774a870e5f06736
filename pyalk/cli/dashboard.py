"""The ``pyalk dashboard`` and ``pyalk metrics`` commands, and the worker's
``--metrics-port`` (docs/dashboard.md). They need the optional ``dashboard``
extra, imported only when a command runs."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import threading
from typing import Any

from rich.console import Console

from pyalk.cli.common import Commands, database, database_options, port

HINT = "pip install 'pyalk[dashboard]'"
_EXTRA = ("starlette", "jinja2", "uvicorn", "prometheus_client")


class ExtraMissing(RuntimeError):
    """The dashboard extra is not installed: one line with the fix."""


def _require_extra(command: str) -> None:
    missing = [name for name in _EXTRA if importlib.util.find_spec(name) is None]
    if missing:
        raise ExtraMissing(f"pyalk {command} needs the dashboard extra ({', '.join(missing)} missing): {HINT}")


def _exact_limit(text: str) -> int:
    value = int(text)
    if value < -1:
        raise argparse.ArgumentTypeError(f"must be -1 (always exact) or more, got {value}")
    return value


def cmd_dashboard(args: argparse.Namespace, console: Console) -> None:
    _require_extra("dashboard")
    dsn = database(args)
    uvicorn = importlib.import_module("uvicorn")
    app_module = importlib.import_module("pyalk.dashboard.app")
    token = os.environ.get("PYALK_DASHBOARD_TOKEN") or None
    # Unset: the dashboard's default; -1: every count exact.
    limit = {} if args.exact_limit is None else {"exact_limit": None if args.exact_limit == -1 else args.exact_limit}
    app = app_module.create_app(dsn, token=token, read_only=args.read_only, **limit)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)


def cmd_metrics(args: argparse.Namespace, console: Console) -> None:
    _require_extra("metrics")
    dsn = database(args)
    metrics = importlib.import_module("pyalk.dashboard.metrics")
    metrics.serve(args.port, args.host, conninfo=dsn)
    print(f"pyalk metrics on http://{args.host}:{args.port}/metrics", flush=True)
    threading.Event().wait()  # the exporter serves from its own thread until interrupted


def register(commands: Commands) -> None:
    dashboard = commands.add_parser("dashboard", help="serve the web dashboard (needs pyalk[dashboard])")
    dashboard.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    dashboard.add_argument("--port", type=port, default=8080, help="port (default: %(default)s)")
    dashboard.add_argument("--read-only", action="store_true", help="offer no actions, whatever the role may do")
    # The dashboard's own limit (pyalk.dashboard.data.EXACT_LIMIT) is not read
    # here: that would import the optional extra for every command's parser.
    dashboard.add_argument("--exact-limit", type=_exact_limit, metavar="N",
                           help="count each queue's states exactly up to N and estimate past it (default: the "
                                "dashboard's, docs/dashboard.md; -1: always exact, at a cost linear in the jobs)")
    database_options(dashboard)
    dashboard.set_defaults(run=cmd_dashboard)

    exporter = commands.add_parser("metrics", help="serve Prometheus metrics of queues and streams")
    exporter.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    exporter.add_argument("--port", type=port, default=9464, help="port (default: %(default)s)")
    database_options(exporter)
    exporter.set_defaults(run=cmd_metrics)


def add_worker_option(worker: argparse.ArgumentParser) -> None:
    worker.add_argument("--metrics-port", type=port,
                        help="serve this worker's counters and latencies and the queue's depth as Prometheus "
                             "metrics on 127.0.0.1:PORT (needs pyalk[dashboard])")


def worker_observer(args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    """With --metrics-port: start the exporter (the queue's metrics and this
    worker's) and return the worker option that hands it the observer."""
    if not getattr(args, "metrics_port", None):
        return {}
    _require_extra("worker --metrics-port")
    metrics = importlib.import_module("pyalk.dashboard.metrics")
    # The worker's series exist before the exporter serves: a scrape never
    # sees a half-registered worker (the test's first scrape raced it).
    observer = metrics.WorkerMetrics(args.queue, metrics.CollectorRegistry())
    metrics.serve(args.metrics_port, conninfo=dsn, registry=observer.registry)
    return {"observer": observer}
