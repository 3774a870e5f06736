"""The PL/Proxy router row: enqueue_batch and claim + ack_batch throughput
through the router over 1, 2 and 4 partitions, and on one database without
a router (docs/scale-out.md). It runs on its own Debian PostgreSQL 15 server
(bench/pg15.py) holding the router and the partitions as databases."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import psycopg

from bench.pg15 import Pg15, missing
from bench.registry import Context, Row, RowResult, row

CLIENTS = 2
QUEUES = 8
BATCH = 100


def _clients(target: Any, count: int) -> float:
    """Run ``target(client_index)`` on ``count`` threads; the wall seconds."""
    threads = [threading.Thread(target=target, args=(i,)) for i in range(count)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def _measure(dsn: str, seconds: float) -> dict[str, float]:
    payloads = [json.dumps({"n": i}) for i in range(BATCH)]
    enqueued = [0] * CLIENTS

    def enqueue(client: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            deadline, k = time.perf_counter() + seconds, client
            while time.perf_counter() < deadline:
                conn.execute("SELECT count(*) FROM alk.enqueue_batch(%s, %s::jsonb[])",
                             [f"bench{k % QUEUES}", payloads])
                enqueued[client] += BATCH
                k += CLIENTS

    enqueue_s = _clients(enqueue, CLIENTS)
    settled = [0] * CLIENTS

    def drain(client: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for queue in (f"bench{k}" for k in range(client, QUEUES, CLIENTS)):
                while True:
                    rows = conn.execute("SELECT id, attempts FROM alk.claim(%s, 'w', %s)", [queue, BATCH]).fetchall()
                    if not rows:
                        break
                    conn.execute("SELECT alk.ack_batch(%s, 'w', %s, queue => %s)",
                                 [[r[0] for r in rows], [r[1] for r in rows], queue])
                    settled[client] += len(rows)

    drain_s = _clients(drain, CLIENTS)
    return {"enqueue_batch jobs/s": sum(enqueued) / enqueue_s, "claim+ack jobs/s": sum(settled) / drain_s}


def _create(conn: psycopg.Connection, server: Pg15, name: str, template: str = "template1") -> str:
    conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    return server.dsn(name)


@row(
    "scale.router",
    "scale",
    "PL/Proxy router: 1, 2, 4 partitions",
    f"enqueue_batch ({BATCH} jobs a call) and claim {BATCH} + ack_batch throughput, {CLIENTS} clients over "
    f"{QUEUES} queues, through the PL/Proxy router on 1, 2 and 4 partition databases of one PostgreSQL 15 "
    "server, and on one database without a router.",
    requires=lambda ctx: missing(),
)
def router_row(ctx: Context) -> RowResult:
    from pyalk.schema import migrate, router

    started = time.perf_counter()
    seconds = 1.0 if ctx.mode.quick else 5.0
    server = Pg15("-c synchronous_commit=off")
    server.start()
    records: list[dict[str, Any]] = []
    try:
        with psycopg.connect(server.dsn("postgres"), autocommit=True) as admin:
            migrate.upgrade(_create(admin, server, "alk_template"))
            setups: list[tuple[str, str]] = [("none (one database)", _create(admin, server, "direct", "alk_template"))]
            for count in (1, 2, 4):
                partitions = [_create(admin, server, f"r{count}_p{i}", "alk_template") for i in range(count)]
                dsn = _create(admin, server, f"router{count}")
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute(router.router_install(partitions))
                setups.append((f"router, {count} partition{'s' if count > 1 else ''}", dsn))
        ctx.progress.start("router", total=len(setups))
        for label, dsn in setups:
            measured = _measure(dsn, seconds)
            records.append({"path": label, **{k: round(v) for k, v in measured.items()}})
            ctx.progress.advance()
    finally:
        server.stop()
    return RowResult(
        key="scale.router",
        title="PL/Proxy router: 1, 2, 4 partitions",
        status="ok",
        columns=["path", "enqueue_batch jobs/s", "claim+ack jobs/s"],
        records=records,
        notes=[f"{seconds:g} s of enqueue_batch per path, then a full drain; synchronous_commit off. Every "
               "partition is a database of the same server on the same cores: this shows the router's cost "
               "and that the path is correct, not the scale a partition per machine gives."],
        seconds=time.perf_counter() - started,
    )


#: This module's rows, in report order (bench/rows.py collects them).
ROWS: tuple[Row, ...] = (router_row,)
