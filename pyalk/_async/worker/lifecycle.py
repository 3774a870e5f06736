"""The worker itself: its options, its parts and its lifecycle (the state
table in pyalk/worker/state.py): :meth:`AsyncWorker.run` starts the parts,
runs the claim loop until a stop, then shuts down in order (release what is
buffered, give running handlers the grace period, flush their outcomes).

The parts, one role each: the prefetch buffer (pyalk/worker/buffer.py), the
claim loop (claim.py) and its idle/wake handshake (advert.py), the runners
(runners.py), the settlement batcher (settlement.py), the heartbeater
(heartbeat.py), the row in the registry of workers (registry.py), the
rotation of job storage (rotation.py) and the
LISTEN connection (pyalk/_async/listener.py).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import secrets
import socket
from collections.abc import Sequence

from pyalk import _codec
from pyalk._async.job import AsyncJobHandle
from pyalk._async.listener import AsyncListener
from pyalk._async.queue import AsyncQueue
from pyalk._async.worker.advert import BUSY_POLL, AsyncIdleAdvert
from pyalk._async.worker.claim import AsyncClaimLoop
from pyalk._async.worker.heartbeat import AsyncHeartbeater, Running
from pyalk._async.worker.registry import AsyncRegistration
from pyalk._async.worker.rotation import LAST_CALL_WITHIN, AsyncRotator
from pyalk._async.worker.runners import AsyncRunners, Handler
from pyalk._async.worker.settlement import AsyncSettlementBatcher, Outcome, Settled
from pyalk.backoff import Backoff
from pyalk.errors import TRANSIENT_ERRORS
from pyalk.runtime import AsyncEvent, AsyncPool, AsyncRuntime, AsyncSignals, AsyncTask
from pyalk.worker.buffer import PREFETCH, PrefetchBuffer
from pyalk.worker.control import DEREGISTER_WITHIN
from pyalk.worker.deadline import StopDeadline
from pyalk.worker.errors import PermanentError, one_line
from pyalk.worker.in_flight import InFlight
from pyalk.worker.observer import WorkerObserver
from pyalk.worker.options import check_options
from pyalk.worker.state import ACTIVE, STOPPING, IllegalTransition, Lifecycle, WorkerState
from pyalk.worker.tally import LogFields, Tally, WorkerCounts

logger = logging.getLogger("pyalk.worker")

#: Most outcomes one settlement call carries.
SETTLE_BATCH_MAX = 1000
#: Default seconds an outcome waits for others before it is flushed alone.
SETTLE_INTERVAL = 0.005


def _default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class AsyncWorker:
    """Runs ``handler`` on the jobs of ``queue`` (a queue handle:
    ``alk.queue(name)``; ``alk.worker(name, handler)`` builds both),
    ``concurrency`` at a time.

    ``await worker.run()`` works until :meth:`stop` (or SIGINT/SIGTERM, when
    ``handle_signals`` and run from the main thread) and returns the
    :class:`~pyalk.WorkerCounts`; a worker runs once (a :meth:`stop` before
    :meth:`run` makes it return at once). The handler gets the claimed job handle
    (``job.payload``, ``job.job.attempts``, ``job.heartbeat()``); returning
    acks the job, raising one of ``fail_on`` fails it for good, raising
    anything else retries it on the row's backoff curve (dead once its
    attempts are used up), with ``Type: message`` as the error text.

    Options: ``prefetch`` is the most jobs held claimed but not yet started
    (default 1000: one claim feeds many handlers; the trade-off is that they
    are held by this worker, see docs/worker.md); ``buffer_lifetime`` the
    most seconds one waits there (default and cap: half its visibility
    timeout, less a second) before it is released unstarted; ``batch_size``
    caps one claim (default: ``prefetch``); ``settle_interval`` is how long
    an outcome waits to be settled with others (or with the next claim);
    ``poll_interval`` is the fallback poll in seconds when no NOTIFY comes;
    ``busy_poll``: while jobs arrive faster than one per this many seconds
    (an idle advert consumed sooner), the worker claims every ``busy_poll``
    instead of advertising, until two such claims in a row find nothing, so
    those enqueues do not notify (0: always advertise);
    ``grace_period`` is how long a stop waits for running handlers;
    ``heartbeat`` renews each running job's lease every half visibility
    timeout; ``listen`` opens the LISTEN connection (``listen_conninfo``, or
    the queue's own database); ``burst`` returns once nothing is claimable
    and nothing is running; ``observer`` (a
    :class:`~pyalk.worker.observer.WorkerObserver`, such as
    :class:`~pyalk.dashboard.metrics.WorkerMetrics`) is told of every claim call,
    handler run, settle call and release (none by default: no cost).

    Its lifecycle (:attr:`state`) is the table in :mod:`pyalk.worker.state`.
    """

    def __init__(
        self,
        queue: AsyncQueue,
        handler: Handler,
        *,
        concurrency: int = 10,
        worker_id: str | None = None,
        fail_on: type[BaseException] | tuple[type[BaseException], ...] = (PermanentError,),
        prefetch: int = PREFETCH,
        buffer_lifetime: float | None = None,
        batch_size: int | None = None,
        settle_interval: float = SETTLE_INTERVAL,
        poll_interval: float = 5.0,
        busy_poll: float = BUSY_POLL,
        grace_period: float = 30.0,
        heartbeat: bool = True,
        listen: bool = True,
        listen_conninfo: str | None = None,
        handle_signals: bool = True,
        burst: bool = False,
        observer: WorkerObserver | None = None,
    ) -> None:
        if not isinstance(queue, AsyncQueue):
            raise TypeError(f"queue must be a queue handle (alk.queue(name)), got {queue!r}")
        AsyncRuntime.check_handler(handler)
        check_options(concurrency=concurrency, prefetch=prefetch, batch_size=batch_size,
                      buffer_lifetime=buffer_lifetime, settle_interval=settle_interval, poll_interval=poll_interval,
                      busy_poll=busy_poll, grace_period=grace_period)
        self.queue = queue
        self.handler = handler
        self.concurrency = concurrency
        self.worker_id = _default_worker_id() if worker_id is None else str(_codec.text(worker_id, "worker_id"))
        self.fail_on = fail_on if isinstance(fail_on, tuple) else (fail_on,)
        self.prefetch = prefetch
        self.buffer_lifetime = math.inf if buffer_lifetime is None else float(buffer_lifetime)
        self.batch_size = batch_size or max(prefetch, concurrency)
        self.settle_interval = float(settle_interval)
        self.poll_interval = float(poll_interval)
        self.busy_poll = min(float(busy_poll), self.poll_interval)
        self.grace_period = float(grace_period)
        self.heartbeat = heartbeat
        self.handle_signals = handle_signals
        self.burst = burst
        conninfo = (listen_conninfo or queue.executor.listen_conninfo()) if listen else None

        self._fields = LogFields(queue.name, self.worker_id)
        self._tally = Tally(self._fields, observer)
        self.counts = self._tally.counts
        # Set from any thread or signal handler; waited on by the loops.
        self._stopped = AsyncEvent()  # claiming is over: ends backoff sleeps and the listener
        self._wake = AsyncEvent()  # NOTIFY, retry, stop: look for claimable jobs
        self._filled = AsyncEvent()  # jobs were buffered (or a stop): runners look again
        self._left = AsyncEvent()  # a running job left while a draining stop watches
        self._deadline = StopDeadline(self.grace_period)  # set at the stop: bounds every wait after it
        self._claim_error: Exception | None = None  # what ended the claim loop, if it failed
        self._life = Lifecycle(self._entered, deadline=self._deadline)
        self._buffer: PrefetchBuffer[AsyncJobHandle] = PrefetchBuffer(
            prefetch=prefetch, concurrency=concurrency, batch_size=self.batch_size, lifetime=self.buffer_lifetime)
        self._in_flight: InFlight[Running] = InFlight(self._left.set)
        self._settler = AsyncSettlementBatcher(self._settle_batch, self._settled, logger=logger,
                                               extra=self._fields(), batch_max=SETTLE_BATCH_MAX,
                                               interval=self.settle_interval, on_given_up=self._given_up)
        self._heartbeater = AsyncHeartbeater(self._in_flight.jobs, poll_interval=self.poll_interval, logger=logger,
                                             fields=self._fields)
        self._listener = None if conninfo is None else AsyncListener(
            conninfo, queue.channel, backoff=Backoff(0.05, min(self.poll_interval, 0.5)), connect_timeout=10
        )
        self._advert = AsyncIdleAdvert(queue, self.worker_id, self._listener, busy_poll=self.busy_poll,
                                       wake=self._wake, stopped=self._stopped, life=self._life)
        self._runners = AsyncRunners(
            handler, concurrency=concurrency, fail_on=self.fail_on, buffer=self._buffer, in_flight=self._in_flight,
            settler=self._settler, heartbeater=self._heartbeater, heartbeat=heartbeat, tally=self._tally,
            life=self._life, wake=self._wake, filled=self._filled, poll_interval=self.poll_interval, burst=burst)
        self._claims = AsyncClaimLoop(
            queue, self.worker_id, buffer=self._buffer, holding=self._runners.holding, in_flight=self._in_flight,
            settler=self._settler, on_settled=self._settled, advert=self._advert, tally=self._tally,
            life=self._life, wake=self._wake, filled=self._filled, stopped=self._stopped,
            poll_interval=self.poll_interval, burst=burst)
        self._pool = AsyncPool(concurrency, name=f"pyalk-worker-{queue.name}")
        self._registration = AsyncRegistration(
            queue, self.worker_id, concurrency=concurrency, listener=self._listener, stop=self.stop,
            cancel=self._runners.cancel,
            holding=lambda: len(self._in_flight) + len(self._buffer) + len(self._settler), fields=self._fields)
        self._rotator = AsyncRotator(queue, settled=lambda: self._tally.counts.finished, fields=self._fields)

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
    def buffered(self) -> int:
        """How many claimed jobs wait in the local buffer."""
        return len(self._buffer)

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
            for event in (self._stopped, self._wake, self._left, self._filled):
                event.set()

    def _on_signal(self, number: int) -> None:
        if self._life.stopping():
            logger.warning("second signal %d: stopping now, in-flight jobs are left to lease expiry", number,
                           extra=self._fields())
            self.stop(force=True)
        else:
            logger.info("signal %d: stopping (grace period %.1fs)", number, self.grace_period, extra=self._fields())
            self.stop()

    # run -------------------------------------------------------------------

    async def run(self) -> WorkerCounts:
        """Work until stopped; the counts of what was done."""
        for event in (self._stopped, self._wake, self._left, self._filled):
            await event.wait(0)  # binds each event to this loop (a no-op for threads)
        try:
            self._life.advance(WorkerState.STARTING)
        except IllegalTransition:
            doing = "already running" if self.running else "finished"
            raise RuntimeError(f"{self!r} is {doing}: a worker runs once") from None
        self._runners.debug = logger.isEnabledFor(logging.DEBUG)
        signals = AsyncSignals()
        tasks: dict[str, AsyncTask] = {}
        interrupted = False
        try:
            if self.handle_signals:
                signals.install(self._on_signal)
            logger.info(
                "worker started: queue %r, concurrency %d, prefetch %d, %s",
                self.queue.name,
                self.concurrency,
                self.prefetch,
                "LISTEN + fallback poll" if self._listener else "polling only (listen=False)",
                extra=self._fields(concurrency=self.concurrency, prefetch=self.prefetch),
            )
            tasks["acks"] = AsyncRuntime.spawn(self._settler.run, name="pyalk-worker-acks")
            tasks["registry"] = AsyncRuntime.spawn(self._registration.run, name="pyalk-worker-registry")
            tasks["rotation"] = AsyncRuntime.spawn(self._rotator.run, name="pyalk-worker-rotation")
            if self.heartbeat:
                tasks["heartbeats"] = AsyncRuntime.spawn(self._heartbeater.run, name="pyalk-worker-heartbeats")
            if self._listener is not None:
                tasks["listen"] = AsyncRuntime.spawn(
                    self._listener.run, self._wake, self._stopped, logger, self._fields(), name="pyalk-worker-listen"
                )
            if self._life.begin_running():
                for index in range(self.concurrency):
                    self._pool.submit(self._runners.run, index)
                # The claim loop runs beside this one, which can stop waiting
                # for it: at a stop it may be waiting on the server.
                tasks["claims"] = AsyncRuntime.spawn(self._claim, name="pyalk-worker-claims")
                await self._stopped.wait(None)  # a stop, or the claim loop is over (a burst done, an error)
                await self._end_claims(tasks)
                if self._claim_error is not None:
                    raise self._claim_error
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

    async def _claim(self) -> None:
        """The claim loop, as a task: its error is kept for run() to raise."""
        try:
            await self._claims.run()
        except Exception as error:
            self._claim_error = error
        finally:
            self._stopped.set()  # claiming is over: run() goes on to the shutdown

    async def _end_claims(self, tasks: dict[str, AsyncTask]) -> None:
        """Let the claim loop return (it does within a round trip of a stop);
        one still waiting on the server after its straggle is given up: the
        async form cancels it (a claim in flight is cancelled in the server),
        the threaded form leaves its thread, and what it claims then is left
        to its lease."""
        claims = tasks.pop("claims", None)
        if claims is None or await claims.join(self._deadline.straggle()):
            return
        claims.cancel()
        logger.warning("stopping: the claim in flight is still waiting on the database; given up",
                       extra=self._fields())

    # settlement ------------------------------------------------------------

    async def _settle_batch(self, batch: list[Outcome]) -> Sequence[Settled]:
        """Settle one batch of outcomes (the flush loop's call): the state each led to."""
        return await self.queue.settle(self.worker_id, [(o.handle.job, o.kind, o.error) for o in batch],
                                       results=[o.result for o in batch])

    def _settled(self, batch: Sequence[Outcome], states: Sequence[Settled], seconds: float) -> None:
        """What a settle call (the flush loop's, or a claim's) led to: counted and logged."""
        if self._tally.settled(batch, states, seconds) or (self.burst and not self._buffer.jobs):
            self._wake.set()  # it may be due again soon (a short backoff); a burst may be over

    def _given_up(self, batch: Sequence[Outcome]) -> None:
        """Outcomes the settler could not record: the jobs run again after their lease."""
        self._tally.released(len(batch))

    # stop ----------------------------------------------------------------------

    async def _release_buffer(self, within: float) -> None:
        """Give back what never started, if the database answers ``within``
        seconds; otherwise those jobs run again after their lease."""
        self._buffer.release_all()
        if not self._buffer.unstarted:
            return
        jobs = self._buffer.take_unstarted()
        self._tally.released(len(jobs))  # held no more: released, or left to their leases
        try:
            await AsyncRuntime.within(within, self._claims.release, jobs)
        except TimeoutError:
            logger.warning("stopping: no answer from the database in time to release %d unstarted jobs; they run "
                           "again after their lease", len(jobs), extra=self._fields())

    async def _shutdown(self, tasks: dict[str, AsyncTask], grace: float) -> None:
        """Stop in order, every wait bounded by the stop's deadline (the grace
        period plus STOP_MARGIN): whatever the database does, this returns by then."""
        self.stop(force=grace <= 0)
        deadline = self._deadline
        await self._end_claims(tasks)
        # What never started goes back at once, for other workers to take
        # (within the grace period: the margin is kept for the final flush).
        await self._release_buffer(max(deadline.grace_left(), deadline.straggle()))
        if self._advert.advertised:
            with contextlib.suppress(TimeoutError, *TRANSIENT_ERRORS):  # the advert dies with its session
                await AsyncRuntime.within(deadline.left(), self._advert.retire)
        self._in_flight.watched = True
        waiting = len(self._in_flight)
        if waiting:
            logger.info("stopping: waiting up to %.1fs for %d running jobs", deadline.grace_left(), waiting,
                        extra=self._fields())
        while True:
            self._left.clear()
            waiting = len(self._in_flight)
            remaining = deadline.grace_left()
            if not waiting or remaining <= 0 or self._life.state is WorkerState.FORCED:
                break
            await self._left.wait(remaining)
        self._life.advance(WorkerState.FLUSHING)
        if waiting:
            self._tally.add(abandoned=waiting)
            self._tally.released(waiting)
            logger.warning("grace period over: %d running jobs are left to lease expiry", waiting,
                           extra=self._fields())
            self._pool.cancel_all()
        await self._pool.close(min(1.0, deadline.left()))
        await self._release_buffer(deadline.left())  # a runner may have put one back meanwhile
        # Flush what finished, retrying until the deadline if the database is away.
        self._settler.close(deadline.at)
        acks = tasks.get("acks")
        if acks is not None and not await acks.join(deadline.left()):
            acks.cancel()
            unsettled = self._settler.abandon()
            self._tally.released(unsettled)
            logger.warning("stopping: no answer from the database in time to settle %d finished jobs; they run "
                           "again after their lease", unsettled, extra=self._fields())
        self._heartbeater.close()
        self._rotator.close()  # after one last call, within a bound: the jobs just settled may make it due
        self._registration.close()  # deregisters, within a bound: a silent server never holds up the exit
        if "rotation" in tasks:
            await tasks["rotation"].join(min(LAST_CALL_WITHIN, deadline.left()))
        if "registry" in tasks:
            await tasks["registry"].join(min(DEREGISTER_WITHIN, deadline.left()))
        for name, task in tasks.items():
            if name != "acks":
                task.cancel()
                if not await task.join(min(2.0, deadline.left())):
                    logger.warning("stopping: the worker's %s loop is still waiting on the database; left behind",
                                   name, extra=self._fields())
            error = task.exception()
            if error is not None:
                logger.error("the worker's %s loop failed: %s", name, one_line(error), exc_info=error,
                             extra=self._fields())
        logger.info(
            "worker stopped: %d acked, %d retried, %d failed, %d lost, %d left to lease expiry, %d released unstarted",
            self.counts.acked, self.counts.retried, self.counts.failed, self.counts.lost, self.counts.abandoned,
            self.counts.released,
            extra=self._fields(acked=self.counts.acked, retried=self.counts.retried, failed=self.counts.failed,
                               lost=self.counts.lost, abandoned=self.counts.abandoned, released=self.counts.released),
        )
