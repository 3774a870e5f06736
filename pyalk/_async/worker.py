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

The worker's lifecycle is the state table in pyalk/worker_state.py; its
parts each have one job: AsyncSettlementBatcher (settlement.py) flushes
finished outcomes, AsyncHeartbeater (heartbeat.py) renews leases,
AsyncListener (listener.py) keeps the LISTEN connection. The threaded form
(pyalk/_sync/worker.py) is generated from this file; the primitives that
differ (tasks vs threads, signals) are in pyalk/worker_runtime.py.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from pyalk import _codec
from pyalk._async.heartbeat import AsyncHeartbeater, Running
from pyalk._async.listener import AsyncListener
from pyalk._async.queue import AsyncJobHandle, AsyncQueue
from pyalk._async.settlement import AsyncSettlementBatcher, Outcome
from pyalk.backoff import Backoff
from pyalk.job import Job
from pyalk.worker_runtime import AsyncEvent, AsyncPool, AsyncRuntime, AsyncSignals, AsyncTask
from pyalk.worker_state import ABANDONED, ACTIVE, CUT_OFF, STOPPING, IllegalTransition, Lifecycle, WorkerState
from pyalk.worker_types import (
    TRANSIENT_ERRORS,
    PermanentError,
    WorkerCounts,
    error_text,
    one_line,
)

if TYPE_CHECKING:
    from pyalk._async.client import AsyncAlk

logger = logging.getLogger("pyalk.worker")

#: A job handler: called with the claimed job; returning means success.
Handler = Callable[[AsyncJobHandle], Awaitable[Any]]

#: Most ids one alk.ack_batch call carries.
ACK_BATCH_MAX = 1000

# the worker ------------------------------------------------------------------


