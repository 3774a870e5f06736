"""The worker's heartbeater: renews the lease of each running job every half
visibility timeout, on one loop for all of them."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyalk._async.job import AsyncJobHandle
from pyalk.errors import TRANSIENT_ERRORS
from pyalk.runtime import AsyncEvent
from pyalk.values import Job
from pyalk.worker.errors import one_line


@dataclass(slots=True, eq=False)
class Running:
    """A job whose handler is running, with its heartbeat schedule."""

    handle: AsyncJobHandle
    started: float  # time.monotonic() when the claim returned
    interval: float  # seconds between heartbeats: half the visibility timeout
    next_beat: float  # time.monotonic() of the next heartbeat (inf: none)
    lost: bool = False  # a heartbeat found the claim no longer valid
    task: Any = None  # the task running its handler, while it runs (async only: AsyncRuntime.current())
    interrupted: bool = False  # alk.cancel took it and its handler's task was cancelled

    @property
    def key(self) -> tuple[int, int]:
        """The claim's identity: job id and attempt."""
        return (self.handle.id, self.handle.job.attempts)



class AsyncHeartbeater:
    """Heartbeats the jobs ``jobs()`` returns when each is due; :meth:`poke`
    when a job starts (its schedule joins), :meth:`close` to end :meth:`run`.
    ``fields(job)`` gives the structured log fields."""

    def __init__(
        self,
        jobs: Callable[[], list[Running]],
        *,
        poll_interval: float,
        logger: logging.Logger,
        fields: Callable[[Job], dict[str, Any]],
    ) -> None:
        self._jobs = jobs
        self._poll_interval = poll_interval
        self._logger = logger
        self._fields = fields
        self._changed = AsyncEvent()  # a job started, or closed: recompute
        self._closed = False

    def poke(self) -> None:
        self._changed.set()

    def close(self) -> None:
        self._closed = True
        self._changed.set()

    async def run(self) -> None:
        while not self._closed:
            self._changed.clear()
            now = time.monotonic()
            for running in [running for running in self._jobs() if running.next_beat <= now]:
                await self.beat(running)
            upcoming = min((running.next_beat for running in self._jobs()), default=math.inf)
            await self._changed.wait(min(max(upcoming - time.monotonic(), 0.0), self._poll_interval))

    async def beat(self, running: Running) -> None:
        """One heartbeat; schedules the next (sooner after a transient error, never after a lost lease)."""
        job = running.handle.job
        sent = time.monotonic()
        try:
            held = await running.handle.heartbeat()
        except TRANSIENT_ERRORS as error:
            running.next_beat = time.monotonic() + min(running.interval / 4, 1.0)
            self._logger.warning("heartbeat of job %d failed (%s)", job.id, one_line(error), extra=self._fields(job))
            return
        except Exception:
            running.next_beat = time.monotonic() + running.interval
            self._logger.exception("heartbeat of job %d failed", job.id, extra=self._fields(job))
            return
        if held:
            running.next_beat = sent + running.interval
        else:
            running.lost = True
            running.next_beat = math.inf
            self._logger.warning("job %d lost its lease (it lapsed and may be running elsewhere); its outcome will "
                                 "not count", job.id, extra=self._fields(job))
