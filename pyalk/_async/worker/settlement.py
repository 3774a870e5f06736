"""The worker's settlement batcher: every finished job's outcome (ack, retry,
fail) is collected and settled in batches, flushed when ``batch_max`` are
pending or ``interval`` seconds after the first of them, a flush taking
everything that finished while the previous one was in flight. A claim takes
what is pending (:meth:`AsyncSettlementBatcher.take`) and carries it with it
in the same call (alk.settle_and_claim); on failure it gives it back.

The SQL decides what each outcome leads to (a retry with its attempts spent
is dead) and says so: ``settle`` returns one state per outcome, which is all
the worker counts and logs.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pyalk._async.job import AsyncJobHandle
from pyalk.backoff import Backoff
from pyalk.errors import TRANSIENT_ERRORS
from pyalk.runtime import AsyncEvent, AsyncRuntime
from pyalk.worker.errors import one_line

#: Most outcomes one settlement call carries.
BATCH_MAX = 1000


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs a setattr call per field
class Outcome:
    """How one claimed job ended, to be recorded with its claim's fencing token."""

    handle: AsyncJobHandle
    kind: Literal["ack", "retry", "fail"] = "ack"
    error: str | None = None  # the error text of a retry or fail
    exception: BaseException | None = None  # what the handler raised (for the log)
    duration: float = 0.0  # the handler's seconds
    result: str | None = None  # an ack's result: the handler's return value as JSON text


#: What settling an outcome led to, as the SQL reports it: 'acked',
#: 'pending' (retried), 'dead', or None (the claim was no longer valid).
Settled = str | None


class AsyncSettlementBatcher:
    """Collects outcomes (:meth:`add`) and settles them in batches of at most
    ``batch_max`` with ``settle`` (which returns one :data:`Settled` per
    outcome). ``on_settled(batch, states, seconds)`` is told the result of
    every batch it sent, with the settle call's duration (the worker calls it
    too for what its claims carried); ``on_given_up(batch)`` of a batch that
    could not be recorded. A transient database error is retried with
    backoff; after :meth:`close`, only until its deadline (a flush stuck
    past it is the caller's to :meth:`abandon`).
    """

    def __init__(
        self,
        settle: Callable[[list[Outcome]], Awaitable[Sequence[Settled]]],
        on_settled: Callable[[Sequence[Outcome], Sequence[Settled], float], None],
        *,
        logger: logging.Logger,
        extra: dict[str, Any],
        batch_max: int = BATCH_MAX,
        interval: float = 0.0,
        on_given_up: Callable[[Sequence[Outcome]], None] | None = None,
    ) -> None:
        self._settle = settle
        self.on_settled = on_settled
        self.on_given_up = on_given_up
        self._logger = logger
        self._extra = extra
        self._batch_max = batch_max
        self._interval = interval
        self._lock = threading.Lock()
        self._pending: list[Outcome] = []
        self._first_at = 0.0  # time.monotonic() of the oldest pending outcome
        self._ready = AsyncEvent()  # outcomes to flush, or closed
        self._deadline: float | None = None  # set by close()
        self._closing = AsyncEvent()  # close() was called: a retry's pause ends
        self._abandoned = False  # set by abandon(): nothing more is reported
        self._sending = 0  # outcomes in the flush under way

    def __len__(self) -> int:
        """Outcomes not yet settled: pending, or in a flush under way."""
        return len(self._pending) + self._sending

    def waiting(self) -> int:
        """Outcomes no flush has taken yet: a claim may still carry them."""
        return len(self._pending)

    def add(self, outcome: Outcome) -> None:
        """Queue one outcome for the next flush (safe from any thread)."""
        with self._lock:
            if not self._pending:
                self._first_at = time.monotonic()
            self._pending.append(outcome)
            wake = len(self._pending) == 1 or len(self._pending) >= self._batch_max
        if wake:
            self._ready.set()

    def take(self, limit: int | None = None, *, sending: bool = False) -> list[Outcome]:
        """Remove and return up to ``limit`` (default: a batch) pending outcomes,
        oldest first (``sending``: the flush loop's, counted until settled)."""
        limit = self._batch_max if limit is None else limit
        with self._lock:
            if sending:
                self._sending = min(len(self._pending), limit)
            if len(self._pending) <= limit:
                batch, self._pending = self._pending, []
            else:
                batch = self._pending[:limit]
                del self._pending[:limit]
        return batch

    def give_back(self, batch: list[Outcome]) -> None:
        """Put back outcomes a failed call took (ahead of newer ones)."""
        if batch:
            with self._lock:
                self._pending[:0] = batch
                self._first_at = 0.0
            self._ready.set()

    def close(self, deadline: float) -> None:
        """Flush what is pending, then end :meth:`run`; a database that stays
        away is retried until ``deadline`` (time.monotonic()), then the rest
        runs again after its lease."""
        self._deadline = deadline
        self._ready.set()
        self._closing.set()

    def abandon(self) -> int:
        """The caller stopped waiting for :meth:`run` (a flush stuck past the
        deadline): how many outcomes were never settled. They run again after
        their lease; a flush that still returns is not reported."""
        with self._lock:
            self._abandoned = True
            left = len(self._pending) + self._sending
            self._pending = []
        return left

    async def run(self) -> None:
        """The flush loop: until closed and empty."""
        await self._ready.wait(0)  # binds the event to this loop (a no-op for threads)
        backoff = Backoff(0.05, 2.0)
        while True:
            if not self._pending:
                if self._deadline is not None:
                    return
                self._ready.clear()
                if not self._pending and self._deadline is None:
                    await self._ready.wait(None)
                continue
            # Size or timer: wait out the rest of the interval unless a batch is full or we are closing.
            wait = self._first_at + self._interval - time.monotonic()
            if wait > 0 and len(self._pending) < self._batch_max and self._deadline is None:
                self._ready.clear()
                await self._ready.wait(wait)
                continue
            batch = self.take(sending=True)
            if not batch:
                continue
            try:
                settled = await self._flush(batch, backoff)
                if self._abandoned:
                    return
                if settled is not None:
                    backoff.reset()
                    self.on_settled(batch, *settled)
                elif self.on_given_up is not None:
                    self.on_given_up(batch)
            finally:
                self._sending = 0

    async def _flush(self, batch: list[Outcome], backoff: Backoff) -> tuple[Sequence[Settled], float] | None:
        """Settle one batch; the states and the successful call's seconds,
        None when it was given up."""
        while True:
            sent = time.monotonic()
            try:
                states = await self._settle(batch)
                return states, time.monotonic() - sent
            except TRANSIENT_ERRORS as error:
                left = (math.inf if self._deadline is None else self._deadline) - time.monotonic()
                if left <= 0 or self._abandoned:
                    self._logger.error("could not settle %d finished jobs (%s); they run again after their lease",
                                       len(batch), one_line(error), extra=self._extra)
                    return None
                pause = backoff.next()
                self._logger.warning("settling failed (%s); trying again in %.1fs", one_line(error), pause,
                                     extra=self._extra)
                if self._deadline is None:
                    await self._closing.wait(pause)  # a stop ends the pause: its last tries start at once
                else:
                    await AsyncRuntime.sleep(min(pause, left))
            except Exception:
                self._logger.exception("settling failed; %d jobs run again after their lease", len(batch),
                                       extra=self._extra)
                return None
