"""The idle/wake handshake of one worker (docs/worker.md, "Waking"): when a
claim comes back short the worker advertises itself idle
(``alk.wait_for_jobs``, after LISTEN) so enqueues notify it, takes the
advert's fence (``alk.wake_fence``: the transactions that may have missed
it), claims once more, and waits for NOTIFY while polling the fence; once
busy again it withdraws the advert (``alk.stop_waiting``). The enqueue that
notifies consumes the advert, so after any notification the worker
advertises again before it waits again; an advert consumed within
``busy_poll`` means jobs arrive faster than that, and the worker claims on
the ``busy_poll`` timer instead of advertising (no notify per enqueue)
until BUSY_QUIET such claims in a row find nothing.
"""

from __future__ import annotations

import time

from pyalk._async.listener import AsyncListener
from pyalk._async.queue import AsyncQueue
from pyalk.runtime import AsyncEvent
from pyalk.worker.state import Lifecycle, WorkerState

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


class AsyncIdleAdvert:
    """One worker's side of the handshake: whether it is advertised, the
    advert's fence while not yet empty, and the busy-poll countdown.
    ``wake`` is the claim loop's event (NOTIFY, retry, stop)."""

    def __init__(self, queue: AsyncQueue, worker_id: str, listener: AsyncListener | None, *, busy_poll: float,
                 wake: AsyncEvent, stopped: AsyncEvent, life: Lifecycle) -> None:
        self._queue = queue
        self._worker_id = worker_id
        self._listener = listener
        self.busy_poll = busy_poll
        self._wake = wake
        self._stopped = stopped
        self._life = life
        self.advertised = False  # idle advert in place (alk.wait_for_jobs)
        self._advertised_at = 0  # the listener's notification count when it was made
        self._advertised_since = 0.0  # monotonic time it was made
        self.busy = 0  # adverts consumed within busy_poll: empty polls left before advertising again
        self.fence: list[int] | None = None  # the advert's fence, while not yet empty

    async def advertise(self) -> None:
        """Idle: advertise (enqueues notify from its commit on) and take the
        fence of the transactions that may have missed the advert."""
        assert self._listener is not None
        self._advertised_at = self._listener.notified  # a notification from here on may consume it
        self._advertised_since = time.monotonic()
        await self._queue.wait_for_jobs(self._worker_id)
        self.advertised = True
        self.fence = await self._queue.wake_fence()

    async def retire(self) -> None:
        """Busy again: enqueues need not notify this worker any more."""
        self.advertised = False
        await self._queue.stop_waiting(self._worker_id)

    async def claimed_full(self) -> None:
        """A claim came back full: no fence to watch, and no advert needed."""
        self.fence = None
        if self.advertised:
            await self.retire()

    def claimed_short(self, got: int) -> bool:
        """A claim came back short (``got`` jobs): whether to advertise now
        (and claim once more behind the advert)."""
        listener = self._listener
        if self.advertised and listener is not None and listener.notified != self._advertised_at:
            # Notified since the advert: the enqueue that notified consumed
            # it. Advertise again before waiting again, unless it was
            # consumed within busy_poll.
            self.advertised = False
            quick = time.monotonic() - self._advertised_since < self.busy_poll
            self.busy = BUSY_QUIET if quick else 0
        elif self.busy:
            self.busy = BUSY_QUIET if got else self.busy - 1
        return not self.busy and not self.advertised and listener is not None and listener.listening

    def lost(self) -> None:
        """The connection was lost: an advert dies with its session."""
        self.advertised = False

    async def wait(self, timeout: float, *, polling: bool) -> None:
        """Wait before the next claim: the whole ``timeout`` when busy
        ``polling``; else for a wake-up, polling the fence while there is one."""
        if polling:
            # The whole interval: a runner asking for more as the buffer
            # empties would make it a claim per job again. No fence to
            # watch: the poll claims whatever committed without an advert.
            self.fence = None
            await self._stopped.wait(timeout)
        elif self.fence:
            self.fence = await self._wait_behind_fence(self.fence, timeout)
        else:
            await self._wake.wait(timeout)

    async def _wait_behind_fence(self, fence: list[int], timeout: float) -> list[int] | None:
        """Wait for a NOTIFY while polling the fence on a short, growing
        timer; return (to claim again) once it shrinks, or on a wake-up."""
        deadline = time.monotonic() + timeout
        pause = FENCE_POLL[0]
        while self._life.state is WorkerState.RUNNING:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or await self._wake.wait(min(pause, remaining)):
                return fence
            left = await self._queue.wake_fence(fence)
            if len(left) < len(fence):
                return left or None
            pause = min(pause * 2, FENCE_POLL[1])
        return fence
