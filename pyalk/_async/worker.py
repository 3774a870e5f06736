"""The worker runtime: claim jobs of one queue, run a handler on each, settle
the outcome. (The queue functions it calls are bound in queue.py.)

Every queue rule (claim order, leases, fencing, backoff, burial) is the SQL's
(sql/versions/0002_queue.sql, 0007_worker.sql); the worker only decides when
to call it:

* it claims in batches sized to its free capacity (never prefetching beyond
  it: a claimed job's lease is already running);
* it wakes on NOTIFY (a dedicated LISTEN connection), on a fallback poll, or
  when ``alk.next_claim_at`` says the next job becomes claimable;
* it heartbeats each running job every half visibility timeout;
* it acks successes in batches (``alk.ack_batch`` with each claim's fencing
  token; a flush takes everything that finished while the previous one was in
  flight), retries failures on the row's backoff curve with the exception
  text, and fails the job for good on a ``fail_on`` exception;
* on stop (``stop()``, SIGINT, SIGTERM) it stops claiming, gives running
  handlers ``grace_period`` seconds, flushes its acks and leaves whatever is
  still running to lease expiry;
* it treats a lost connection (server restart, terminated backend) as
  transient: it reconnects and carries on. A job whose outcome could not be
  recorded runs again after its lease: at least once, never lost.

The threaded form (pyalk/_sync/worker.py) is generated from this file; the
primitives that differ (tasks vs threads, signals) are in
pyalk/worker_runtime.py.
"""

from __future__ import annotations

import logging
import math
import os
import random
import secrets
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from psycopg import AsyncConnection, sql

from pyalk import _codec
from pyalk._async.queue import QUEUE_CHANNEL, AsyncJobHandle, AsyncQueue
from pyalk.job import Job
from pyalk.worker_runtime import AsyncEvent, AsyncPool, AsyncRuntime, AsyncSignals, AsyncTask
from pyalk.worker_types import (
    TRANSIENT_ERRORS,
    PermanentError,
    WorkerCounts,
    error_text,
)

if TYPE_CHECKING:
    from pyalk._async.client import AsyncAlk

logger = logging.getLogger("pyalk.worker")

#: A job handler: called with the claimed job; returning means success.
Handler = Callable[[AsyncJobHandle], Awaitable[Any]]

#: Most ids one alk.ack_batch call carries.
ACK_BATCH_MAX = 1000

# the worker ------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class _Running:
    """A job whose handler is running, with its heartbeat schedule."""

    handle: AsyncJobHandle
    started: float  # time.monotonic() when the claim returned
    interval: float  # seconds between heartbeats: half the visibility timeout
    next_beat: float  # time.monotonic() of the next heartbeat (inf: none)
    lost: bool = False  # a heartbeat found the claim no longer valid


