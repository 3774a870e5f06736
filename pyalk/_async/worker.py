"""The worker runtime: claim jobs of one queue, run a handler on each, settle
the outcome. (The queue functions it calls are bound in queue.py.)

Every queue rule (claim order, leases, fencing, backoff, burial) is the SQL's
(sql/queue.sql); the worker only decides when to call it:

* it claims ahead into a local buffer (``prefetch``, default 1000 jobs, sized
  by the rate it starts jobs at), so one round trip feeds many handlers even
  at concurrency 1; ``concurrency`` runners (tasks, or threads) take jobs from
  the buffer one after the other, with no hand-off per job;
* a buffered job starts only while its lease surely holds: before half its
  visibility timeout (less a second for the whole-second clock) has passed
  since the claim was sent, or ``buffer_lifetime``; a job that waited longer,
  and every buffered job at a stop, goes back to pending at once without
  spending an attempt (``alk.release_jobs``);
* every outcome (ack, retry, fail) is settled in batches (flushed at
  ``settle_interval`` or when a batch is full) and carried with the next
  claim in one call (``alk.settle_and_claim``); the SQL reports what each
  led to (acked, pending again, dead), which is all the worker counts;
* when a claim comes back short it advertises itself idle
  (``alk.wait_for_jobs``, after LISTEN) so enqueues notify it, claims once
  more behind the advert's fence (``alk.wake_fence``), waits for NOTIFY, a
  fallback poll or ``alk.next_claim_at``, and withdraws the advert once busy
  again (``alk.stop_waiting``); a busy worker is never notified; the enqueue
  that notifies consumes the advert, so after any notification the worker
  advertises again (and takes a new fence) before it waits again;
* it heartbeats each running job every half visibility timeout, counted from
  its claim;
* on stop (``stop()``, SIGINT, SIGTERM) it stops claiming, releases what it
  buffered, gives running handlers ``grace_period`` seconds, flushes their
  outcomes and leaves whatever is still running to lease expiry;
* it treats a lost connection (server restart, terminated backend) as
  transient: it reconnects and carries on. A job whose outcome could not be
  recorded runs again after its lease: at least once, never lost.

The worker's lifecycle is the state table in pyalk/worker_state.py; its
parts each have one job: AsyncSettlementBatcher (settlement.py) batches
outcomes, AsyncHeartbeater (heartbeat.py) renews leases, AsyncListener
(listener.py) keeps the LISTEN connection. The threaded form
(pyalk/_sync/worker.py) is generated from this file; the primitives that
differ (tasks vs threads, signals) are in pyalk/worker_runtime.py.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import secrets
import socket
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from pyalk import _codec
from pyalk._async.heartbeat import AsyncHeartbeater, Running
from pyalk._async.listener import AsyncListener
from pyalk._async.queue import AsyncJobHandle, AsyncQueue
from pyalk._async.settlement import AsyncSettlementBatcher, Outcome, Settled
from pyalk.backoff import Backoff
from pyalk.errors import TRANSIENT_ERRORS
from pyalk.values import Job
from pyalk.worker_runtime import AsyncEvent, AsyncPool, AsyncRuntime, AsyncSignals, AsyncTask
from pyalk.worker_state import ABANDONED, ACTIVE, STOPPING, IllegalTransition, Lifecycle, WorkerState
from pyalk.worker_types import PermanentError, WorkerCounts, error_text, one_line

if TYPE_CHECKING:
    from pyalk._async.client import AsyncAlk
    from pyalk.metrics import WorkerObserver

logger = logging.getLogger("pyalk.worker")

#: A job handler: called with the claimed job; returning means success.
Handler = Callable[[AsyncJobHandle], Awaitable[Any]]

#: Most outcomes one settlement call carries.
SETTLE_BATCH_MAX = 1000
#: Default most jobs claimed ahead. Each claim is a durable commit (a WAL
#: flush) plus a fixed cost per call, so a buffer refilled in claims of 500
#: rather than 250 is 13-25% faster end to end (issue 11, measured).
PREFETCH = 1000
#: A refill is claimed once the buffer is down to this fraction of its target.
REFILL_AT = 0.5
#: Default seconds an outcome waits for others before it is flushed alone.
SETTLE_INTERVAL = 0.005
#: Jobs a runner starts back to back before it lets the other loops in.
YIELD_EVERY = 16
#: The first and the longest pause between polls of an idle advert's fence.
FENCE_POLL = (0.001, 0.1)
#: Default busy poll (seconds): an advert consumed sooner than this means jobs
#: arrive faster than one per interval; notifying for each arrival would put
#: an enqueue through PostgreSQL's notify lock every few jobs (docs/worker.md).
BUSY_POLL = 0.005
#: Busy polls in a row that find nothing before the worker advertises again:
#: durable commits land in groups, one per WAL flush, so one empty poll is
#: often a flush, not the end of the stream.
BUSY_QUIET = 2

# the worker ------------------------------------------------------------------


class _InFlight:
    """The jobs whose handlers are running, by claim. ``changed`` is set on
    every stop transition and, once ``watched`` (a draining shutdown waits on
    it), whenever one leaves; not before, which saves an event set per job."""

    def __init__(self) -> None:
        self._jobs: set[Running] = set()  # by identity (Running is eq=False): no key to build per job
        self._lock = threading.Lock()
        self.changed = AsyncEvent()
        self.watched = False

    def __len__(self) -> int:
        return len(self._jobs)

    def add(self, running: Running) -> None:
        with self._lock:
            self._jobs.add(running)

    def remove(self, running: Running) -> None:
        with self._lock:
            self._jobs.discard(running)
        if self.watched:  # set before the watcher's count: a leave after it is seen
            self.changed.set()

    def jobs(self) -> list[Running]:
        with self._lock:
            return list(self._jobs)


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
    the client's own conninfo); ``burst`` returns once nothing is claimable
    and nothing is running; ``observer`` (a
    :class:`~pyalk.metrics.WorkerObserver`, such as
    :class:`~pyalk.metrics.WorkerMetrics`) is told of every claim call,
    handler run, settle call and release (none by default: no cost).

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
        AsyncRuntime.check_handler(handler)
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be a positive int, got {concurrency!r}")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise ValueError(f"prefetch must be an int >= 0, got {prefetch!r}")
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
            raise ValueError(f"batch_size must be a positive int or None, got {batch_size!r}")
        if buffer_lifetime is not None and not buffer_lifetime >= 0:
            raise ValueError(f"buffer_lifetime must be >= 0 seconds or None, got {buffer_lifetime!r}")
        if not settle_interval >= 0:
            raise ValueError(f"settle_interval must be >= 0 seconds, got {settle_interval!r}")
        if not poll_interval > 0:
            raise ValueError(f"poll_interval must be > 0 seconds, got {poll_interval!r}")
        if not busy_poll >= 0:
            raise ValueError(f"busy_poll must be >= 0 seconds, got {busy_poll!r}")
        if not grace_period >= 0:
            raise ValueError(f"grace_period must be >= 0 seconds, got {grace_period!r}")
        self.alk = alk
        self.queue = queue if isinstance(queue, AsyncQueue) else alk.queue(queue)
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
        self._observer = observer
        self.counts = WorkerCounts()
        conninfo = (listen_conninfo or alk.executor.listen_conninfo()) if listen else None

        self._counts_lock = threading.Lock()
        self._in_flight = _InFlight()
        #: Claimed, not started: (handle, monotonic claim send time, start-by).
        self._buffer: deque[tuple[AsyncJobHandle, float, float]] = deque()
        self._unstarted: list[Job] = []  # to release: waited too long, or popped at a stop
        #: Per runner: 1 from just before it pops a job until the job's
        #: outcome (or release) is handed on, so no job is ever out of sight
        #: of _quiet() between the buffer and the settler (threads).
        self._holding = [0] * concurrency
        self._rate = 0.0  # jobs started per second (moving average): sizes the claims
        self._window = math.inf  # seconds a claimed job may wait to start (the last claim's leases)
        self._drained = False  # the last claim came back short: refill on a wake-up, not at half a buffer
        self._low = 0  # a runner asks for a refill once the buffer is down to this many (half the target)
        self._asked = False  # a refill is asked for or under way: the runners need not ask again
        self._advertised = False  # idle advert in place (alk.wait_for_jobs)
        self._advertised_at = 0  # the listener's notification count when it was made
        self._advertised_since = 0.0  # monotonic time it was made
        self._busy = 0  # adverts consumed within busy_poll: empty polls left before advertising again
        self._debug = False
        # Set from any thread or signal handler; waited on by the loops.
        self._stopped = AsyncEvent()  # claiming is over: ends backoff sleeps and the listener
        self._wake = AsyncEvent()  # NOTIFY, retry, stop: look for claimable jobs
        self._filled = AsyncEvent()  # jobs were buffered (or a stop): runners look again
        self._life = Lifecycle(self._entered)
        self._settler = AsyncSettlementBatcher(self._settle_batch, self._settled, logger=logger,
                                               extra=self._fields(), batch_max=SETTLE_BATCH_MAX,
                                               interval=self.settle_interval, on_given_up=self._given_up)
        self._heartbeater = AsyncHeartbeater(self._in_flight.jobs, poll_interval=self.poll_interval, logger=logger,
                                             fields=self._fields)
        self._listener = None if conninfo is None else AsyncListener(
            conninfo, self._channel, backoff=Backoff(0.05, min(self.poll_interval, 0.5)), connect_timeout=10
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
            for event in (self._stopped, self._wake, self._in_flight.changed, self._filled):
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
        for event in (self._stopped, self._wake, self._in_flight.changed, self._filled):
            await event.wait(0)  # binds each event to this loop (a no-op for threads)
        try:
            self._life.advance(WorkerState.STARTING)
        except IllegalTransition:
            doing = "already running" if self.running else "finished"
            raise RuntimeError(f"{self!r} is {doing}: a worker runs once") from None
        self._debug = logger.isEnabledFor(logging.DEBUG)
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
            if self.heartbeat:
                tasks["heartbeats"] = AsyncRuntime.spawn(self._heartbeater.run, name="pyalk-worker-heartbeats")
            if self._listener is not None:
                tasks["listen"] = AsyncRuntime.spawn(
                    self._listener.run, self._wake, self._stopped, logger, self._fields(), name="pyalk-worker-listen"
                )
            if self._life.begin_running():
                for index in range(self.concurrency):
                    self._pool.submit(self._runner, index)
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

    # claiming --------------------------------------------------------------

    def _target(self) -> int:
        """How many jobs to hold claimed ahead: what the runners start at the
        measured rate in half a buffer lifetime or within the leases' start
        window, whichever is shorter (more would be claimed only to be
        released), at least one per runner, at most ``prefetch`` beyond them."""
        horizon = min(self.buffer_lifetime, 150.0) / 2
        ahead = math.ceil(self._rate * min(horizon, self._window))
        return max(self.concurrency, min(ahead, self.prefetch))

    def _wanted(self) -> int:
        """How many to claim now: a refill once the buffer is down to REFILL_AT of its target."""
        target = self._target()
        have = len(self._buffer)
        if have > int(target * REFILL_AT):
            return 0
        free = self.concurrency - len(self._in_flight)
        if self.prefetch == 0:
            return min(max(free - have, 0), self.batch_size)
        return min(target - have, self.batch_size)

    async def _claim_loop(self) -> None:
        idle = Backoff(0.05, self.poll_interval)
        # Short and reset on success: the pool reconnects within 0.5 s of
        # the server accepting again (pool.py), so should the claims.
        failing = Backoff(0.05, min(self.poll_interval, 0.5))
        measured_at, measured = time.monotonic(), 0
        fence: list[int] | None = None  # the idle advert's fence, while not yet empty
        claim_now = True  # at start, after every wait: claim even if the last claim came back short
        while self._life.state is WorkerState.RUNNING:
            self._expire_head()
            if self._unstarted:
                await self._release_unstarted()
            wanted = self._wanted()
            timeout = self.poll_interval
            polling = False  # this round's claim came back short while jobs keep arriving: wait out busy_poll
            if wanted > 0 and (claim_now or not self._drained or not self._buffer):
                claim_now = False
                # Cleared before the claim: a NOTIFY arriving from here on is not lost.
                self._wake.clear()
                now = time.monotonic()
                if now - measured_at >= 0.01:  # the start rate, over at least 10 ms
                    rate = (self.counts.claimed - measured) / (now - measured_at)
                    self._rate = rate if self._rate == 0 else (self._rate + rate) / 2
                    measured_at, measured = now, self.counts.claimed
                try:
                    try:
                        handles, quiet = await self._exchange(wanted)
                    finally:
                        self._asked = False  # the refill is in: a runner may ask for the next
                    if handles and len(handles) == len(self._buffer):
                        # The buffer was empty, so runners wait for these: let
                        # them start before this loop sends its next statement
                        # (an idle worker's wake-up: the advert comes after).
                        await AsyncRuntime.yield_now()
                    self._low = int(self._target() * REFILL_AT)
                    if len(handles) == wanted:
                        self._drained = False
                        idle.reset()
                        failing.reset()
                        fence = None
                        if self._advertised:
                            await self._retire()
                        continue  # maybe more are due
                    self._drained = True
                    if self._advertised and self._listener is not None \
                            and self._listener.notified != self._advertised_at:
                        # Notified since the advert: the enqueue that notified
                        # consumed it. Advertise again before waiting again,
                        # unless it was consumed within busy_poll.
                        self._advertised = False
                        quick = time.monotonic() - self._advertised_since < self.busy_poll
                        self._busy = BUSY_QUIET if quick else 0
                    elif self._busy:
                        self._busy = BUSY_QUIET if handles else self._busy - 1
                    if not self._busy and not self._advertised \
                            and self._listener is not None and self._listener.listening:
                        fence = await self._advertise()
                        claim_now = True  # the protocol: claim once more behind the advert
                        continue
                    delay = None if self._busy else await self._seconds_until_claimable()
                except TRANSIENT_ERRORS as error:
                    await self._pause_for(error, failing)
                    claim_now = True
                    continue
                failing.reset()
                if self._busy:
                    # Jobs keep arriving: claim again after busy_poll, with no
                    # advert, so their enqueues take no notify lock.
                    timeout = self.busy_poll
                    polling = True
                elif delay is not None and delay <= 0:
                    # Claimable now, yet the claim came back short: rows held
                    # by a concurrent claim or settle. Back off a little, not a lot.
                    timeout = 0.0 if handles else idle.next()
                else:
                    idle.reset()
                    # Over only when nothing was held, running or settling
                    # when this claim was sent (what it carried committed with
                    # it): then both the claim and next_claim_at saw every
                    # outcome this worker issued. A look at the settler after
                    # next_claim_at could miss a retry committed in between.
                    if self.burst and quiet and not handles:
                        logger.info("burst: nothing left to claim", extra=self._fields())
                        return
                    timeout = self.poll_interval if delay is None else min(delay, self.poll_interval)
            else:
                # No claim this round: clear, then look again, so a runner's
                # wake-up from here on is not lost (and a set event never spins).
                self._asked = False
                self._wake.clear()
                self._expire_head()
                if self._unstarted or (self._wanted() > 0 and (not self._drained or not self._buffer)):
                    continue
            timeout = min(timeout, self._until_head_expires())
            if polling:
                # The whole interval: a runner asking for more as the buffer
                # empties would make it a claim per job again. No fence to
                # watch: the poll claims whatever committed without an advert.
                # Only after a short claim: a round that claimed nothing (the
                # buffer was full enough) waits for the runners' refill below,
                # or the jobs behind them would wait for poll_interval.
                fence = None
                await self._stopped.wait(timeout)
            elif fence:
                fence = await self._wait_behind_fence(fence, timeout)
            else:
                await self._wake.wait(timeout)
            claim_now = True

    def _quiet(self) -> bool:
        """Whether no job is buffered, in a runner's hands, waiting for release
        or settling. Read in the order jobs move (buffer, runners, settler), so
        a job moving on while it is read is seen in its next place."""
        return (not self._buffer and not any(self._holding) and not self._unstarted
                and not len(self._settler))

    async def _exchange(self, wanted: int) -> tuple[list[AsyncJobHandle], bool]:
        """Claim up to ``wanted`` into the buffer, settling what is pending in
        the same round trip when the runners wait for this claim; the
        handles, and whether the worker was quiet (:meth:`_quiet`) when the
        call was sent, besides what it carried."""
        # A refill of a buffer that still feeds the runners leaves the
        # outcomes to the batcher's own flush: on a second connection it runs
        # beside the claim instead of lengthening it, and a longer refill let
        # the buffer run dry (carried: 18 ms for 500 jobs; not carried, async
        # c=1 ran +10.6% median over 10 interleaved pairs, docs/worker.md).
        outcomes = self._settler.take() if not self._buffer else []
        quiet = self._quiet()
        sent = time.monotonic()
        try:
            if outcomes:
                states, handles = await self.queue.settle_and_claim(
                    self.worker_id, wanted, [(o.handle.job, o.kind, o.error) for o in outcomes])
            else:
                # Nothing to carry (an idle worker's wake-up): the plain claim
                # is the same rule, without the settle branch's cost.
                states, handles = [], await self.queue.claim_batch(self.worker_id, wanted)
        except BaseException:
            self._settler.give_back(outcomes)
            raise
        seconds = time.monotonic() - sent  # one call: the claim's and the carried settle's duration
        if self._observer is not None:
            self._observer.on_claimed(len(handles), seconds)
        if outcomes:
            self._settled(outcomes, states, seconds)
        if handles:
            buffer = self._buffer
            lifetime = self.buffer_lifetime
            for handle in handles:
                window = _lease_margin(handle.job.visibility_timeout_s)
                self._window = window
                buffer.append((handle, sent, sent + min(lifetime, window)))
            self._filled.set()
        return handles, quiet

    async def _advertise(self) -> list[int]:
        """Idle: advertise (enqueues notify from its commit on) and take the
        fence of the transactions that may have missed the advert."""
        assert self._listener is not None
        self._advertised_at = self._listener.notified  # a notification from here on may consume it
        self._advertised_since = time.monotonic()
        await self.queue.wait_for_jobs(self.worker_id)
        self._advertised = True
        return await self.queue.wake_fence()

    async def _retire(self) -> None:
        """Busy again: enqueues need not notify this worker any more."""
        self._advertised = False
        await self.queue.stop_waiting(self.worker_id)

    async def _wait_behind_fence(self, fence: list[int], timeout: float) -> list[int] | None:
        """Wait for a NOTIFY while polling the fence on a short, growing
        timer; return (to claim again) once it shrinks, or on a wake-up."""
        deadline = time.monotonic() + timeout
        pause = FENCE_POLL[0]
        while self._life.state is WorkerState.RUNNING:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or await self._wake.wait(min(pause, remaining)):
                return fence
            left = await self.queue.wake_fence(fence)
            if len(left) < len(fence):
                return left or None
            pause = min(pause * 2, FENCE_POLL[1])
        return fence

    def _until_head_expires(self) -> float:
        try:
            head = self._buffer[0]
        except IndexError:
            return math.inf
        return max(head[2] - time.monotonic(), 0.0)

    def _expire_head(self) -> None:
        """Move the buffered jobs past their start-by time to the release list."""
        now = time.monotonic()
        buffer = self._buffer
        while buffer and buffer[0][2] < now:
            try:
                handle, _, _ = buffer.popleft()
            except IndexError:
                break
            self._unstarted.append(handle.job)

    async def _release_unstarted(self) -> None:
        """Give back the jobs that never started: pending at once, attempt refunded."""
        jobs, self._unstarted = self._unstarted, []
        if self._observer is not None:  # held no more: released, or left to their leases
            self._observer.on_released(len(jobs))
        try:
            released = await self.queue.release_jobs(self.worker_id, jobs)
        except TRANSIENT_ERRORS as error:
            logger.warning("could not release %d unstarted jobs (%s); they run again after their lease",
                           len(jobs), one_line(error), extra=self._fields())
            return
        self._count(released=released)
        logger.debug("released %d unstarted jobs", released, extra=self._fields(released=released))

    async def _pause_for(self, error: BaseException, backoff: Backoff) -> None:
        pause = backoff.next()
        logger.warning("database unavailable (%s); trying again in %.1fs", one_line(error), pause,
                       extra=self._fields())
        self._advertised = False  # an advert dies with its connection's session
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

    # the runners -------------------------------------------------------------

    async def _runner(self, index: int) -> None:
        """One of ``concurrency``: start buffered jobs one after the other
        until the worker stops claiming."""
        buffer = self._buffer
        holding = self._holding
        started = 0
        while self._life.state is WorkerState.RUNNING:
            holding[index] = 1
            try:
                handle, claimed, start_by = buffer.popleft()
            except IndexError:
                holding[index] = 0
                self._filled.clear()
                if not buffer:
                    self._wake.set()
                    await self._filled.wait(self.poll_interval)
                continue
            if len(buffer) <= self._low and not self._asked and (not self._drained or not buffer):
                # Down to half: time to claim more. Asked once per look of the
                # claim loop (a set per job kept the event set, and the yield
                # below made a loop iteration per job while a claim was out).
                self._asked = True
                self._wake.set()
            now = time.monotonic()
            if now > start_by or self._life.state is not WorkerState.RUNNING:
                # Its lease might lapse before a heartbeat: give it back unstarted.
                self._unstarted.append(handle.job)
                holding[index] = 0
                self._wake.set()
                continue
            try:
                await self._process(handle, claimed, now)
            finally:
                holding[index] = 0
            started += 1
            # Let the claim loop, the settler and the other runners in every
            # few jobs (a yield per job is a loop iteration per job, most of a
            # no-op job's cost), and after every job while a wake-up waits for
            # the claim loop to take it (it takes a few loop iterations).
            if started % YIELD_EVERY == 0 or self._wake.is_set():
                await AsyncRuntime.yield_now()

    async def _process(self, handle: AsyncJobHandle, claimed: float, now: float) -> None:
        job = handle.job
        interval = _lease_margin(job.visibility_timeout_s)
        running = Running(handle, started=now, interval=interval,
                          next_beat=claimed + interval if self.heartbeat else math.inf)
        self._in_flight.add(running)
        with self._counts_lock:
            self.counts.claimed += 1
        if running.next_beat < now + self.poll_interval:
            self._heartbeater.poke()
        debug = self._debug
        if debug:
            logger.debug("job %d started (attempt %d)", job.id, job.attempts, extra=self._fields(job))
        try:
            error: Exception | None = None
            try:
                await self.handler(handle)
            except Exception as caught:
                error = caught
            duration = time.monotonic() - now
            observer = self._observer
            if observer is not None:
                observer.on_handler(duration)
            if self._life.state in ABANDONED:
                return  # past the grace period: the job is left to lease expiry
            if error is None:
                if debug:
                    logger.debug("job %d done in %.3fs", job.id, duration,
                                 extra=self._fields(job, duration_s=duration))
                self._settler.add(Outcome(handle, "ack", None, None, duration))
            else:
                failed = isinstance(error, self.fail_on)
                self._settler.add(Outcome(handle, "fail" if failed else "retry", error_text(error), error, duration))
        finally:
            self._in_flight.remove(running)
            if self.burst and not self._buffer:
                self._wake.set()  # maybe the last: the claim loop looks whether the burst is over

    # settlement ----------------------------------------------------------------

    async def _settle_batch(self, batch: list[Outcome]) -> Sequence[Settled]:
        """Settle one batch of outcomes (the flush loop's call): the state each led to."""
        return await self.queue.settle(self.worker_id, [(o.handle.job, o.kind, o.error) for o in batch])

    def _settled(self, batch: Sequence[Outcome], states: Sequence[Settled], seconds: float) -> None:
        """Count, log and observe what the SQL says each outcome led to
        (``seconds``: the settle call's)."""
        acked = retried = failed = lost = 0
        for outcome, state in zip(batch, states, strict=True):
            if state == "acked":
                acked += 1
                continue
            job = outcome.handle.job
            fields = self._fields(job, duration_s=outcome.duration, error=outcome.error)
            if state is None:
                lost += 1
                logger.warning("job %d %s but its claim was no longer valid (lease lapsed)", job.id,
                               "finished" if outcome.kind == "ack" else f"failed ({outcome.error})", extra=fields)
            elif state == "dead":
                failed += 1
                logger.error("job %d failed for good: %s", job.id, outcome.error, exc_info=outcome.exception,
                             extra=fields)
            else:
                retried += 1
                logger.warning("job %d failed (attempt %d of %d), will retry: %s", job.id, job.attempts,
                               job.max_attempts, outcome.error, exc_info=outcome.exception, extra=fields)
        self._count(acked=acked, retried=retried, failed=failed, lost=lost)
        observer = self._observer
        if observer is not None:
            for label, n in (("acked", acked), ("retried", retried), ("failed", failed), ("lost", lost)):
                if n:
                    observer.on_settled(label, n, seconds)
        if retried or (self.burst and not self._buffer):
            self._wake.set()  # it may be due again soon (a short backoff); a burst may be over

    def _given_up(self, batch: Sequence[Outcome]) -> None:
        """Outcomes the settler could not record: the jobs run again after their lease."""
        if self._observer is not None:
            self._observer.on_released(len(batch))

    # stop ----------------------------------------------------------------------

    async def _release_buffer(self) -> None:
        while self._buffer:
            try:
                handle, _, _ = self._buffer.popleft()
            except IndexError:
                break
            self._unstarted.append(handle.job)
        if self._unstarted:
            await self._release_unstarted()

    async def _shutdown(self, tasks: dict[str, AsyncTask], grace: float) -> None:
        self.stop(force=grace <= 0)
        # What never started goes back at once, for other workers to take.
        await self._release_buffer()
        if self._advertised:
            with contextlib.suppress(*TRANSIENT_ERRORS):  # the advert dies with its session
                await self._retire()
        self._in_flight.watched = True
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
            if self._observer is not None:
                self._observer.on_released(waiting)
            logger.warning("grace period over: %d running jobs are left to lease expiry", waiting,
                           extra=self._fields())
            self._pool.cancel_all()
        await self._pool.close(1.0)
        await self._release_buffer()  # a runner may have put one back meanwhile
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
            "worker stopped: %d acked, %d retried, %d failed, %d lost, %d left to lease expiry, %d released unstarted",
            self.counts.acked, self.counts.retried, self.counts.failed, self.counts.lost, self.counts.abandoned,
            self.counts.released,
            extra=self._fields(acked=self.counts.acked, retried=self.counts.retried, failed=self.counts.failed,
                               lost=self.counts.lost, abandoned=self.counts.abandoned, released=self.counts.released),
        )


@functools.cache  # a handful of distinct visibility timeouts, asked per job
def _lease_margin(visibility_timeout_s: int) -> float:
    """Seconds after a claim was sent within which its lease surely holds
    with half to spare: the lease runs visibility_timeout_s from a
    whole-second clock (so at least that less one second); half of that."""
    return max(visibility_timeout_s / 2 - 0.5, visibility_timeout_s / 4, 0.05)
