"""The registry of workers (sql/workers.sql, docs/contract.md#workers): what
an operator calls, alk.workers() (``workers``) and alk.request_stop
(``request_stop``), and what a worker calls about itself,
alk.worker_register, alk.worker_beat and alk.worker_deregister (``register``,
``beat``, ``deregister``; pyalk's own worker calls them from
pyalk/_async/worker/registry.py). None of them is per job.

``queue`` on beat, deregister and request_stop is routing for a sharded
deployment (docs/scale-out.md): given, a row of another queue is not found.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyalk import _codec
from pyalk.values import WORKER_INFO_COLUMNS, WorkerInfo, worker_info_from_row

if TYPE_CHECKING:
    from psycopg import AsyncConnection

    from pyalk._async.executor import AsyncExecutor

_WORKERS = "SELECT " + WORKER_INFO_COLUMNS + " FROM alk.workers()"
_REQUEST_STOP = "SELECT alk.request_stop(worker_id => %(worker_id)s, queue => %(queue)s::text)"
_REGISTER = """SELECT alk.worker_register(
    worker_id => %(worker_id)s, queue => %(queue)s, host => %(host)s::text, pid => %(pid)s::bigint,
    concurrency => %(concurrency)s::bigint, version => %(version)s::text)"""
_BEAT = "SELECT alk.worker_beat(worker_id => %(worker_id)s, running => %(running)s::bigint, queue => %(queue)s::text)"
_DEREGISTER = "SELECT alk.worker_deregister(worker_id => %(worker_id)s, queue => %(queue)s::text)"


async def workers(executor: AsyncExecutor, *, conn: AsyncConnection | None = None) -> list[WorkerInfo]:
    """``alk.workers()``: every registered worker (those of its queues for a
    role with name limits), by worker_id."""
    return [worker_info_from_row(row) for row in await executor.rows(_WORKERS, {}, conn=conn, transactional=True)]


async def request_stop(executor: AsyncExecutor, worker_id: str, queue: str | None = None, *,
                       conn: AsyncConnection | None = None) -> bool:
    """``alk.request_stop``: ask the worker to drain and exit (it learns at
    the commit); whether it was registered."""
    params = {"worker_id": _codec.text(worker_id, "worker_id"), "queue": _codec.text(queue, "queue")}
    return bool(await executor.value(_REQUEST_STOP, params, conn=conn, transactional=True))


async def register(executor: AsyncExecutor, worker_id: str, queue: str, *, host: str | None, pid: int | None,
                   concurrency: int, version: str | None) -> str:
    """``alk.worker_register``: the worker's row, anew; its control channel."""
    params = {"worker_id": _codec.text(worker_id, "worker_id"), "queue": _codec.text(queue, "queue"),
              "host": _codec.text(host, "host"), "pid": _codec.bigint(pid, "pid"),
              "concurrency": _codec.bigint(concurrency, "concurrency"), "version": _codec.text(version, "version")}
    return str(await executor.value(_REGISTER, params))


async def beat(executor: AsyncExecutor, worker_id: str, running: int, queue: str | None = None) -> bool | None:
    """``alk.worker_beat``: stamp the row with the jobs held now; whether to
    stop, None when the row is gone (register again)."""
    params = {"worker_id": _codec.text(worker_id, "worker_id"), "running": _codec.bigint(running, "running"),
              "queue": _codec.text(queue, "queue")}
    stopping = await executor.value(_BEAT, params)
    return None if stopping is None else bool(stopping)


async def deregister(executor: AsyncExecutor, worker_id: str, queue: str | None = None) -> bool:
    """``alk.worker_deregister``: remove the row; whether there was one."""
    params = {"worker_id": _codec.text(worker_id, "worker_id"), "queue": _codec.text(queue, "queue")}
    return bool(await executor.value(_DEREGISTER, params))
