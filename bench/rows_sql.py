"""Issue 7 §1: SQL-level rows. Each row runs a pgbench script that calls
alk.* and its floor twin (bare SQL on the plain table of bench/floor.sql) at
each client count, on the same database, one after the other, and reports
jobs/s and the ratio ours/floor.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import psycopg

from bench import pg
from bench.registry import Context, Row, RowResult, row

Kind = Literal["enqueue", "claim", "publish", "read"]


@dataclass(frozen=True)
class Pair:
    key: str
    title: str
    ours: str
    floor: str
    per_tx: int  # jobs (or events) per pgbench transaction
    kind: Kind
    about: str
    #: pgbench -D variables every client starts with (a loop that carries
    #: the previous transaction's result starts from these).
    defines: tuple[tuple[str, str], ...] = ()
    #: The same bare SQL on alk_floor.rotating_jobs, partitioned as alk.jobs
    #: is (issue 25): the floor of the storage pyalk has since 0031. The
    #: plain floor stays beside it.
    rotating: str | None = None


PAIRS: list[Pair] = [
    Pair(
        "sql.enqueue_1",
        "enqueue 1",
        "alk_enqueue_1.sql",
        "floor_enqueue_1.sql",
        1,
        "enqueue",
        "One alk.enqueue per transaction vs one bare INSERT.",
        rotating="floor_rotating_enqueue_1.sql",
    ),
    Pair(
        "sql.enqueue_batch_100",
        "enqueue_batch 100",
        "alk_enqueue_batch_100.sql",
        "floor_enqueue_batch_100.sql",
        100,
        "enqueue",
        "One alk.enqueue_batch of 100 payloads per transaction vs one INSERT ... SELECT of 100 rows.",
        rotating="floor_rotating_enqueue_batch_100.sql",
    ),
    Pair(
        "sql.claim_1_ack",
        "claim 1 + ack",
        "alk_claim_1_ack.sql",
        "floor_claim_1_delete.sql",
        1,
        "claim",
        "alk.claim(n => 1) then alk.ack (two transactions, as a worker does) vs "
        "UPDATE ... WHERE id = (SELECT ... FOR UPDATE SKIP LOCKED LIMIT 1) then DELETE; "
        "both drain the same pre-filled backlog.",
        rotating="floor_rotating_claim_1_delete.sql",
    ),
    Pair(
        "sql.claim_100_ack_batch",
        "claim 100 + ack_batch",
        "alk_claim_100_ack_batch.sql",
        "floor_claim_100_delete.sql",
        100,
        "claim",
        "alk.claim(n => 100) then alk.ack_batch with the fencing tokens vs "
        "UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED LIMIT 100) then one DELETE.",
        rotating="floor_rotating_claim_100_delete.sql",
    ),
    Pair(
        "sql.settle_and_claim",
        "settle_and_claim 10",
        "alk_settle_and_claim_10.sql",
        "floor_settle_and_claim_10.sql",
        10,
        "claim",
        "A prefetching worker's loop: one alk.settle_and_claim per transaction acks the 10 jobs the previous call "
        "claimed and claims the next 10 vs one statement that DELETEs the previous 10 and claims 10 with "
        "UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED LIMIT 10).",
        defines=(("job_ids", "{}"), ("attempts", "{}")),
        rotating="floor_rotating_settle_and_claim_10.sql",
    ),
    Pair(
        "sql.publish_1",
        "publish 1",
        "alk_publish_1.sql",
        "floor_publish_1.sql",
        1,
        "publish",
        "One alk.publish per transaction vs one INSERT into an append-only table.",
    ),
    Pair(
        "sql.publish_100",
        "publish 100",
        "alk_publish_100.sql",
        "floor_publish_100.sql",
        100,
        "publish",
        "100 alk.publish calls in one statement vs one INSERT ... SELECT of 100 events.",
    ),
    Pair(
        "sql.publish_batch_100",
        "publish_batch 100",
        "alk_publish_batch_100.sql",
        "floor_publish_100.sql",
        100,
        "publish",
        "One alk.publish_batch of 100 events per transaction vs one INSERT ... SELECT of 100 events.",
    ),
    Pair(
        "sql.read_since_100",
        "read_since 100",
        "alk_read_since_100.sql",
        "floor_read_since_100.sql",
        100,
        "read",
        "alk.read_since 100 events after a random offset vs an index range scan with LIMIT 100.",
    ),
]

COLUMNS = [
    "clients",
    "ours jobs/s",
    "floor jobs/s",
    "ours/floor",
    "ours latency ms",
    "floor latency ms",
    "ours WAL B/job",
    "floor WAL B/job",
]
#: The rotating floor's columns, for the rows that have one.
ROTATING_COLUMNS = ["rotating floor jobs/s", "ours/rotating floor", "rotating floor WAL B/job"]
#: Each side's table.
TABLES = {"ours": "alk.jobs", "floor": "alk_floor.jobs", "rotating": "alk_floor.rotating_jobs"}


def _prepare(
    ctx: Context, conn: psycopg.Connection[Any], pair: Pair, side: str, clients: int, filled: set[str]
) -> dict[str, Any]:
    """Bring the table of ``side`` to its starting line; returns pgbench
    keyword arguments (how long to run)."""
    mode = ctx.mode
    if pair.kind == "enqueue":
        pg.reset_tables(conn)
        pg.settle(conn, TABLES[side])
        return {"seconds": mode.enqueue_seconds}
    if pair.kind == "claim":
        pg.reset_tables(conn)
        total = {1: mode.claim1_jobs, 10: mode.claim1_jobs * 10}.get(pair.per_tx, mode.claim100_jobs)
        per_client = max(1, total // (clients * pair.per_tx))
        backlog = per_client * clients * pair.per_tx
        if side == "ours":
            pg.fill_ours(conn, backlog)
        else:
            pg.fill_floor(conn, backlog, table=TABLES[side])
        pg.settle(conn, TABLES[side])
        return {"transactions": per_client, "defines": dict(pair.defines)}
    # Streams: publishing appends (both tables grow alike, no reset needed);
    # reading needs a stream filled once per side.
    if pair.kind == "read" and side not in filled:
        events = mode.stream_events
        if side == "ours":
            conn.execute(
                "SELECT count(alk.publish('bench', p)) FROM unnest(array_fill(%s::jsonb, ARRAY[%s::int])) AS p",
                [pg.PAYLOAD, events],
            )
        else:
            conn.execute(
                "INSERT INTO alk_floor.events (stream, payload) SELECT 'bench', %s::jsonb FROM generate_series(1, %s)",
                [pg.PAYLOAD, events],
            )
        filled.add(side)
    pg.settle(conn)
    defines = {"max_after": max(0, mode.stream_events - 100)} if pair.kind == "read" else {}
    return {"seconds": mode.enqueue_seconds, "defines": defines}


def run_pair(ctx: Context, pair: Pair) -> RowResult:
    started = time.perf_counter()
    mode = ctx.mode
    records: list[dict[str, Any]] = []
    filled: set[str] = set()
    raw: list[dict[str, Any]] = []
    sides = ("ours", "floor", "rotating") if pair.rotating else ("ours", "floor")
    scripts = {"ours": pair.ours, "floor": pair.floor, "rotating": pair.rotating or ""}
    ctx.progress.start(f"{pair.title}: ours vs floor", total=len(mode.clients) * len(sides) * mode.repeats)
    with ctx.server.fresh_db("alk_bench_sql") as db, pg.connect(ctx, db) as conn:
        for clients in mode.clients:
            measured: dict[str, list[pg.PgbenchResult]] = {side: [] for side in sides}
            wal_per_job: dict[str, list[float]] = {side: [] for side in sides}
            for rep in range(mode.repeats):
                # Rotate who goes first so none always runs on a warmer cache.
                for side in sides[rep % len(sides):] + sides[: rep % len(sides)]:
                    kwargs = _prepare(ctx, conn, pair, side, clients, filled)
                    lsn = pg.wal_lsn(conn)
                    result = pg.pgbench(ctx, db, scripts[side], clients, **kwargs)
                    wal = pg.wal_bytes(conn, lsn) / max(1, result.transactions * pair.per_tx)
                    measured[side].append(result)
                    wal_per_job[side].append(wal)
                    raw.append({"clients": clients, "side": side, "rep": rep, "wal_per_job": wal, **result.__dict__})
                    ctx.progress.advance()
            rate = {side: statistics.median(r.jobs_per_s(pair.per_tx) for r in measured[side]) for side in sides}
            ours, floor = rate["ours"], rate["floor"]
            record: dict[str, Any] = {
                "clients": clients,
                "ours jobs/s": round(ours, 1),
                "floor jobs/s": round(floor, 1),
                "ours/floor": round(ours / floor, 3) if floor else None,
                "ours latency ms": _median_latency(measured["ours"]),
                "floor latency ms": _median_latency(measured["floor"]),
                "ours WAL B/job": round(statistics.median(wal_per_job["ours"])),
                "floor WAL B/job": round(statistics.median(wal_per_job["floor"])),
            }
            if pair.rotating:
                rotating = rate["rotating"]
                record.update({
                    "rotating floor jobs/s": round(rotating, 1),
                    "ours/rotating floor": round(ours / rotating, 3) if rotating else None,
                    "rotating floor WAL B/job": round(statistics.median(wal_per_job["rotating"])),
                })
            records.append(record)
    notes = [
        f"{pair.ours} vs {pair.floor}" + (f" and {pair.rotating}" if pair.rotating else "")
        + f"; jobs/s = pgbench tps x {pair.per_tx}; latency = pgbench's average per script run; WAL B/job = "
        "pg_current_wal_lsn() difference / jobs (includes full-page images after the CHECKPOINT that starts each "
        "run, alike for all)."
    ]
    if pair.kind == "claim":
        notes.append(
            "Each side drains a backlog it was given just before (VACUUM ANALYZE, CHECKPOINT), "
            "of clients x transactions x batch jobs: the same work for both."
        )
    retried = {side: sum(r["retried"] for r in raw if r["side"] == side) for side in ("ours", "floor", "rotating")}
    if any(retried.values()):
        notes.append(
            f"Transactions pgbench ran again after a deadlock (--max-tries {pg.MAX_TRIES}): ours "
            f"{retried['ours']}, floor {retried['floor']}, rotating floor {retried['rotating']}; their time is in "
            "the side's jobs/s."
        )
    return RowResult(
        key=pair.key,
        title=pair.title,
        status="ok",
        about=pair.about,
        columns=COLUMNS + (ROTATING_COLUMNS if pair.rotating else []),
        records=records,
        notes=notes,
        extra={"pgbench": raw},
        seconds=time.perf_counter() - started,
    )


def _median_latency(results: list[pg.PgbenchResult]) -> float | None:
    values = [r.latency_ms for r in results if r.latency_ms is not None]
    return round(statistics.median(values), 3) if values else None


def _pair_row(pair: Pair) -> Row:
    requires: Callable[[Context], str | None] | None = None
    if pair.kind in ("publish", "read"):
        requires = pg.has_function("alk.publish")
    fn: Callable[[Context], RowResult] = lambda ctx: run_pair(ctx, pair)  # noqa: E731
    return row(pair.key, "sql", pair.title, pair.about, requires=requires)(fn)


PAIR_ROWS = tuple(_pair_row(pair) for pair in PAIRS)


# -- durable enqueue: pyalk's wake-ups vs the same enqueue with no NOTIFY ------

DURABLE_CLIENTS = (8, 16)
IDLE_WORKER = "bench-idle"

#: The wake-up step of alk._enqueue_one as installed (the idle-advert check,
#: its wait for held adverts and its pg_notify), up to the END IF at its own
#: indentation; the scratch copies replace exactly this block (a changed
#: definition fails the row loudly).
WAKE_STEP = re.compile(r"^( *)IF pg_catalog\.current_setting\('transaction_isolation'\).*?^\1END IF;", re.S | re.M)
NOTIFY_STEP = "PERFORM pg_catalog.pg_notify(alk._queue_channel(p_queue), '');"
ENQUEUE_SIGNATURE = (
    "alk.enqueue(text, jsonb, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, text, jsonb, text, "
    "bigint[])"
)
INNER_SIGNATURE = (
    "alk._enqueue_one(text, jsonb, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, text, "
    "jsonb, text, bigint[])"
)


def install_enqueue_copies(conn: psycopg.Connection[Any]) -> None:
    """alk_floor.enqueue_nowake and alk_floor.enqueue_notify: pyalk's own
    alk.enqueue and alk._enqueue_one copied from the catalog, with the wake-up
    step removed (no NOTIFY at all) or replaced by an unconditional
    pg_notify (every enqueue notifies, as before 0009)."""
    inner = _definition(conn, INNER_SIGNATURE)
    outer = _definition(conn, ENQUEUE_SIGNATURE)
    if len(WAKE_STEP.findall(inner)) != 1 or outer.count("alk._enqueue_one(") != 1:
        raise RuntimeError("alk.enqueue changed shape: update bench/rows_sql.py's scratch copies")
    for name, step in (("nowake", ""), ("notify", NOTIFY_STEP)):
        body = inner.replace("FUNCTION alk._enqueue_one(", f"FUNCTION alk_floor._enqueue_one_{name}(", 1)
        conn.execute(WAKE_STEP.sub(lambda _, step=step: step, body))  # type: ignore[arg-type,misc]
        wrapper = outer.replace("FUNCTION alk.enqueue(", f"FUNCTION alk_floor.enqueue_{name}(", 1)
        conn.execute(wrapper.replace("alk._enqueue_one(", f"alk_floor._enqueue_one_{name}("))  # type: ignore[arg-type]


def _definition(conn: psycopg.Connection[Any], signature: str) -> str:
    found = conn.execute("SELECT pg_get_functiondef(%s::regprocedure)", [signature]).fetchone()
    assert found is not None
    return str(found[0])


class IdleWorker:
    """A connection that waits idle as the protocol says (LISTEN, then the
    advert of alk.wait_for_jobs) and drains its notifications in a thread so
    the server's notification queue never backs up. The enqueue that
    notifies consumes the advert, so after each notification it advertises
    again, like a real worker whose claim found nothing."""

    def __init__(self, ctx: Context, db: str, *, advertise: bool = True) -> None:
        import threading

        self.advertise = advertise  # False: only LISTEN and count (beside a real worker)
        self.conn = pg.connect(ctx, db)
        channel = self.conn.execute("SELECT alk.queue_channel(%s)", [pg.QUEUE]).fetchone()
        assert channel is not None
        self.conn.execute(f'LISTEN "{channel[0]}"')  # type: ignore[arg-type]
        if advertise:
            self.conn.execute("SELECT alk.wait_for_jobs(%s, %s)", [pg.QUEUE, IDLE_WORKER])
        self.received = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while not self._stop.is_set():
            if any(True for _ in self.conn.notifies(timeout=0.2, stop_after=1)):
                self.received += 1
                if self.advertise:
                    self.conn.execute("SELECT alk.wait_for_jobs(%s, %s)", [pg.QUEUE, IDLE_WORKER], prepare=True)
                    self.conn.execute("SELECT alk.wake_fence()", prepare=True)

    def settled_count(self) -> int:
        """Notifications received so far, once the ones in flight have
        arrived: the count stops changing for 0.3 s (longer than a drain timeout)."""
        count = -1
        while count != self.received:
            count = self.received
            time.sleep(0.3)
        return count

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.conn.close()


class RealWorker:
    """A pyalk AsyncWorker (defaults, a no-op handler) on the row's queue, in
    a thread with its own event loop: it wakes, claims, drains, settles, goes
    idle and advertises, as in production. With listen=False it neither
    listens nor advertises and is woken by its poll every poll_interval: the
    no-notify side sends no NOTIFY, yet its worker claims and acks the same
    jobs on the same cores."""

    def __init__(self, ctx: Context, db: str, *, listen: bool, poll_interval: float) -> None:
        import asyncio
        import threading

        self.processed = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._ready = threading.Event()
        dsn = ctx.server.dsn_for(db)
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._run(dsn, listen, poll_interval)), daemon=True
        )
        self._thread.start()
        if not self._ready.wait(30) or self.error:
            raise RuntimeError(f"the bench worker did not start: {self.error!r}")

    async def _run(self, dsn: str, listen: bool, poll_interval: float) -> None:
        import asyncio

        from pyalk import AsyncAlk, AsyncJobHandle

        async def noop(job: AsyncJobHandle) -> None:
            self.processed += 1

        try:
            async with AsyncAlk(dsn) as alk:
                worker = alk.worker(
                    pg.QUEUE, noop, listen=listen, poll_interval=poll_interval, handle_signals=False
                )
                task = asyncio.create_task(worker.run())
                while listen and not worker.listening and not task.done():
                    await asyncio.sleep(0.01)
                self._ready.set()
                while not self._stop.is_set() and not task.done():
                    await asyncio.sleep(0.05)
                worker.stop()
                await task
        except BaseException as error:  # reported by close(), not lost in the thread
            self.error = error
            self._ready.set()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(60)
        if self.error:
            raise RuntimeError(f"the bench worker failed: {self.error!r}")


#: The real worker's fallback poll on the no-notify side (it never hears a
#: NOTIFY there): short, so it drains as it goes, like the notified one.
POLLED_WORKER_INTERVAL = 0.01

DURABLE_SIDES = {
    "ours": "alk_enqueue_1.sql",
    "no notify": "alk_enqueue_nowake_1.sql",
    "always notify": "alk_enqueue_notify_1.sql",
}


@row(
    "sql.enqueue_durable",
    "sql",
    "enqueue 1, durable commits",
    "alk.enqueue per transaction with synchronous_commit on, at 8 and 16 clients, with no worker idle, with "
    "one idle worker (LISTEN + alk.wait_for_jobs, advertising again after every notification, never claiming) "
    "and with a real AsyncWorker processing the jobs, vs the same enqueue copied with its wake-up step removed "
    "(never NOTIFY); an always-notifying copy shows what the notify lock costs.",
    requires=pg.has_function("alk.wait_for_jobs"),
)
def enqueue_durable(ctx: Context) -> RowResult:
    import dataclasses

    started = time.perf_counter()
    mode = ctx.mode
    durable = dataclasses.replace(ctx, session_options="-c synchronous_commit=on")
    clients_list = DURABLE_CLIENTS if not mode.quick else (2,)
    records: list[dict[str, Any]] = []
    raw: list[dict[str, Any]] = []
    notified = 0
    ctx.progress.start("durable enqueue", total=len(clients_list) * 3 * len(DURABLE_SIDES) * mode.repeats)
    with ctx.server.fresh_db("alk_bench_durable") as db, pg.connect(ctx, db) as conn:
        install_enqueue_copies(conn)
        settings = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN ('fsync', 'synchronous_commit', 'wal_sync_method')"
            ).fetchall()
        )
        for idle in (False, True, "worker"):
            # The synthetic idle worker, or (beside a real worker) a bare
            # LISTEN that counts what the real one hears.
            worker = IdleWorker(ctx, db, advertise=idle is True) if idle else None
            processed: dict[str, list[float]] = {side: [] for side in DURABLE_SIDES}
            try:
                for clients in clients_list:
                    measured: dict[str, list[float]] = {side: [] for side in DURABLE_SIDES}
                    # Notifications the idle worker received per enqueue, per side.
                    woken: dict[str, list[float]] = {side: [] for side in DURABLE_SIDES}
                    for rep in range(mode.repeats):
                        sides = list(DURABLE_SIDES)
                        order = sides if rep % 2 == 0 else sides[::-1]
                        for side in order:
                            pg.reset_tables(conn)
                            pg.settle(conn, "alk.jobs")
                            real = None
                            if idle == "worker":
                                listens = side != "no notify"
                                interval = 5.0 if listens else POLLED_WORKER_INTERVAL
                                real = RealWorker(ctx, db, listen=listens, poll_interval=interval)
                            before = worker.settled_count() if worker else 0
                            try:
                                result = pg.pgbench(
                                    durable, db, DURABLE_SIDES[side], clients, seconds=mode.enqueue_seconds
                                )
                            finally:
                                if real:
                                    real.close()
                            measured[side].append(result.tps)
                            if worker:
                                woken[side].append((worker.settled_count() - before) / max(1, result.transactions))
                            if real:
                                processed[side].append(real.processed / max(1, result.transactions))
                            raw.append({"clients": clients, "idle": idle, "side": side, "rep": rep, **result.__dict__})
                            ctx.progress.advance()
                    ours, bare, always = (statistics.median(measured[s]) for s in DURABLE_SIDES)
                    records.append(
                        {
                            "clients": clients,
                            "idle worker": "no" if idle is False else "yes" if idle is True else "AsyncWorker",
                            "ours jobs/s": round(ours, 1),
                            "no-notify jobs/s": round(bare, 1),
                            "ours/no-notify": round(ours / bare, 3) if bare else None,
                            "always-notify jobs/s": round(always, 1),
                            "always/no-notify": round(always / bare, 3) if bare else None,
                            "ours notifies/enqueue": round(statistics.median(woken["ours"]), 4) if idle else None,
                        }
                    )
                    if idle == "worker":
                        # Jobs the worker processed during the run, per enqueue: each side's worker kept up.
                        records[-1]["worker done/enqueued (ours, no-notify)"] = (
                            f"{statistics.median(processed['ours']):.2f}, "
                            f"{statistics.median(processed['no notify']):.2f}"
                        )
            finally:
                if idle is True and worker:
                    notified = worker.received
                if worker:
                    worker.close()
    notes = [
        f"Durable commits: measured sessions run with synchronous_commit=on; server fsync={settings.get('fsync')}, "
        f"wal_sync_method={settings.get('wal_sync_method')}. pgbench -T {mode.enqueue_seconds:g} per side, "
        f"{mode.repeats} repeat(s), medians; the sides alternate.",
        "no notify / always notify: alk.enqueue and alk._enqueue_one copied from the installed catalog into "
        "alk_floor, with the idle-advert check and its pg_notify removed or replaced by an unconditional pg_notify.",
        f"The idle worker received {notified} notifications over all sides (one per advert at most: the enqueue "
        "that notifies consumes it; the idle worker advertises again after each one, as a worker whose claim found "
        "nothing); 'ours notifies/enqueue' is what it received during pyalk's side over the transactions pgbench "
        "counted (median).",
        "AsyncWorker: a pyalk AsyncWorker with its defaults and a no-op handler runs during each side, in the "
        "bench process; on pyalk's and the always-notify side it listens (fallback poll 5 s), on the no-notify "
        f"side, which sends no NOTIFY, it polls every {POLLED_WORKER_INTERVAL * 1000:g} ms, so both sides' "
        "workers claim and ack the jobs on the same cores; notifications are counted by a bare LISTEN.",
    ]
    return RowResult(
        key="sql.enqueue_durable",
        title="enqueue 1, durable commits",
        status="ok",
        about="",
        columns=list(dict.fromkeys(key for record in records for key in record)),
        records=records,
        notes=notes,
        extra={"pgbench": raw, "settings": settings},
        seconds=time.perf_counter() - started,
    )


#: This module's rows, in report order (bench/rows.py collects them).
ROWS: tuple[Row, ...] = (*PAIR_ROWS, enqueue_durable)
