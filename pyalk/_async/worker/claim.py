"""The worker's claim loop (River's producer): keeps the prefetch buffer
(pyalk/worker/buffer.py) filled, one claim at a time, carrying pending
outcomes with a claim when the runners wait for it (``alk.settle_and_claim``),
releasing what waited too long (``alk.release_jobs``), and between claims
waiting as the idle/wake handshake (advert.py) says.
"""

from __future__ import annotations

import enum
import logging
import math
import time
from collections.abc import Callable, Sequence, Sized

from pyalk._async.job import AsyncJobHandle
from pyalk._async.queue import AsyncQueue
from pyalk._async.worker.advert import AsyncIdleAdvert
from pyalk._async.worker.settlement import AsyncSettlementBatcher, Outcome, Settled
from pyalk.backoff import Backoff
from pyalk.errors import TRANSIENT_ERRORS
from pyalk.runtime import AsyncEvent, AsyncRuntime
from pyalk.values import Job
from pyalk.worker.buffer import PrefetchBuffer
from pyalk.worker.errors import one_line
from pyalk.worker.state import Lifecycle, WorkerState
from pyalk.worker.tally import Tally

logger = logging.getLogger("pyalk.worker")


class _Then(enum.Enum):
    """What the loop does after a claim round, when it does not wait."""

    LOOK = "look"  # look again at once (the claim was full: maybe more are due)
    CLAIM = "claim"  # claim again at once, even if the buffer is drained
    DONE = "done"  # a burst found nothing left


