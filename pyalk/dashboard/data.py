"""What the dashboard reads and does, each one call of an ``alk.*`` function
(docs/dashboard.md). Nothing here decides a rule: the SQL does."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, LiteralString

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

Row = dict[str, Any]

#: The functions behind each action; an action is offered when the role may
#: execute its function (the read-only grants leave them out) and it exists
#: (pause/resume arrive with the queue's 0009, stop with the workers' 0024).
ACTIONS: dict[str, str] = {
    "requeue": "alk.requeue_dead(text, bigint[])",
    "cancel": "alk.cancel(text, bigint)",
    "pause": "alk.pause_queue(text)",
    "resume": "alk.resume_queue(text)",
    "stop": "alk.request_stop(text, text)",
}

#: The server's clock, for "in 5m" and "3s ago". Not alk.now(): called
#: directly it needs EXECUTE on an internal helper (alk._clock_setting_invalid)
#: that the documented grants leave out; the dashboard never pins the clock.
_NOW: LiteralString = "SELECT floor(extract(epoch FROM clock_timestamp()))::bigint AS now"

#: Every statement the dashboard sends is bounded: a slow read never piles up.
STATEMENT_TIMEOUT_MS = 5000
#: The overview counts each queue's states exactly up to here and estimates
#: past it (alk.queue_stats' exact_limit): an exact count costs about 0.13 ms
#: per 1,000 jobs, so 10^6 jobs would take the page past 100 ms and a
#: refreshing dashboard would take CPU from the workers (docs/dashboard.md).
EXACT_LIMIT = 1000


async def _configure(conn: psycopg.AsyncConnection[Any]) -> None:
    await conn.execute(f"SET statement_timeout = {STATEMENT_TIMEOUT_MS}")
    await conn.execute("SET application_name = 'pyalk dashboard'")


def make_pool(conninfo: str, max_size: int = 4) -> AsyncConnectionPool[Any]:
    """A small pool of autocommit connections: every read is one statement.
    Each connection is checked as it leaves the pool, so a server restart
    costs the next page nothing but a reconnect."""
    return AsyncConnectionPool(conninfo, min_size=1, max_size=max_size, open=False,
                               kwargs={"autocommit": True, "row_factory": dict_row},
                               configure=_configure, check=AsyncConnectionPool.check_connection)


@dataclass(frozen=True)
class Overview:
    now: int
    queues: list[Row]
    throughput: dict[str, list[Row]]
    streams: list[Row]
    consumers: list[Row]
    schedules: list[Row]
    locks: list[Row]


@dataclass(frozen=True)
class JobKey:
    """The keyset position of a job in claim order."""

    priority: int
    run_at: int
    id: int


class Data:
    """The dashboard's reads and actions on one pool."""

    def __init__(self, pool: AsyncConnectionPool[Any], exact_limit: int | None = EXACT_LIMIT) -> None:
        self.pool = pool
        #: Counts past it are alk.queue_stats' estimates (None: every count exact).
        self.exact_limit = exact_limit

    async def _all(self, query: LiteralString, *params: Any) -> list[Row]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(query, params)
            return list(await cur.fetchall())

    async def _one(self, query: LiteralString, *params: Any) -> Row | None:
        found = await self._all(query, *params)
        return found[0] if found else None

    async def allowed(self) -> dict[str, bool]:
        """Which actions this role may take (and the schema has)."""
        row = await self._one(
            "SELECT " + ", ".join(
                f"coalesce(has_function_privilege(to_regprocedure(%s), 'EXECUTE'), false) AS {name}"
                for name in ACTIONS),
            *ACTIONS.values())
        return {name: bool(row and row[name]) for name in ACTIONS}

    async def overview(self) -> Overview:
        async with self.pool.connection() as conn:
            async def rows(query: LiteralString, *params: Any) -> list[Row]:
                return list(await (await conn.execute(query, params)).fetchall())

            now_row = await rows(_NOW)
            queues = await rows("SELECT * FROM alk.queue_stats(exact_limit => %s)", self.exact_limit)
            buckets = await rows("SELECT * FROM alk.queue_throughput()")
            streams = await rows("SELECT * FROM alk.stream_stats()")
            consumers = await rows("SELECT * FROM alk.stream_consumer_lag()")
            schedules = await rows("SELECT * FROM alk.schedule_overview()")
            locks = await rows("SELECT * FROM alk.list_locks()")
        throughput: dict[str, list[Row]] = {}
        for bucket in buckets:
            throughput.setdefault(bucket["queue"], []).append(bucket)
        return Overview(int(now_row[0]["now"]), queues, throughput, streams, consumers, schedules, locks)

    async def now(self) -> int:
        row = await self._one(_NOW)
        return int(row["now"]) if row else 0

    async def queue(self, queue: str) -> Row | None:
        return await self._one("SELECT * FROM alk.queue_stats(%s, %s)", queue, self.exact_limit)

    async def throughput(self, queue: str) -> list[Row]:
        return await self._all("SELECT * FROM alk.queue_throughput(%s)", queue)

    async def jobs(self, queue: str, state: str, n: int, after: JobKey | None) -> list[Row]:
        key = (after.priority, after.run_at, after.id) if after else (None, None, None)
        return await self._all("SELECT * FROM alk.browse_jobs(%s, %s, %s, %s, %s, %s)", queue, state, n, *key)

    async def job(self, queue: str, job_id: int) -> Row | None:
        row = await self._one("SELECT * FROM alk.get_job(%s, %s)", queue, job_id)
        return row if row and row["id"] is not None else None

    async def stream(self, stream: str) -> Row | None:
        return await self._one("SELECT * FROM alk.stream_stats(%s)", stream)

    async def events(self, stream: str, before: int | None, n: int) -> list[Row]:
        return await self._all("SELECT * FROM alk.browse_events(%s, %s, %s)", stream, before, n)

    async def event(self, stream: str, offset: int) -> Row | None:
        return await self._one("SELECT * FROM alk.read_since(%s, %s, 1)", stream, offset - 1)

    async def consumers(self, stream: str) -> list[Row]:
        return await self._all("SELECT * FROM alk.stream_consumer_lag(%s)", stream)

    async def workers(self) -> list[Row] | None:
        """Every registered worker the role may see (alk.workers(), ordered by
        worker_id); None when the role may not read the registry or the
        schema predates it (0024): the pages say so instead of failing."""
        try:
            return await self._all("SELECT * FROM alk.workers()")
        except (psycopg.errors.InsufficientPrivilege, psycopg.errors.UndefinedFunction):
            return None

    # actions -----------------------------------------------------------------

    async def requeue(self, queue: str, job_ids: list[int] | None) -> int:
        row = await self._one("SELECT alk.requeue_dead(%s, %s) AS n", queue, job_ids)
        return int(row["n"]) if row else 0

    async def cancel(self, queue: str, job_id: int) -> bool:
        row = await self._one("SELECT alk.cancel(%s, %s) AS done", queue, job_id)
        return bool(row and row["done"])

    async def pause(self, queue: str) -> bool:
        row = await self._one("SELECT alk.pause_queue(%s) AS changed", queue)
        return bool(row and row["changed"])

    async def resume(self, queue: str) -> bool:
        row = await self._one("SELECT alk.resume_queue(%s) AS changed", queue)
        return bool(row and row["changed"])

    async def stop(self, worker_id: str, queue: str) -> bool:
        """Ask a worker to stop; queue routes the call (a sharded deployment)."""
        row = await self._one("SELECT alk.request_stop(%s, %s) AS asked", worker_id, queue)
        return bool(row and row["asked"])