class _InFlight:
    """The jobs whose handlers are running, by claim. ``changed`` is set
    whenever one leaves (and on every stop transition): a full claim loop and
    a draining shutdown wait on it."""

    def __init__(self) -> None:
        self._jobs: dict[tuple[int, int], Running] = {}
        self._lock = threading.Lock()
        self.changed = AsyncEvent()

    def __len__(self) -> int:
        return len(self._jobs)

    def add(self, running: Running) -> None:
        with self._lock:
            self._jobs[running.key] = running

    def remove(self, running: Running) -> None:
        with self._lock:
            self._jobs.pop(running.key, None)
        self.changed.set()

    def jobs(self) -> list[Running]:
        with self._lock:
            return list(self._jobs.values())


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

    Its lifecycle (:attr:`state`) is the table in :mod:`pyalk.worker_state`.
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
        conninfo = (listen_conninfo or alk.executor.listen_conninfo()) if listen else None

        self._counts_lock = threading.Lock()
        self._in_flight = _InFlight()
        # Set from any thread or signal handler; waited on by the loops.
        self._stopped = AsyncEvent()  # claiming is over: ends backoff sleeps and the listener
        self._wake = AsyncEvent()  # NOTIFY, retry, stop: look for claimable jobs
        self._life = Lifecycle(self._entered)
        self._settler = AsyncSettlementBatcher(self._settle_batch, self._settled, logger=logger,
                                               extra=self._fields(), batch_max=ACK_BATCH_MAX)
        self._heartbeater = AsyncHeartbeater(self._in_flight.jobs, poll_interval=self.poll_interval, logger=logger,
                                             fields=self._fields)
        self._listener = None if conninfo is None else AsyncListener(
            conninfo, self._channel, backoff=Backoff(0.2, min(self.poll_interval, 5.0)), connect_timeout=10
        )
        self._pool = AsyncPool(concurrency, name=f"pyalk-worker-{self.queue.name}")

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(queue={self.queue.name!r}, worker_id={self.worker_id!r}, "
            f"concurrency={self.concurrency})"
        )

    @property
    def state(self) -> WorkerState:
        """Where the worker is in its lifecycle."""
        return self._life.state

    @property
    def running(self) -> bool:
        """Whether :meth:`run` is in progress."""
        return self._life.state in ACTIVE

    @property
    def in_flight(self) -> int:
        """How many handlers are running now."""
        return len(self._in_flight)

    @property
    def listening(self) -> bool:
        """Whether the LISTEN connection is up (wake-ups at commit)."""
        return self._listener is not None and self._listener.listening

    def stop(self, *, force: bool = False) -> None:
        """Stop claiming; running handlers get the grace period (``force``:
        none). Safe from any thread and from a signal handler; returns at once."""
        self._life.request_stop(force=force)

    def _entered(self, old: WorkerState, new: WorkerState) -> None:
        """Every lifecycle transition: logged, and a stop wakes every wait."""
        logger.debug("worker %s -> %s", old.value, new.value,
                     extra=self._fields(state=new.value, previous=old.value))
        if new in STOPPING:
            for event in (self._stopped, self._wake, self._in_flight.changed):
                event.set()

    def _on_signal(self, number: int) -> None:
        if self._life.stopping():
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

    def _count(self, **deltas: int) -> None:
        with self._counts_lock:
            for name, delta in deltas.items():
                setattr(self.counts, name, getattr(self.counts, name) + delta)

    # run -------------------------------------------------------------------

    async def run(self) -> WorkerCounts:
        """Work until stopped; the counts of what was done."""
        for event in (self._stopped, self._wake, self._in_flight.changed):
            await event.wait(0)  # binds each event to this loop (a no-op for threads)
        try:
            self._life.advance(WorkerState.STARTING)
        except IllegalTransition:
            doing = "already running" if self.running else "finished"
            raise RuntimeError(f"{self!r} is {doing}: a worker runs once") from None
        signals = AsyncSignals()
        tasks: dict[str, AsyncTask] = {}
        interrupted = False
        try:
            if self.handle_signals:
                signals.install(self._on_signal)
            logger.info(
                "worker started: queue %r, concurrency %d, %s",
                self.queue.name,
                self.concurrency,
                "LISTEN + fallback poll" if self._listener else "polling only (listen=False)",
                extra=self._fields(concurrency=self.concurrency),
            )
            tasks["acks"] = AsyncRuntime.spawn(self._settler.run, name="pyalk-worker-acks")
            if self.heartbeat:
                tasks["heartbeats"] = AsyncRuntime.spawn(self._heartbeater.run, name="pyalk-worker-heartbeats")
            if self._listener is not None:
                tasks["listen"] = AsyncRuntime.spawn(
                    self._listener.run, self._wake, self._stopped, logger, self._fields(), name="pyalk-worker-listen"
                )
            if self._life.begin_running():
                await self._claim_loop()
        except BaseException:
            interrupted = True
            raise
        finally:
            try:
                await self._shutdown(tasks, grace=0.0 if interrupted else self.grace_period)
            finally:
                signals.restore()
                if self._life.state is not WorkerState.FLUSHING:  # _shutdown failed early
                    self._life.request_stop(force=True)
                    self._life.advance(WorkerState.FLUSHING)
                self._life.advance(WorkerState.STOPPED)
        return self.counts

    async def _claim_loop(self) -> None:
        idle = Backoff(0.05, self.poll_interval)
        failing = Backoff(0.1, min(self.poll_interval, 5.0))
        while self._life.state is WorkerState.RUNNING:
            free = self.concurrency - len(self._in_flight)
            if free <= 0:
                # Full: wait for a handler to finish (a NOTIFY cannot help).
                self._in_flight.changed.clear()
                if len(self._in_flight) >= self.concurrency and not self._life.stopping():
                    await self._in_flight.changed.wait(self.poll_interval)
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

    async def _pause_for(self, error: BaseException, backoff: Backoff) -> None:
        pause = backoff.next()
        logger.warning("database unavailable (%s); trying again in %.1fs", one_line(error), pause,
                       extra=self._fields())
        await self._stopped.wait(pause)

    async def _seconds_until_claimable(self) -> float | None:
        at, now, wall = await self.queue.next_claim_clock()
        if at is None:
            return None
        if math.floor(wall) == now:  # the clock is the wall clock: sleep to the sub-second
            return float(at) - wall
        return float(at - now)  # a pinned clock (tests, replays): whole seconds

    async def _channel(self) -> str:
        """The LISTEN channel of the queue (the listener asks once)."""
        return await self.queue.channel()

    # one job ---------------------------------------------------------------

    def _start(self, handle: AsyncJobHandle) -> None:
        now = time.monotonic()
        # A lease lasts at least visibility_timeout_s seconds from the claim:
        # renewing at half of it leaves the other half for a slow round trip.
        interval = max(handle.job.visibility_timeout_s / 2, 0.05)
        running = Running(handle, started=now, interval=interval,
                          next_beat=now + interval if self.heartbeat else math.inf)
        self._in_flight.add(running)
        self._count(claimed=1)
        self._pool.submit(self._process, running)
        if self.heartbeat:
            self._heartbeater.poke()

    async def _process(self, running: Running) -> None:
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
            if self._life.state in ABANDONED:
                return  # past the grace period: the job is left to lease expiry
            if error is None:
                logger.debug("job %d done in %.3fs", job.id, duration, extra=self._fields(job, duration_s=duration))
                self._settler.add(Outcome(handle))
            elif isinstance(error, self.fail_on):
                await self._settle(running, error, duration, fail=True)
            else:
                await self._settle(running, error, duration, fail=False)
        finally:
            self._in_flight.remove(running)
            if self.burst:
                self._wake.set()

    async def _settle(self, running: Running, error: Exception, duration: float, *, fail: bool) -> None:
        """Record a failed handler: fail (dead now) or retry (backoff curve)."""
        handle = running.handle
        job = handle.job
        err = error_text(error)
        fields = self._fields(job, duration_s=duration, error=err)
        # A lost connection is retried until the lease would have run out
        # anyway; after that the job runs again (at least once) whatever we do.
        deadline = time.monotonic() + min(max(job.visibility_timeout_s, 2), 60)
        backoff = Backoff(0.1, 2.0)
        while True:
            try:
                held = await (handle.fail(err) if fail else handle.retry(err))
                break
            except TRANSIENT_ERRORS as db_error:
                if time.monotonic() >= deadline or self._life.state in CUT_OFF:
                    logger.error("job %d failed and its failure could not be recorded (%s); it runs again after "
                                 "its lease", job.id, one_line(db_error), extra=fields)
                    return
                await AsyncRuntime.sleep(backoff.next())
        dead = fail or job.attempts >= job.max_attempts
        if not held:
            self._count(lost=1)
        elif dead:
            self._count(failed=1)
        else:
            self._count(retried=1)
        if not held:
            logger.warning("job %d failed (%s) but its claim was no longer valid (lease lapsed)", job.id, err,
                           extra=fields)
        elif dead:
            logger.error("job %d failed for good: %s", job.id, err, exc_info=error, extra=fields)
        else:
            logger.warning("job %d failed (attempt %d of %d), will retry: %s", job.id, job.attempts,
                           job.max_attempts, err, exc_info=error, extra=fields)
            self._wake.set()  # it may be due again soon (a short backoff)

    # settlement ----------------------------------------------------------------

    async def _settle_batch(self, batch: list[Outcome]) -> int:
        """Settle one batch of outcomes; how many claims were still valid.
        Only acks are batched today (failures are recorded by _settle)."""
        return await self.queue.ack_batch(self.worker_id, [outcome.handle for outcome in batch])

    def _settled(self, acked: int, refused: int) -> None:
        self._count(acked=acked, lost=refused)

    # stop ----------------------------------------------------------------------

    async def _shutdown(self, tasks: dict[str, AsyncTask], grace: float) -> None:
        self.stop(force=grace <= 0)
        waiting = len(self._in_flight)
        if waiting:
            logger.info("stopping: waiting up to %.1fs for %d running jobs", grace, waiting, extra=self._fields())
        deadline = time.monotonic() + grace
        while True:
            self._in_flight.changed.clear()
            waiting = len(self._in_flight)
            remaining = deadline - time.monotonic()
            if not waiting or remaining <= 0 or self._life.state is WorkerState.FORCED:
                break
            await self._in_flight.changed.wait(remaining)
        self._life.advance(WorkerState.FLUSHING)
        if waiting:
            self._count(abandoned=waiting)
            logger.warning("grace period over: %d running jobs are left to lease expiry", waiting,
                           extra=self._fields())
            self._pool.cancel_all()
        await self._pool.close(1.0)
        # Flush what finished; keep trying for a while if the database is away.
        self._settler.close(max(grace, 5.0))
        if "acks" in tasks:
            await tasks["acks"].join(max(grace, 5.0) + 5.0)
        self._heartbeater.close()
        for name, task in tasks.items():
            if name != "acks":
                task.cancel()
                await task.join(2.0)
            error = task.exception()
            if error is not None:
                logger.error("the worker's %s loop failed: %s", name, one_line(error), exc_info=error,
                             extra=self._fields())
        logger.info(
            "worker stopped: %d acked, %d retried, %d failed, %d lost, %d left to lease expiry",
            self.counts.acked, self.counts.retried, self.counts.failed, self.counts.lost, self.counts.abandoned,
            extra=self._fields(acked=self.counts.acked, retried=self.counts.retried, failed=self.counts.failed,
                               lost=self.counts.lost, abandoned=self.counts.abandoned),
        )