class AsyncClaimLoop:
    """Claims into ``buffer`` while the worker runs (:meth:`run`)."""

    def __init__(
        self,
        queue: AsyncQueue,
        worker_id: str,
        *,
        buffer: PrefetchBuffer[AsyncJobHandle],
        holding: list[int],
        in_flight: Sized,
        settler: AsyncSettlementBatcher,
        on_settled: Callable[[Sequence[Outcome], Sequence[Settled], float], None],
        advert: AsyncIdleAdvert,
        tally: Tally,
        life: Lifecycle,
        wake: AsyncEvent,
        filled: AsyncEvent,
        stopped: AsyncEvent,
        poll_interval: float,
        burst: bool,
    ) -> None:
        self.queue = queue
        self.worker_id = worker_id
        self._buffer = buffer
        self._holding = holding
        self._in_flight = in_flight
        self._settler = settler
        self._on_settled = on_settled
        self._advert = advert
        self._tally = tally
        self._life = life
        self._wake = wake
        self._filled = filled
        self._stopped = stopped
        self._poll_interval = poll_interval
        self._burst = burst
        self._idle = Backoff(0.05, poll_interval)
        # Short and reset on success: the pool reconnects within 0.5 s of
        # the server accepting again (pool.py), so should the claims.
        self._failing = Backoff(0.05, min(poll_interval, 0.5))

    async def run(self) -> None:
        buffer = self._buffer
        buffer.start_measuring(time.monotonic(), 0)
        claim_now = True  # at start, after every wait: claim even if the last claim came back short
        while self._life.state is WorkerState.RUNNING:
            buffer.expire_head()
            if buffer.unstarted:
                await self.release_unstarted()
            wanted = buffer.wanted(len(self._in_flight))
            if wanted > 0 and buffer.due(claim_now):
                claim_now = False
                then = await self._round(wanted)
                if then is _Then.DONE:
                    return
                if isinstance(then, _Then):
                    claim_now = then is _Then.CLAIM
                    continue
                timeout, polling = then
            else:
                # No claim this round: clear, then look again, so a runner's
                # wake-up from here on is not lost (and a set event never spins).
                buffer.asked = False
                self._wake.clear()
                buffer.expire_head()
                if buffer.unstarted or (buffer.wanted(len(self._in_flight)) > 0 and buffer.due(False)):
                    continue
                timeout, polling = self._poll_interval, False
            await self._advert.wait(min(timeout, buffer.until_head_expires()), polling=polling)
            claim_now = True

    async def _round(self, wanted: int) -> _Then | tuple[float, bool]:
        """One claim of up to ``wanted`` and what follows it: what to do at
        once, or how long to wait (and whether that wait is a busy poll)."""
        buffer = self._buffer
        advert = self._advert
        # Cleared before the claim: a NOTIFY arriving from here on is not lost.
        self._wake.clear()
        buffer.measure(time.monotonic(), self._tally.counts.claimed)
        try:
            try:
                handles, quiet = await self._exchange(wanted)
            finally:
                buffer.asked = False  # the refill is in: a runner may ask for the next
            if handles and len(handles) == len(buffer.jobs):
                # The buffer was empty, so runners wait for these: let
                # them start before this loop sends its next statement
                # (an idle worker's wake-up: the advert comes after).
                await AsyncRuntime.yield_now()
            buffer.refilled(len(handles), wanted)
            if len(handles) == wanted:
                self._idle.reset()
                self._failing.reset()
                await advert.claimed_full()
                return _Then.LOOK  # maybe more are due
            if advert.claimed_short(len(handles)):
                await advert.advertise()
                return _Then.CLAIM  # the protocol: claim once more behind the advert
            delay = None if advert.busy or self._woken_by_runners() else await self._seconds_until_claimable()
        except TRANSIENT_ERRORS as error:
            await self._pause_for(error)
            return _Then.CLAIM
        self._failing.reset()
        if advert.busy:
            # Jobs keep arriving: claim again after busy_poll, with no
            # advert, so their enqueues take no notify lock.
            return advert.busy_poll, True
        if delay is not None and delay <= 0:
            # Claimable now, yet the claim came back short: rows held
            # by a concurrent claim or settle. Back off a little, not a lot.
            return (0.0 if handles else self._idle.next()), False
        self._idle.reset()
        # Over only when nothing was held, running or settling when this
        # claim was sent (what it carried committed with it): then both the
        # claim and next_claim_at saw every outcome this worker issued. A
        # look at the settler after next_claim_at could miss a retry
        # committed in between.
        if self._burst and quiet and not handles:
            logger.info("burst: nothing left to claim", extra=self._tally.fields())
            return _Then.DONE
        return (self._poll_interval if delay is None else min(delay, self._poll_interval)), False

    def _woken_by_runners(self) -> bool:
        """Whether a wake-up brings the next claim before a job could start
        here: one is already in (a runner found the buffer empty, or a
        NOTIFY); every runner holds a job or has one buffered for it (the
        runner that empties a drained buffer asks); or the buffer is empty
        and outcomes wait that no flush has taken (their runner asks, and
        the claim carries them). A short claim then needs no
        alk.next_claim_at first: under max_running every claim comes back
        short, and the next one, carrying the outcomes, frees the slots the
        last one lacked (a statement and a round trip saved per claim).
        Outcomes a flush has taken do not count: their runner asked before
        the flush, and no wake-up follows it."""
        holding = self._holding
        jobs = len(self._buffer.jobs)
        return (self._wake.is_set() or sum(holding) + jobs >= len(holding)
                or (not jobs and self._settler.waiting() > 0))

    def _quiet(self) -> bool:
        """Whether no job is buffered, in a runner's hands, waiting for release
        or settling. Read in the order jobs move (buffer, runners, settler), so
        a job moving on while it is read is seen in its next place."""
        buffer = self._buffer
        return (not buffer.jobs and not any(self._holding) and not buffer.unstarted
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
        outcomes = self._settler.take() if not self._buffer.jobs else []
        quiet = self._quiet()
        sent = time.monotonic()
        try:
            if outcomes:
                states, handles = await self.queue.settle_and_claim(
                    self.worker_id, wanted, [(o.handle.job, o.kind, o.error) for o in outcomes],
                    results=[o.result for o in outcomes])
            else:
                # Nothing to carry (an idle worker's wake-up): the plain claim
                # is the same rule, without the settle branch's cost.
                states, handles = [], await self.queue.claim_batch(self.worker_id, wanted)
        except BaseException:
            self._settler.give_back(outcomes)
            raise
        seconds = time.monotonic() - sent  # one call: the claim's and the carried settle's duration
        observer = self._tally.observer
        if observer is not None:
            observer.on_claimed(len(handles), seconds)
        if outcomes:
            self._on_settled(outcomes, states, seconds)
        if handles:
            self._buffer.fill(handles, sent)
            self._filled.set()
        return handles, quiet

    async def release_unstarted(self) -> None:
        """Give back the jobs that never started: pending at once, attempt refunded."""
        jobs = self._buffer.take_unstarted()
        self._tally.released(len(jobs))  # held no more: released, or left to their leases
        await self.release(jobs)

    async def release(self, jobs: list[Job]) -> None:
        """``alk.release_jobs`` on ``jobs`` (taken from the buffer, and counted, by the caller)."""
        fields = self._tally.fields
        try:
            released = await self.queue.release_jobs(self.worker_id, jobs)
        except TRANSIENT_ERRORS as error:
            logger.warning("could not release %d unstarted jobs (%s); they run again after their lease",
                           len(jobs), one_line(error), extra=fields())
            return
        self._tally.add(released=released)
        logger.debug("released %d unstarted jobs", released, extra=fields(released=released))

    async def _pause_for(self, error: BaseException) -> None:
        pause = self._failing.next()
        logger.warning("database unavailable (%s); trying again in %.1fs", one_line(error), pause,
                       extra=self._tally.fields())
        self._advert.lost()
        await self._stopped.wait(pause)

    async def _seconds_until_claimable(self) -> float | None:
        at, now, wall = await self.queue.next_claim_clock()
        if at is None:
            return None
        if math.floor(wall) == now:  # the clock is the wall clock: sleep to the sub-second
            return float(at) - wall
        return float(at - now)  # a pinned clock (tests, replays): whole seconds
