"""What every peer runner shares: arguments, the result line, the clock."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

CHUNK = 1_000  # jobs per bulk-enqueue call

#: ALK_BENCH_ANALYZE=1: once its jobs are in, the runner takes the planner's
#: statistics of its database (ANALYZE) before its worker starts, as
#: autovacuum's auto-analyze does for a table that has changed by a tenth.
#: A fresh database has none, and a plan made without them can be slower
#: (graphile-worker's ran 18-21k jobs/s without, 23-27k with, 2026-12-06).
ANALYZE_ENV = "ALK_BENCH_ANALYZE"


class PeerUnavailable(Exception):
    """The peer (or pyalk's worker) cannot run here; the message says why."""


@dataclass
class PeerResult:
    peer: str
    version: str
    jobs: int
    concurrency: int
    enqueue_s: float
    process_s: float
    settings: dict[str, Any] = field(default_factory=dict)
    processed: int = 0
    #: Anything else the runner measured (the memory row's RSS by job count).
    measures: dict[str, Any] = field(default_factory=dict)

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.process_s if self.process_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["jobs_per_s"] = self.jobs_per_s
        data["enqueue_jobs_per_s"] = self.jobs / self.enqueue_s if self.enqueue_s > 0 else 0.0
        return data


@dataclass
class Args:
    dsn: str  # libpq conninfo of the peer's own database
    url: str  # the same database as a postgresql:// URL (asyncpg, node-postgres)
    jobs: int
    concurrency: int
    node_modules: str | None
    timeout: float


def parse_args(argv: list[str] | None = None) -> Args:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--node-modules", default=None)
    parser.add_argument("--timeout", type=float, default=600.0)
    ns = parser.parse_args(argv)
    return Args(ns.dsn, ns.url, ns.jobs, ns.concurrency, ns.node_modules, ns.timeout)


async def analyze_if_asked(dsn: str) -> None:
    """ANALYZE the runner's database (every table: each system's own) when
    the row asked for statistics before the worker starts (ANALYZE_ENV)."""
    if os.environ.get(ANALYZE_ENV, "") != "1":
        return
    import psycopg

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("ANALYZE")


class Countdown:
    """Counts handler runs; records when the last of N has run."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.count = 0
        self.started = 0.0
        self.finished: float | None = None
        self.done = asyncio.Event()

    def start(self) -> None:
        self.started = time.perf_counter()

    def tick(self) -> None:
        self.count += 1
        if self.count >= self.total and self.finished is None:
            self.finished = time.perf_counter()
            self.done.set()

    @property
    def elapsed(self) -> float:
        end = self.finished if self.finished is not None else time.perf_counter()
        return end - self.started


def main(run: Callable[[Args], Awaitable[PeerResult]]) -> None:
    args = parse_args()
    try:
        result = asyncio.run(asyncio.wait_for(run(args), timeout=args.timeout))
    except PeerUnavailable as error:
        print(json.dumps({"unavailable": str(error)}))
        sys.exit(3)
    print(json.dumps(result.to_json()))
