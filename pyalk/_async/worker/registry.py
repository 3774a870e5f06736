"""The worker's row in the registry of workers (sql/workers.sql,
docs/worker.md, "Seen and stopped from anywhere"): registered at start,
kept current by one beat every :data:`~pyalk.worker.control.BEAT_INTERVAL`
seconds carrying the jobs the worker holds (never a statement per job), and
deregistered at exit within :data:`~pyalk.worker.control.DEREGISTER_WITHIN`
seconds.

A stop asked with alk.request_stop arrives as the payload ``stop`` on the
worker's control channel (LISTENed on its LISTEN connection), or as a beat
that answers true (a worker without LISTEN, or one that was reconnecting);
either stops the worker as SIGTERM does. A beat that answers NULL (the row
was pruned, or removed by hand) registers again. alk.cancel of a job the
worker holds arrives as ``cancel <job_id>`` on the same channel and goes to
``cancel`` (the runners tell the job's handler); a worker without LISTEN
learns nothing of it, and its handler's outcome is refused as for any lost job.

The registry serves operators; it is never a condition of work: a server
without it (before version 0024), a role without the grant or any other
refusal is logged once and the worker goes on without a row; a server that
does not answer is tried again at the next beat.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable

import psycopg

from pyalk._async import workers
from pyalk._async.listener import AsyncListener
from pyalk._async.queue import AsyncQueue
from pyalk.errors import TRANSIENT_ERRORS, AlkError, ConnectError
from pyalk.runtime import AsyncEvent
from pyalk.worker import control
from pyalk.worker.control import CANCEL, STOP, client_version, job_id, verb
from pyalk.worker.errors import one_line
from pyalk.worker.tally import LogFields

logger = logging.getLogger("pyalk.worker")

#: Failures tried again at the next beat: the server went away, or was away
#: at start (the executor's first connection raises ConnectError).
_PASSING: tuple[type[BaseException], ...] = (*TRANSIENT_ERRORS, ConnectError)


class AsyncRegistration:
    """One worker's row: :meth:`run` registers and beats until :meth:`close`,
    then deregisters. ``holding()`` is the jobs the worker holds now
    (claimed, not yet settled); ``stop()`` stops it as SIGTERM does;
    ``cancel(job_id)`` is told of each job alk.cancel took from it."""

    def __init__(
        self,
        queue: AsyncQueue,
        worker_id: str,
        *,
        concurrency: int,
        listener: AsyncListener | None,
        holding: Callable[[], int],
        stop: Callable[[], None],
        cancel: Callable[[int], None],
        fields: LogFields,
    ) -> None:
        self._queue = queue
        self._worker_id = worker_id
        self._concurrency = concurrency
        self._listener = listener
        self._holding = holding
        self._stop = stop
        self._cancel = cancel
        self._fields = fields
        # Read when built, so a test can shorten it for its workers.
        self._beat_interval = control.BEAT_INTERVAL
        self._closed = AsyncEvent()  # the worker is done: deregister and return
        #: The control channel, once registered.
        self.channel: str | None = None
        #: alk.request_stop asked this worker to stop.
        self.stop_requested = False
        self._given_up = False  # refused for good: working without the registry
        self._failing = False  # the last call failed transiently (logged once per outage)

    def close(self) -> None:
        """The worker is done: :meth:`run` deregisters and returns."""
        self._closed.set()

    async def run(self) -> None:
        while not self._closed.is_set() and not self._given_up:
            await self._tick()
            await self._closed.wait(self._beat_interval)
        if self.channel is not None and not self._given_up:
            await self._deregister()

    async def _tick(self) -> None:
        """Register (at first, and when the row is gone), else beat."""
        executor = self._queue.executor
        try:
            if self.channel is None:
                await self._register()
            else:
                stopping = await workers.beat(executor, self._worker_id, self._holding(), self._queue.name)
                if stopping is None:
                    logger.info("this worker's row was gone from alk.workers(): registering again",
                                extra=self._fields())
                    await self._register()
                elif stopping:
                    self._stop_asked("at its beat")
        except _PASSING as error:
            if not self._failing:
                logger.warning("registry of workers unreachable (%s): trying again every %.0fs",
                               one_line(error), self._beat_interval, extra=self._fields())
            self._failing = True
            return
        except (psycopg.Error, AlkError) as error:
            # Not a passing failure: no registry on this server (before
            # version 0024), no grant for this role, a queue outside its names.
            self._given_up = True
            logger.warning("not registered in alk.workers() (%s): working on without the registry of workers",
                           one_line(error), extra=self._fields())
            return
        except Exception:
            self._given_up = True
            logger.exception("registering in alk.workers() failed: working on without the registry of workers",
                             extra=self._fields())
            return
        self._failing = False

    async def _register(self) -> None:
        channel = await workers.register(
            self._queue.executor, self._worker_id, self._queue.name, host=socket.gethostname(), pid=os.getpid(),
            concurrency=self._concurrency, version=client_version())
        if self.channel is None and self._listener is not None:
            self._listener.listen_also(channel, self._on_control)
        self.channel = channel
        logger.debug("registered in alk.workers(); control channel %s", channel,
                     extra=self._fields(channel=channel))

    def _on_control(self, payload: str) -> None:
        """A notification on the control channel (from the listener's loop)."""
        asked = verb(payload)
        if asked == STOP:
            self._stop_asked("on its control channel")
        elif asked == CANCEL:
            cancelled = job_id(payload)
            if cancelled is not None:
                self._cancel(cancelled)

    def _stop_asked(self, how: str) -> None:
        if not self.stop_requested:
            self.stop_requested = True
            logger.info("alk.request_stop asked this worker to stop (seen %s): stopping", how,
                        extra=self._fields())
        self._stop()

    async def _deregister(self) -> None:
        """Best effort: the caller bounds the wait (a row left behind shows
        as gone after the silence bound, and is pruned)."""
        try:
            await workers.deregister(self._queue.executor, self._worker_id, self._queue.name)
        except Exception as error:
            logger.warning("could not deregister from alk.workers() (%s): its row shows as gone in 30s",
                           one_line(error), extra=self._fields())
