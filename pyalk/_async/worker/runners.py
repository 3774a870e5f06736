"""The worker's runners (River's executor): ``concurrency`` loops that each
start buffered jobs one after the other, run the handler and hand the
outcome to the settlement batcher, with no hand-off per job."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pyalk import _codec, tracing
from pyalk._async.job import AsyncJobHandle
from pyalk._async.worker.heartbeat import AsyncHeartbeater, Running
from pyalk._async.worker.settlement import AsyncSettlementBatcher, Outcome
from pyalk.errors import CodecError
from pyalk.runtime import AsyncEvent, AsyncRuntime
from pyalk.values import Job
from pyalk.worker.buffer import PrefetchBuffer, lease_margin
from pyalk.worker.errors import Snooze, error_text, one_line
from pyalk.worker.in_flight import InFlight
from pyalk.worker.state import ABANDONED, Lifecycle, WorkerState
from pyalk.worker.tally import Tally

logger = logging.getLogger("pyalk.worker")

#: A job handler: called with the claimed job; returning means success.
Handler = Callable[[AsyncJobHandle], Awaitable[Any]]

#: Jobs a runner starts back to back before it lets the other loops in.
YIELD_EVERY = 16


class AsyncRunners:
    """The runner loops (:meth:`run`, one per index) and the job each runs.
    ``holding[i]`` is 1 from just before runner i pops a job until the job's
    outcome (or release) is handed on, so no job is ever out of the claim
    loop's sight between the buffer and the settler (threads)."""

    def __init__(
        self,
        handler: Handler,
        *,
        concurrency: int,
        fail_on: tuple[type[BaseException], ...],
        buffer: PrefetchBuffer[AsyncJobHandle],
        in_flight: InFlight[Running],
        settler: AsyncSettlementBatcher,
        heartbeater: AsyncHeartbeater,
        heartbeat: bool,
        tally: Tally,
        life: Lifecycle,
        wake: AsyncEvent,
        filled: AsyncEvent,
        poll_interval: float,
        burst: bool,
    ) -> None:
        self.handler = handler
        self.fail_on = fail_on
        self.holding = [0] * concurrency
        self._buffer = buffer
        self._in_flight = in_flight
        self._settler = settler
        self._heartbeater = heartbeater
        self._heartbeat = heartbeat
        self._tally = tally
        self._life = life
        self._wake = wake
        self._filled = filled
        self._poll_interval = poll_interval
        self._burst = burst
        self.debug = False  # log each job (set at run: whether DEBUG is enabled)

    async def run(self, index: int) -> None:
        """Runner ``index``: start buffered jobs one after the other until
        the worker stops claiming."""
        buffer = self._buffer
        jobs = buffer.jobs
        holding = self.holding
        started = 0
        while self._life.state is WorkerState.RUNNING:
            holding[index] = 1
            try:
                handle, claimed, start_by = jobs.popleft()
            except IndexError:
                holding[index] = 0
                self._filled.clear()
                if not jobs:
                    self._wake.set()
                    await self._filled.wait(self._poll_interval)
                continue
            if len(jobs) <= buffer.low and not buffer.asked and (not buffer.drained or not jobs):
                # Down to half: time to claim more. Asked once per look of the
                # claim loop (a set per job kept the event set, and the yield
                # below made a loop iteration per job while a claim was out).
                buffer.asked = True
                self._wake.set()
            now = time.monotonic()
            if now > start_by or self._life.state is not WorkerState.RUNNING:
                # Its lease might lapse before a heartbeat: give it back unstarted.
                buffer.unstarted.append(handle.job)
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
        interval = lease_margin(job.visibility_timeout_s)
        running = Running(handle, started=now, interval=interval,
                          next_beat=claimed + interval if self._heartbeat else math.inf)
        self._in_flight.add(running)
        tally = self._tally
        with tally.lock:
            tally.counts.claimed += 1
        if running.next_beat < now + self._poll_interval:
            self._heartbeater.poke()
        debug = self.debug
        if debug:
            logger.debug("job %d started (attempt %d)", job.id, job.attempts, extra=tally.fields(job))
        try:
            error: Exception | None = None
            returned: Any = None
            running.task = task = AsyncRuntime.current()
            span = tracing.process(job)  # None unless tracing is on (docs/tracing.md)
            try:
                returned = await self.handler(handle)
            except Exception as caught:
                error = caught
            except AsyncRuntime.CANCELLED:
                if not running.interrupted:
                    raise  # not a cancelled job's: a stop past its grace period
            finally:
                running.task = None
                if running.interrupted:
                    AsyncRuntime.resume(task)  # the runner goes on to its next job
                if span is not None:
                    span.end(None if isinstance(error, Snooze) else error)  # a snooze is no failure
            duration = time.monotonic() - now
            observer = tally.observer
            if observer is not None:
                observer.on_handler(duration)
            if self._life.state in ABANDONED:
                return  # past the grace period: the job is left to lease expiry
            if handle.cancelled:
                tally.cancelled(job, started=True)  # the row is gone: nothing to settle
                return
            if error is None:
                if debug:
                    logger.debug("job %d done in %.3fs", job.id, duration,
                                 extra=tally.fields(job, duration_s=duration))
                self._settler.add(Outcome(handle, "ack", None, None, duration,
                                          None if returned is None else self._result(job, returned)))
            elif isinstance(error, Snooze):
                running.next_beat = math.inf  # no heartbeat for a job being given back
                await self._snooze(handle, error.seconds)
            else:
                failed = isinstance(error, self.fail_on)
                self._settler.add(Outcome(handle, "fail" if failed else "retry", error_text(error), error, duration))
        finally:
            self._in_flight.remove(running)
            if self._burst and not self._buffer.jobs:
                self._wake.set()  # maybe the last: the claim loop looks whether the burst is over

    def _result(self, job: Job, returned: Any) -> str | None:
        """The handler's return value as the ack's result (JSON text), kept
        when the queue keeps completed jobs. One that JSON cannot hold is
        logged and the job acked without a result: it did run, and running it
        again would not make its return value storable."""
        try:
            return _codec.payload(returned, "result")
        except CodecError as error:
            logger.warning("job %d: the handler's return value is not stored as its result (%s); acked without one",
                           job.id, error, extra=self._tally.fields(job))
            return None

    def cancel(self, job_id: int) -> None:
        """alk.cancel took job ``job_id`` from this worker (``cancel <job_id>``
        on its control channel): a running handler is told (``job.cancelled``;
        an async handler's task is cancelled too), a buffered job is dropped.
        Called on the listener's loop (async) or thread (threads)."""
        for running in self._in_flight.jobs():
            if running.handle.id == job_id:
                running.handle.mark_cancelled()
                running.next_beat = math.inf  # no heartbeat for a row that is gone
                task = running.task
                if task is not None and not running.interrupted:
                    running.interrupted = True
                    AsyncRuntime.interrupt(task)
                return
        jobs = self._buffer.jobs
        for entry in list(jobs):
            if entry[0].id == job_id:
                try:
                    jobs.remove(entry)
                except ValueError:  # a runner thread took it meanwhile: it runs to a refused outcome
                    return
                self._tally.cancelled(entry[0].job, started=False)
                return

    async def _snooze(self, handle: AsyncJobHandle, delay: int) -> None:
        """A handler's :class:`~pyalk.Snooze`: ``alk.snooze`` at once, one round
        trip of its own (snoozes are rare; the batched ``alk.settle`` stays ack,
        retry and fail), then a claim look: the job may be due again now."""
        tally = self._tally
        sent = time.monotonic()
        try:
            held = await handle.snooze(delay)
        except Exception as error:  # the database: the claim stands until its lease lapses
            logger.warning("job %d could not be snoozed (%s); it runs again after its lease", handle.job.id,
                           one_line(error), extra=tally.fields(handle.job))
            tally.released(1)
            return
        tally.snoozed(handle.job, held, delay, time.monotonic() - sent)
        self._wake.set()
