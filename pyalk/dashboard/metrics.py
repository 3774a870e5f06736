"""Prometheus metrics (docs/dashboard.md): the database's view of queues and
streams, read at scrape time through ``alk.*``, and a worker's own counters
and latencies, fed by the worker through :class:`WorkerMetrics`.

Needs the ``dashboard`` extra (prometheus-client).

A worker's counters come through its observer hook
(:class:`pyalk.worker.observer.WorkerObserver`, the worker's ``observer=``
option): :class:`WorkerMetrics` is one.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import Any

import psycopg
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from psycopg.rows import dict_row

from pyalk.worker.observer import OUTCOMES

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class WorkerMetrics:
    """A worker's counters and latency histograms for one queue, in
    ``registry``: a :class:`~pyalk.worker.observer.WorkerObserver`."""

    def __init__(self, queue: str, registry: CollectorRegistry) -> None:
        self.queue = queue
        self.registry = registry
        labels = ["queue"]
        self._claimed = Counter("pyalk_worker_claimed", "Jobs this worker claimed.", labels, registry=registry)
        self._settled = Counter("pyalk_worker_settled", "Jobs this worker settled, by outcome (acked, retried, "
                                "failed, lost: the claim was no longer valid, snoozed).", [*labels, "outcome"],
                                registry=registry)
        self._released = Counter("pyalk_worker_released", "Claimed jobs this worker let go unsettled: released "
                                 "unstarted, or left to their leases.", labels, registry=registry)
        self._in_flight = Gauge("pyalk_worker_in_flight", "Jobs claimed and not yet settled or released "
                                "(buffered, running, or waiting to be settled).", labels, registry=registry)
        self._claim = Histogram("pyalk_worker_claim_seconds", "Duration of one claim call.", labels,
                                buckets=_LATENCY_BUCKETS, registry=registry)
        self._settle = Histogram("pyalk_worker_settle_seconds", "Duration of one settle call.", [*labels, "outcome"],
                                 buckets=_LATENCY_BUCKETS, registry=registry)
        self._handler = Histogram("pyalk_worker_handler_seconds", "Duration of one handler run.", labels,
                                  buckets=_LATENCY_BUCKETS, registry=registry)
        # Every series exists from the start, at 0; the children are kept
        # (a labels() lookup takes a lock and a dict probe, per job).
        self._settled_by = {outcome: self._settled.labels(queue, outcome) for outcome in OUTCOMES}
        self._settle_by = {outcome: self._settle.labels(queue, outcome) for outcome in OUTCOMES}
        self._claimed_q = self._claimed.labels(queue)
        self._released_q = self._released.labels(queue)
        self._in_flight_q = self._in_flight.labels(queue)
        self._claim_q = self._claim.labels(queue)
        self._handler_q = self._handler.labels(queue)

    def on_claimed(self, n: int, seconds: float) -> None:
        self._claim_q.observe(seconds)
        if n > 0:
            self._claimed_q.inc(n)
            self._in_flight_q.inc(n)

    def on_handler(self, seconds: float) -> None:
        self._handler_q.observe(seconds)

    def on_settled(self, outcome: str, n: int, seconds: float) -> None:
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {', '.join(OUTCOMES)}, got {outcome!r}")
        self._settle_by[outcome].observe(seconds)
        if n > 0:
            self._settled_by[outcome].inc(n)
            self._in_flight_q.dec(n)

    def on_released(self, n: int) -> None:
        if n > 0:
            self._released_q.inc(n)
            self._in_flight_q.dec(n)


class _DatabaseCollector(Collector):
    """Reads queue and stream state at scrape time, on one connection kept
    open between scrapes (reopened after a failure)."""

    def __init__(self, conninfo: str) -> None:
        self.conninfo = conninfo
        self._conn: psycopg.Connection[dict[str, Any]] | None = None
        self._lock = threading.Lock()

    def _connection(self) -> psycopg.Connection[dict[str, Any]]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.conninfo, autocommit=True, row_factory=dict_row, connect_timeout=10,
                                         options="-c statement_timeout=5000 -c application_name=pyalk-metrics")
        return self._conn

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def _read(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
        with self._lock:
            try:
                conn = self._connection()
                queues = conn.execute("SELECT * FROM alk.queue_stats()").fetchall()
                streams = conn.execute("SELECT * FROM alk.stream_stats()").fetchall()
                consumers = conn.execute("SELECT * FROM alk.stream_consumer_lag()").fetchall()
            except psycopg.Error:
                if self._conn is not None:
                    self._conn.close()
                self._conn = None
                raise
        return queues, streams, consumers

    def collect(self) -> Iterable[Metric]:
        up = GaugeMetricFamily("pyalk_up", "1 when the last scrape read the database, else 0.")
        try:
            queues, streams, consumers = self._read()
        except psycopg.Error:
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from _queue_families(queues)
        yield from _stream_families(streams, consumers)


def _queue_families(queues: list[dict[str, Any]]) -> Iterator[Metric]:
    depth = GaugeMetricFamily("pyalk_queue_jobs", "Jobs in a queue by state: ready (pending and due), scheduled "
                              "(pending, due later), processing (lapsed leases included), dead.",
                              labels=["queue", "state"])
    lapsed = GaugeMetricFamily("pyalk_queue_lapsed_jobs", "Processing jobs whose lease ended (claimable again).",
                               labels=["queue"])
    dead = GaugeMetricFamily("pyalk_queue_dead_jobs", "Dead jobs kept for inspection.", labels=["queue"])
    oldest = GaugeMetricFamily("pyalk_queue_oldest_ready_age_seconds",
                               "Now minus the run_at of the oldest ready job (0 when none is ready).",
                               labels=["queue"])
    paused = GaugeMetricFamily("pyalk_queue_paused", "1 when the queue is paused.", labels=["queue"])
    has_paused = False
    for q in queues:
        name = q["queue"]
        for state in ("ready", "scheduled", "processing", "dead"):
            depth.add_metric([name, state], q[state])
        lapsed.add_metric([name], q["lapsed"])
        dead.add_metric([name], q["dead"])
        oldest.add_metric([name], q["oldest_ready_age_s"] or 0)
        if "paused" in q:
            has_paused = True
            paused.add_metric([name], 1 if q["paused"] else 0)
    yield from (depth, lapsed, dead, oldest)
    if has_paused:
        yield paused


def _stream_families(streams: list[dict[str, Any]], consumers: list[dict[str, Any]]) -> Iterator[Metric]:
    head = GaugeMetricFamily("pyalk_stream_head_offset", "The last offset a stream handed out.", labels=["stream"])
    for s in streams:
        head.add_metric([s["stream"]], s["head_offset"])
    lag = GaugeMetricFamily("pyalk_stream_consumer_lag", "Events published after a consumer's saved checkpoint.",
                            labels=["stream", "consumer"])
    for c in consumers:
        lag.add_metric([c["stream"], c["consumer"]], c["lag"])
    yield head
    yield lag


class QueueMetrics:
    """The database metrics in a registry of their own."""

    def __init__(self, conninfo: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._collector = _DatabaseCollector(conninfo)
        self.registry.register(self._collector)

    def render(self) -> bytes:
        """The registry in the Prometheus text format."""
        return generate_latest(self.registry)

    def close(self) -> None:
        self._collector.close()


def serve(port: int, host: str = "127.0.0.1", *, conninfo: str | None = None,
          registry: CollectorRegistry | None = None) -> CollectorRegistry:
    """Serve ``/metrics`` on host:port from a background thread: the
    database metrics when conninfo is given, plus whatever else is in
    ``registry`` (a worker's :class:`WorkerMetrics`). Returns the registry."""
    registry = registry or CollectorRegistry()
    if conninfo is not None:
        QueueMetrics(conninfo, registry)
    start_http_server(port, addr=host, registry=registry)
    return registry
