"""``pyalk demo``: migrate, enqueue a few thousand jobs, work them with a few
threads, and show what happened. Everything goes through the public API."""

from __future__ import annotations

import argparse
import random
import threading
import time
from dataclasses import dataclass, field

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from pyalk import Alk, QueueOpts, embedded
from pyalk.cli.common import Commands, default_of
from pyalk.cli.server import print_server
from pyalk.conninfo import default_conninfo


@dataclass
class Tally:
    done: int = 0
    retried: int = 0
    failed: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def run(conninfo: str, *, jobs: int = 5000, workers: int = 4, console: Console | None = None) -> Tally:
    from pyalk.schema import migrate  # lazy: Alembic and SQLAlchemy (pyalk/cli/common.py)

    console = console or Console()
    migrate.upgrade(conninfo)
    console.print(Text.assemble(("pyalk", "bold"), f" migrated to version {migrate.current(conninfo)}"))
    queue_name = f"demo-{int(time.time())}"
    tally = Tally()
    with Alk(conninfo, max_connections=workers + 1) as alk:
        # backoff 0: the demo's failures come straight back instead of waiting.
        queue = alk.queue(queue_name, QueueOpts(backoff_base_s=0, max_attempts=3))
        started = time.perf_counter()
        for start in range(0, jobs, 500):
            queue.enqueue_batch([{"n": n, "flaky": n % 97 == 0} for n in range(start, min(jobs, start + 500))])
        enqueued_s = time.perf_counter() - started

        columns = (TextColumn("working"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console) as progress:
            task = progress.add_task("jobs", total=jobs)

            def work(worker_id: str) -> None:
                while handles := queue.claim_batch(worker_id, 50):
                    finished = []
                    for handle in handles:
                        # A few flaky jobs fail on their first attempts, to show retries.
                        if handle.payload["flaky"] and random.random() < 0.7:
                            if handle.job.attempts < handle.job.max_attempts:
                                handle.retry("flaky job, trying again")
                                with tally.lock:
                                    tally.retried += 1
                            else:
                                handle.fail("flaky job gave up")
                                with tally.lock:
                                    tally.failed += 1
                                progress.advance(task)
                            continue
                        finished.append(handle)
                    acked = queue.ack_batch(worker_id, finished)
                    with tally.lock:
                        tally.done += acked
                    progress.advance(task, acked)

            threads = [threading.Thread(target=work, args=(f"demo-worker-{i}",)) for i in range(workers)]
            worked = time.perf_counter()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            worked_s = time.perf_counter() - worked

    table = Table(title=f"pyalk demo: queue {queue_name!r}")
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("jobs enqueued", f"{jobs}")
    table.add_row("enqueue rate", f"{jobs / enqueued_s:,.0f} jobs/s (batches of 500)")
    table.add_row("workers", f"{workers} threads, claim 50 + ack_batch")
    table.add_row("acked", f"{tally.done}")
    table.add_row("retried", f"{tally.retried}")
    table.add_row("failed (dead)", f"{tally.failed}")
    table.add_row("work rate", f"{(tally.done + tally.failed) / worked_s:,.0f} jobs/s")
    console.print(table)
    return tally


def cmd_demo(args: argparse.Namespace, console: Console) -> None:
    # --dsn or $PYALK_DSN names a database; libpq's bare environment does not
    # (unlike the other commands): with neither, the demo brings its own.
    dsn = args.dsn or default_conninfo()
    if dsn:
        run(dsn, jobs=args.jobs, workers=args.workers, console=console)
        return
    # A server that was already running (pyalk server start) stays running.
    keep = args.keep_server or embedded.info().running
    console.print("starting an embedded PostgreSQL ...")
    dsn = embedded.start(stop_at_exit=not keep)
    run(dsn, jobs=args.jobs, workers=args.workers, console=console)
    server = embedded.info()
    if keep:
        print_server(server, console, "the embedded PostgreSQL keeps running")
    else:
        embedded.stop(server.data_dir)
        console.print(f"the embedded PostgreSQL stopped; its data stays in {server.data_dir}", soft_wrap=True)
        console.print("  reuse it:  pyalk server start  (or pyalk demo --keep-server)", soft_wrap=True)
        console.print("  remove it: pyalk server stop --delete", soft_wrap=True)


def register(commands: Commands) -> None:
    demo = commands.add_parser("demo", help="run a demo on an embedded PostgreSQL (or --dsn)")
    demo.add_argument("--dsn", help="use this database instead of an embedded server")
    demo.add_argument("--jobs", type=int, default=default_of(run, "jobs"),
                      help="jobs to enqueue and work (default: %(default)s)")
    demo.add_argument("--workers", type=int, default=default_of(run, "workers"),
                      help="worker threads (default: %(default)s)")
    demo.add_argument("--keep-server", action="store_true", help="leave the embedded server running")
    demo.set_defaults(run=cmd_demo)
