"""The worker's settlement batcher: finished jobs' outcomes are collected and
settled in batches, a flush taking everything that finished while the
previous one was in flight.

Today only acks come through here (``alk.ack_batch``; a failed handler is
retried or failed at once, see the worker). An :class:`Outcome` already
carries its kind and error text so one batch can later hold acks, retries and
fails, and :meth:`AsyncSettlementBatcher.take` lets a claim carry the pending
outcomes with it instead of the flush loop.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from pyalk._async.queue import AsyncJobHandle
from pyalk.backoff import Backoff
from pyalk.worker_runtime import AsyncEvent, AsyncRuntime
from pyalk.worker_types import TRANSIENT_ERRORS, one_line

#: Most outcomes one settlement call carries.
BATCH_MAX = 1000


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one claimed job ended, to be recorded with its claim's fencing token."""

    handle: AsyncJobHandle
    kind: Literal["ack", "retry", "fail"] = "ack"
    error: str | None = None  # the error text of a retry or fail



class AsyncSettlementBatcher:
    """Collects outcomes (:meth:`add`) and settles them in batches of at most
    ``batch_max`` with ``settle`` (which returns how many the database
    accepted: the rest had lost their claim). ``on_settled(accepted, refused)``
    is told the result of every batch. A transient database error is retried
    with backoff; after :meth:`close`, only until its deadline.
    """

    def __init__(
        self,
        settle: Callable[[list[Outcome]], Awaitable[int]],
        on_settled: Callable[[int, int], None],
        *,
        logger: logging.Logger,
        extra: dict[str, Any],
        batch_max: int = BATCH_MAX,
    ) -> None:
        self._settle = settle
        self._on_settled = on_settled
        self._logger = logger
        self._extra = extra
        self._batch_max = batch_max
        self._lock = threading.Lock()
        self._pending: list[Outcome] = []
        self._ready = AsyncEvent()  # outcomes to flush, or closed
        self._deadline: float | None = None  # set by close()

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, outcome: Outcome) -> None:
        """Queue one outcome for the next flush (safe from any thread)."""
        with self._lock:
            self._pending.append(outcome)
        self._ready.set()

    def take(self, limit: int | None = None) -> list[Outcome]:
        """Remove and return up to ``limit`` (default: a batch) pending outcomes, oldest first."""
        limit = self._batch_max if limit is None else limit
        with self._lock:
            batch = self._pending[:limit]
            del self._pending[:limit]
        return batch

    def close(self, within: float) -> None:
        """Flush what is pending, then end :meth:`run`; a database that stays
        away is retried for ``within`` seconds, then the rest runs again after
        its lease."""
        self._deadline = time.monotonic() + within
        self._ready.set()

    async def run(self) -> None:
        """The flush loop: until closed and empty."""
        await self._ready.wait(0)  # binds the event to this loop (a no-op for threads)
        backoff = Backoff(0.05, 2.0)
        while True:
            batch = self.take()
            if not batch:
                if self._deadline is not None:
                    return
                await self._ready.wait(None)
                self._ready.clear()
                continue
            accepted = await self._flush(batch, backoff)
            if accepted is None:
                continue
            backoff.reset()
            refused = len(batch) - accepted
            self._on_settled(accepted, refused)
            if refused:
                self._logger.warning("%d of %d acks refused: those claims were no longer valid (lease lapsed)",
                                     refused, len(batch), extra=self._extra)

    async def _flush(self, batch: list[Outcome], backoff: Backoff) -> int | None:
        """Settle one batch; how many were accepted, None when it was given up."""
        while True:
            try:
                return await self._settle(batch)
            except TRANSIENT_ERRORS as error:
                if time.monotonic() >= (math.inf if self._deadline is None else self._deadline):
                    self._logger.error("could not ack %d finished jobs (%s); they run again after their lease",
                                       len(batch), one_line(error), extra=self._extra)
                    return None
                pause = backoff.next()
                self._logger.warning("ack failed (%s); trying again in %.1fs", one_line(error), pause,
                                     extra=self._extra)
                await AsyncRuntime.sleep(pause)
            except Exception:
                self._logger.exception("ack_batch failed; %d jobs run again after their lease", len(batch),
                                       extra=self._extra)
                return None
