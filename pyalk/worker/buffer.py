"""The prefetch buffer: jobs claimed ahead of the runners, not yet started.
Plain code, shared by both workers (the claim that fills it and the release
that empties it are the claim loop's, pyalk/_async/worker/claim.py).

A buffered job moves one way::

    claimed --fill()--> buffered --popped by a runner--> started
                           |
                           +--past its start-by time (expire_head), or at a
                              stop (release_all)--> unstarted --> released

``start-by`` is the claim's send time plus the lease margin (or
``lifetime``): a job starts only while its lease surely holds. The buffer
itself is in one of two refill states, with one flag beside them:

    state     entered when                     a refill is due when
    --------  -------------------------------  ------------------------------
    flowing   a claim came back full           it is down to ``low`` (REFILL_AT
                                               of the target)
    drained   a claim came back short          it is empty (or on a wake-up:
                                               NOTIFY, poll, retry)

    asked     a runner asked for the due refill: no runner asks again until
              the claim loop has looked (after its claim, or finding none due).
"""

from __future__ import annotations

import functools
import math
import time
from collections import deque
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    from pyalk.values import Job

#: Default most jobs claimed ahead. Each claim is a durable commit (a WAL
#: flush) plus a fixed cost per call, so a buffer refilled in claims of 500
#: rather than 250 is 13-25% faster end to end (issue 11, measured).
PREFETCH = 1000
#: A refill is claimed once the buffer is down to this fraction of its target.
REFILL_AT = 0.5


class _Handle(Protocol):
    @property
    def job(self) -> Job: ...


H = TypeVar("H", bound=_Handle)


@functools.cache  # a handful of distinct visibility timeouts, asked per job
def lease_margin(visibility_timeout_s: int) -> float:
    """Seconds after a claim was sent within which its lease surely holds
    with half to spare: the lease runs visibility_timeout_s from a
    whole-second clock (so at least that less one second); half of that."""
    return max(visibility_timeout_s / 2 - 0.5, visibility_timeout_s / 4, 0.05)


class PrefetchBuffer(Generic[H]):
    """Claimed jobs waiting for a runner, sized by the rate they start at.

    ``jobs`` holds (handle, monotonic claim send time, start-by), oldest
    first; runners pop from its left. ``unstarted`` holds the jobs to
    release. ``drained``, ``low`` and ``asked`` are the refill state above.
    """

    def __init__(self, *, prefetch: int, concurrency: int, batch_size: int, lifetime: float) -> None:
        self.prefetch = prefetch
        self.concurrency = concurrency
        self.batch_size = batch_size
        self.lifetime = lifetime
        self.jobs: deque[tuple[H, float, float]] = deque()
        self.unstarted: list[Job] = []  # to release: waited too long, or popped at a stop
        self.rate = 0.0  # jobs started per second (moving average): sizes the claims
        self.window = math.inf  # seconds a claimed job may wait to start (the last claim's leases)
        self.drained = False  # the last claim came back short: refill on a wake-up, not at half a buffer
        self.low = 0  # a runner asks for a refill once the buffer is down to this many (half the target)
        self.asked = False  # a refill is asked for or under way: the runners need not ask again
        self._measured_at = 0.0
        self._measured = 0

    def __len__(self) -> int:
        return len(self.jobs)

    def target(self) -> int:
        """How many jobs to hold claimed ahead: what the runners start at the
        measured rate in half a buffer lifetime or within the leases' start
        window, whichever is shorter (more would be claimed only to be
        released), at least one per runner, at most ``prefetch`` beyond them."""
        horizon = min(self.lifetime, 150.0) / 2
        ahead = math.ceil(self.rate * min(horizon, self.window))
        return max(self.concurrency, min(ahead, self.prefetch))

    def wanted(self, running: int) -> int:
        """How many to claim now (``running`` handlers busy): a refill once
        the buffer is down to REFILL_AT of its target."""
        target = self.target()
        have = len(self.jobs)
        if have > int(target * REFILL_AT):
            return 0
        free = self.concurrency - running
        if self.prefetch == 0:
            return min(max(free - have, 0), self.batch_size)
        return min(target - have, self.batch_size)

    def due(self, woken: bool) -> bool:
        """Whether a wanted refill is claimed now: always when flowing or
        empty; when drained, only on a wake-up (``woken``)."""
        return woken or not self.drained or not self.jobs

    def start_measuring(self, now: float, started: int) -> None:
        self._measured_at, self._measured = now, started

    def measure(self, now: float, started: int) -> None:
        """Update the start rate from ``started`` (jobs started so far), over at least 10 ms."""
        if now - self._measured_at >= 0.01:
            rate = (started - self._measured) / (now - self._measured_at)
            self.rate = rate if self.rate == 0 else (self.rate + rate) / 2
            self._measured_at, self._measured = now, started

    def fill(self, handles: list[H], sent: float) -> None:
        """Buffer a claim's jobs (``sent``: when the claim was sent)."""
        jobs = self.jobs
        lifetime = self.lifetime
        for handle in handles:
            window = lease_margin(handle.job.visibility_timeout_s)
            self.window = window
            jobs.append((handle, sent, sent + min(lifetime, window)))

    def refilled(self, got: int, wanted: int) -> None:
        """A claim came back with ``got`` of ``wanted``: flowing or drained."""
        self.low = int(self.target() * REFILL_AT)
        self.drained = got != wanted

    def until_head_expires(self) -> float:
        try:
            head = self.jobs[0]
        except IndexError:
            return math.inf
        return max(head[2] - time.monotonic(), 0.0)

    def expire_head(self) -> None:
        """Move the buffered jobs past their start-by time to the release list."""
        now = time.monotonic()
        jobs = self.jobs
        while jobs and jobs[0][2] < now:
            try:
                handle, _, _ = jobs.popleft()
            except IndexError:
                break
            self.unstarted.append(handle.job)

    def release_all(self) -> None:
        """A stop: every buffered job goes to the release list."""
        jobs = self.jobs
        while jobs:
            try:
                handle, _, _ = jobs.popleft()
            except IndexError:
                break
            self.unstarted.append(handle.job)

    def take_unstarted(self) -> list[Job]:
        """The jobs to release now (the list starts over)."""
        jobs, self.unstarted = self.unstarted, []
        return jobs