class _Backoff:
    """Exponential backoff with jitter, from ``first`` to ``cap`` seconds."""

    def __init__(self, first: float, cap: float) -> None:
        self.first = first
        self.cap = max(cap, first)
        self._next = first

    def next(self) -> float:
        delay = self._next
        self._next = min(self.cap, self._next * 2)
        return delay * random.uniform(0.8, 1.2)

    def reset(self) -> None:
        self._next = self.first


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def _default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class AsyncWorker:
    """Runs ``handler`` on the jobs of one queue, ``concurrency`` at a time.

    ``await worker.run()`` works until :meth:`stop` (or SIGINT/SIGTERM, when
    ``handle_signals`` and run from the main thread) and returns the
    :class:`~pyalk.WorkerCounts`; a worker runs once (a :meth:`stop` before
    :meth:`run` makes it return at once). The handler gets the claimed job handle
    (``job.payload``, ``job.job.attempts``, ``job.heartbeat()``); returning
    acks the job, raising one of ``fail_on`` fails it for good, raising
    anything else retries it on the row's backoff curve (dead once its
    attempts are used up), with ``Type: message`` as the error text.

    Options: ``batch_size`` caps one claim (default: ``concurrency``);
    ``poll_interval`` is the fallback poll in seconds when no NOTIFY comes;
    ``grace_period`` is how long a stop waits for running handlers;
    ``heartbeat`` renews each running job's lease every half visibility
    timeout; ``listen`` opens the LISTEN connection (``listen_conninfo``, or
    the client's own conninfo); ``burst`` returns once nothing is claimable
    and nothing is running.
    """

    def __init__(
        self,
        alk: AsyncAlk,
        queue: str | AsyncQueue,
        handler: Handler,
        *,
        concurrency: int = 10,
        worker_id: str | None = None,
        fail_on: type[BaseException] | tuple[type[BaseException], ...] = (PermanentError,),
        batch_size: int | None = None,
        poll_interval: float = 5.0,
        grace_period: float = 30.0,
        heartbeat: bool = True,
        listen: bool = True,
        listen_conninfo: str | None = None,
        handle_signals: bool = True,
        burst: bool = False,
    ) -> None:
        AsyncRuntime.check_handler(handler)
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be a positive int, got {concurrency!r}")
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
            raise ValueError(f"batch_size must be a positive int or None, got {batch_size!r}")
        if not poll_interval > 0:
            raise ValueError(f"poll_interval must be > 0 seconds, got {poll_interval!r}")
        if not grace_period >= 0:
            raise ValueError(f"grace_period must be >= 0 seconds, got {grace_period!r}")
        self.alk = alk
        self.queue = queue if isinstance(queue, AsyncQueue) else alk.queue(queue)
        self.handler = handler
        self.concurrency = concurrency
        self.worker_id = _default_worker_id() if worker_id is None else str(_codec.text(worker_id, "worker_id"))
        self.fail_on = fail_on if isinstance(fail_on, tuple) else (fail_on,)
        self.batch_size = batch_size or concurrency
        self.poll_interval = float(poll_interval)
        self.grace_period = float(grace_period)
        self.heartbeat = heartbeat
        self.handle_signals = handle_signals
        self.burst = burst
        self.counts = WorkerCounts()
        self._listen_conninfo = (listen_conninfo or alk.executor.listen_conninfo()) if listen else None

        self._lock = threading.Lock()
        self._in_flight: dict[tuple[int, int], _Running] = {}
        self._acks_pending: list[_Running] = []
        self._running = False
        self._finished = False
        self._stopping = False
        self._forced = False
        self._abandoned = False
        self._acks_closed = False
        self._ack_deadline = math.inf
        self._beats_done = False
        self._listening = False
        # Set from any thread or signal handler; waited on by the loops.
        self._stop_event = AsyncEvent()  # stop requested: ends backoff sleeps
        self._wake = AsyncEvent()  # NOTIFY, retry, stop: look for claimable jobs
        self._slot = AsyncEvent()  # a handler finished, or stop
        self._drained = AsyncEvent()  # nothing in flight any more, or a forced stop
        self._beat = AsyncEvent()  # a job started, or shutdown: recompute heartbeats
        self._acks = AsyncEvent()  # acks to flush, or shutdown
        self._pool = AsyncPool(concurrency, name=f"pyalk-worker-{self.queue.name}")

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(queue={self.queue.name!r}, worker_id={self.worker_id!r}, "
            f"concurrency={self.concurrency})"
        )

    @property
    def running(self) -> bool:
        """Whether :meth:`run` is in progress."""
        return self._running

    @property
    def in_flight(self) -> int:
        """How many handlers are running now."""
        return len(self._in_flight)

    @property
    def listening(self) -> bool:
        """Whether the LISTEN connection is up (wake-ups at commit)."""
        return self._listening

    def stop(self, *, force: bool = False) -> None:
        """Stop claiming; running handlers get the grace period (``force``:
        none). Safe from any thread and from a signal handler; returns at once."""
        self._stopping = True
        if force:
            self._forced = True
            self._drained.set()
        for event in (self._stop_event, self._wake, self._slot):
            event.set()

    def _on_signal(self, number: int) -> None:
        if self._stopping:
            logger.warning("second signal %d: stopping now, in-flight jobs are left to lease expiry", number,
                           extra=self._fields())
            self.stop(force=True)
        else:
            logger.info("signal %d: stopping (grace period %.1fs)", number, self.grace_period, extra=self._fields())
            self.stop()

    def _fields(self, job: Job | None = None, **extra: Any) -> dict[str, Any]:
        """The structured ``extra=`` fields of a log record."""
        fields: dict[str, Any] = {"queue": self.queue.name, "worker_id": self.worker_id}
        if job is not None:
            fields["job_id"] = job.id
            fields["attempt"] = job.attempts
        fields.update(extra)
        return fields

    # run -------------------------------------------------------------------

    async def run(self) -> WorkerCounts:
        """Work until stopped; the counts of what was done."""
        if self._running or self._finished:
            raise RuntimeError(f"{self!r} is {'already running' if self._running else 'finished'}: a worker runs once")
        self._running = True
        for event in (self._stop_event, self._wake, self._slot, self._drained, self._beat, self._acks):
            await event.wait(0)  # binds each event to this loop (a no-op for threads)
        signals = AsyncSignals()
        if self.handle_signals:
            signals.install(self._on_signal)
        logger.info(
            "worker started: queue %r, concurrency %d, %s",
            self.queue.name,
            self.concurrency,
            "LISTEN + fallback poll" if self._listen_conninfo else "polling only (listen=False)",
            extra=self._fields(concurrency=self.concurrency),
        )
        tasks: dict[str, AsyncTask] = {
            "acks": AsyncRuntime.spawn(self._ack_loop, name="pyalk-worker-acks"),
        }
        if self.heartbeat:
            tasks["heartbeats"] = AsyncRuntime.spawn(self._heartbeat_loop, name="pyalk-worker-heartbeats")
        if self._listen_conninfo is not None:
            tasks["listen"] = AsyncRuntime.spawn(self._listen_loop, name="pyalk-worker-listen")
        interrupted = False
        try:
            await self._claim_loop()
        except BaseException:
            interrupted = True
            raise
        finally:
            try:
                await self._shutdown(tasks, grace=0.0 if interrupted else self.grace_period)
            finally:
                signals.restore()
                self._running = False
                self._finished = True
        return self.counts

    async def _claim_loop(self) -> None:
        idle = _Backoff(0.05, self.poll_interval)
        failing = _Backoff(0.1, min(self.poll_interval, 5.0))
        while not self._stopping:
            free = self.concurrency - len(self._in_flight)
            if free <= 0:
                # Full: wait for a handler to finish (a NOTIFY cannot help).
                self._slot.clear()
                if len(self._in_flight) >= self.concurrency and not self._stopping:
                    await self._slot.wait(self.poll_interval)
                continue
            wanted = min(free, self.batch_size)
            # Cleared before the claim: a NOTIFY arriving from here on is not lost.
            self._wake.clear()
            try:
                handles = await self.queue.claim_batch(self.worker_id, wanted)
            except TRANSIENT_ERRORS as error:
                await self._pause_for(error, failing)
                continue
            for handle in handles:
                self._start(handle)
            if len(handles) == wanted:
                failing.reset()
                idle.reset()
                continue  # maybe more are due
            try:
                delay = await self._seconds_until_claimable()
            except TRANSIENT_ERRORS as error:
                await self._pause_for(error, failing)
                continue
            failing.reset()
            if delay is not None and delay <= 0:
                if handles:
                    continue  # more became due since the claim
                # Claimable now, yet the claim found nothing: rows held by a
                # concurrent claim or settle. Back off a little, not a lot.
                timeout = idle.next()
            else:
                idle.reset()
                if self.burst and not handles and not self._in_flight:
                    logger.info("burst: nothing left to claim", extra=self._fields())
                    return
                timeout = self.poll_interval if delay is None else min(delay, self.poll_interval)
            await self._wake.wait(timeout)

    async def _pause_for(self, error: BaseException, backoff: _Backoff) -> None:
        pause = backoff.next()
        logger.warning("database unavailable (%s); trying again in %.1fs", _one_line(error), pause,
                       extra=self._fields())
        await self._stop_event.wait(pause)

    async def _seconds_until_claimable(self) -> float | None:
        at, now, wall = await self.queue.next_claim_clock()
        if at is None:
            return None
        if math.floor(wall) == now:  # the clock is the wall clock: sleep to the sub-second
            return float(at) - wall
        return float(at - now)  # a pinned clock (tests, replays): whole seconds

    # one job ---------------------------------------------------------------

    def _start(self, handle: AsyncJobHandle) -> None:
        now = time.monotonic()
        # A lease lasts at least visibility_timeout_s seconds from the claim:
        # renewing at half of it leaves the other half for a slow round trip.
        interval = max(handle.job.visibility_timeout_s / 2, 0.05)
        running = _Running(handle, started=now, interval=interval,
                           next_beat=now + interval if self.heartbeat else math.inf)
        with self._lock:
            self._in_flight[(handle.id, handle.job.attempts)] = running
            self.counts.claimed += 1
        self._drained.clear()
        self._pool.submit(self._process, running)
        if self.heartbeat:
            self._beat.set()

    async def _process(self, running: _Running) -> None:
        handle = running.handle
        job = handle.job
        logger.debug("job %d started (attempt %d)", job.id, job.attempts, extra=self._fields(job))
        try:
            error: Exception | None = None
            try:
                await self.handler(handle)
            except Exception as caught:
                error = caught
            duration = time.monotonic() - running.started
            if self._abandoned:
                return  # past the grace period: the job is left to lease expiry
            if error is None:
                logger.debug("job %d done in %.3fs", job.id, duration, extra=self._fields(job, duration_s=duration))
                with self._lock:
                    self._acks_pending.append(running)
                self._acks.set()
            elif isinstance(error, self.fail_on):
                await self._settle(running, error, duration, fail=True)
            else:
                await self._settle(running, error, duration, fail=False)
        finally:
            with self._lock:
                self._in_flight.pop((handle.id, job.attempts), None)
                empty = not self._in_flight
            self._slot.set()
            if self.burst:
                self._wake.set()
            if empty:
                self._drained.set()

    async def _settle(self, running: _Running, error: Exception, duration: float, *, fail: bool) -> None:
        """Record a failed handler: fail (dead now) or retry (backoff curve)."""
        handle = running.handle
        job = handle.job
        err = error_text(error)
        fields = self._fields(job, duration_s=duration, error=err)
        # A lost connection is retried until the lease would have run out
        # anyway; after that the job runs again (at least once) whatever we do.
        deadline = time.monotonic() + min(max(job.visibility_timeout_s, 2), 60)
        backoff = _Backoff(0.1, 2.0)
        while True:
            try:
                held = await (handle.fail(err) if fail else handle.retry(err))
                break
            except TRANSIENT_ERRORS as db_error:
                if time.monotonic() >= deadline or self._forced:
                    logger.error("job %d failed and its failure could not be recorded (%s); it runs again after "
                                 "its lease", job.id, _one_line(db_error), extra=fields)
                    return
                await AsyncRuntime.sleep(backoff.next())
        dead = fail or job.attempts >= job.max_attempts
        with self._lock:
            if not held:
                self.counts.lost += 1
            elif dead:
                self.counts.failed += 1
            else:
                self.counts.retried += 1
        if not held:
            logger.warning("job %d failed (%s) but its claim was no longer valid (lease lapsed)", job.id, err,
                           extra=fields)
        elif dead:
            logger.error("job %d failed for good: %s", job.id, err, exc_info=error, extra=fields)
        else:
            logger.warning("job %d failed (attempt %d of %d), will retry: %s", job.id, job.attempts,
                           job.max_attempts, err, exc_info=error, extra=fields)
            self._wake.set()  # it may be due again soon (a short backoff)

    # acks --------------------------------------------------------------------

    async def _ack_loop(self) -> None:
        backoff = _Backoff(0.05, 2.0)
        while True:
            with self._lock:
                batch = self._acks_pending[:ACK_BATCH_MAX]
                del self._acks_pending[:ACK_BATCH_MAX]
            if not batch:
                if self._acks_closed:
                    return
                await self._acks.wait(None)
                self._acks.clear()
                continue
            acked: int | None = None
            while acked is None:
                try:
                    acked = await self.queue.ack_batch(self.worker_id, [running.handle for running in batch])
                except TRANSIENT_ERRORS as error:
                    if self._acks_closed and time.monotonic() >= self._ack_deadline:
                        logger.error("could not ack %d finished jobs (%s); they run again after their lease",
                                     len(batch), _one_line(error), extra=self._fields())
                        break
                    pause = backoff.next()
                    logger.warning("ack failed (%s); trying again in %.1fs", _one_line(error), pause,
                                   extra=self._fields())
                    await AsyncRuntime.sleep(pause)
                except Exception:
                    logger.exception("ack_batch failed; %d jobs run again after their lease", len(batch),
                                     extra=self._fields())
                    break
            if acked is None:
                continue
            backoff.reset()
            refused = len(batch) - acked
            with self._lock:
                self.counts.acked += acked
                self.counts.lost += refused
            if refused:
                logger.warning("%d of %d acks refused: those claims were no longer valid (lease lapsed)", refused,
                               len(batch), extra=self._fields())

    # heartbeats --------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        while not self._beats_done:
            self._beat.clear()
            now = time.monotonic()
            with self._lock:
                due = [running for running in self._in_flight.values() if running.next_beat <= now]
            for running in due:
                await self._beat_one(running)
            with self._lock:
                upcoming = min((running.next_beat for running in self._in_flight.values()), default=math.inf)
            await self._beat.wait(min(max(upcoming - time.monotonic(), 0.0), self.poll_interval))

    async def _beat_one(self, running: _Running) -> None:
        job = running.handle.job
        sent = time.monotonic()
        try:
            held = await running.handle.heartbeat()
        except TRANSIENT_ERRORS as error:
            running.next_beat = time.monotonic() + min(running.interval / 4, 1.0)
            logger.warning("heartbeat of job %d failed (%s)", job.id, _one_line(error), extra=self._fields(job))
            return
        except Exception:
            running.next_beat = time.monotonic() + running.interval
            logger.exception("heartbeat of job %d failed", job.id, extra=self._fields(job))
            return
        if held:
            running.next_beat = sent + running.interval
        else:
            running.lost = True
            running.next_beat = math.inf
            logger.warning("job %d lost its lease (it lapsed and may be running elsewhere); its outcome will not "
                           "count", job.id, extra=self._fields(job))

    # wake-ups ----------------------------------------------------------------

    async def _listen_loop(self) -> None:
        assert self._listen_conninfo is not None
        conninfo = self._listen_conninfo
        backoff = _Backoff(0.2, min(self.poll_interval, 5.0))
        while not self._stopping:
            pause = 0.0
            try:
                conn = await AsyncConnection.connect(conninfo, autocommit=True, connect_timeout=10)
                async with conn:
                    cursor = await conn.execute(QUEUE_CHANNEL, {"queue": self.queue.name})
                    row = await cursor.fetchone()
                    assert row is not None
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(row[0])))
                    self._listening = True
                    backoff.reset()
                    logger.debug("listening on %s", row[0], extra=self._fields(channel=row[0]))
                    self._wake.set()  # anything enqueued while we were not listening
                    while not self._stopping:
                        # Short slices: the threaded form notices a stop between them.
                        async for _notify in conn.notifies(timeout=0.25):
                            self._wake.set()
            except TRANSIENT_ERRORS as error:
                if self._stopping:
                    return
                pause = backoff.next()
                logger.warning("LISTEN connection lost (%s); reconnecting in %.1fs (polling meanwhile)",
                               _one_line(error), pause, extra=self._fields())
            except Exception:
                pause = backoff.next()
                logger.exception("LISTEN connection failed; polling only, retrying in %.1fs", pause,
                                 extra=self._fields())
            finally:
                self._listening = False
            if not self._stopping:
                await self._stop_event.wait(pause)

    # stop ----------------------------------------------------------------------

    async def _shutdown(self, tasks: dict[str, AsyncTask], grace: float) -> None:
        self.stop(force=grace <= 0)
        with self._lock:
            waiting = len(self._in_flight)
        if waiting:
            logger.info("stopping: waiting up to %.1fs for %d running jobs", grace, waiting, extra=self._fields())
        deadline = time.monotonic() + grace
        while True:
            self._drained.clear()
            with self._lock:
                waiting = len(self._in_flight)
            remaining = deadline - time.monotonic()
            if not waiting or remaining <= 0 or self._forced:
                break
            await self._drained.wait(remaining)
        if waiting:
            self._abandoned = True
            with self._lock:
                self.counts.abandoned += waiting
            logger.warning("grace period over: %d running jobs are left to lease expiry", waiting,
                           extra=self._fields())
            self._pool.cancel_all()
        await self._pool.close(1.0)
        # Flush what finished; keep trying for a while if the database is away.
        self._ack_deadline = time.monotonic() + max(grace, 5.0)
        self._acks_closed = True
        self._acks.set()
        await tasks["acks"].join(max(grace, 5.0) + 5.0)
        self._beats_done = True
        self._beat.set()
        for name, task in tasks.items():
            if name != "acks":
                task.cancel()
                await task.join(2.0)
            error = task.exception()
            if error is not None:
                logger.error("the worker's %s loop failed: %s", name, _one_line(error), exc_info=error,
                             extra=self._fields())
        logger.info(
            "worker stopped: %d acked, %d retried, %d failed, %d lost, %d left to lease expiry",
            self.counts.acked, self.counts.retried, self.counts.failed, self.counts.lost, self.counts.abandoned,
            extra=self._fields(acked=self.counts.acked, retried=self.counts.retried, failed=self.counts.failed,
                               lost=self.counts.lost, abandoned=self.counts.abandoned),
        )
