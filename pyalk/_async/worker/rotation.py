"""The worker's share of the job storage's rotation (sql/queue/15_rotation.sql,
docs/design.md, "Job storage"): while it settles jobs, it calls
alk.rotate_jobs every :data:`ROTATE_EVERY` seconds, which empties the current
slot once enough of its jobs are settled (and no more are live), 20,000 rows
a call, and once more as it stops if it settled jobs since. Any worker of any queue may be the
one that rotates; each call costs one round trip and, when not due, at most a
count of the slot's live jobs.

The rotation serves throughput, never correctness: a server without it (before
version 0028), a role without the grant or any other refusal is logged once and
the worker goes on without; a server that does not answer is tried again later.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import psycopg

from pyalk._async.queue import AsyncQueue
from pyalk._async.rotation import rotate_jobs
from pyalk.errors import TRANSIENT_ERRORS, AlkError, ConnectError
from pyalk.runtime import AsyncEvent
from pyalk.worker.errors import one_line
from pyalk.worker.tally import LogFields

logger = logging.getLogger("pyalk.worker")

#: Seconds between calls while the worker settles jobs.
ROTATE_EVERY = 0.1
#: Seconds to wait after a refusal: 'locked' (each try that waits for the
#: lock holds up the claims queued behind it for a moment) or 'too many live
#: jobs' (each counted over 20,000 of them, and the backlog settles no faster).
AFTER_REFUSED = 0.5
#: The answer of a call that could not take its locks.
LOCKED = "locked"
#: The answer of a call that moved a step of a slot's rows and left more.
MOVING = "moving"
#: Answers (None: the call failed) after which the slot may be due, half
#: emptied or draining while the next settle may be far off: asked again at
#: the next tick, settles or not (the slot's space comes back only once it
#: is empty).
_ASK_AGAIN = (None, LOCKED, MOVING)
#: Answers after which that tick is AFTER_REFUSED away.
_WAIT_LONGER = (None, LOCKED, "too many live jobs")
#: The longest a stopping worker waits for its last call (alk.rotate_jobs
#: waits at most 100 ms for its lock, then moves at most 20,000 rows).
LAST_CALL_WITHIN = 2.0

_PASSING: tuple[type[BaseException], ...] = (*TRANSIENT_ERRORS, ConnectError)


class AsyncRotator:
    """:meth:`run` calls alk.rotate_jobs while ``settled()`` (a count of the
    worker's settled jobs) grows, until :meth:`close`."""

    def __init__(self, queue: AsyncQueue, *, settled: Callable[[], int], fields: LogFields) -> None:
        self._queue = queue
        self._settled = settled
        self._fields = fields
        self._closed = AsyncEvent()
        #: How each call answered, by answer (for tests and logs).
        self.answers: dict[str, int] = {}
        self._given_up = False
        self._failing = False

    def close(self) -> None:
        self._closed.set()

    async def run(self) -> None:
        """Until :meth:`close`, then a last call if jobs were settled since
        the previous one: a burst worker's last jobs may leave the slot due.
        (The count grows as settles commit, so a call always follows the
        last of them.)"""
        seen = self._settled()
        again = False  # call at the next tick, settles or not
        while not self._closed.is_set() and not self._given_up:
            wait = ROTATE_EVERY
            now = self._settled()
            if now != seen or again:
                seen = now
                answer = await self._rotate()
                again = answer in _ASK_AGAIN
                if answer in _WAIT_LONGER:
                    wait = AFTER_REFUSED
            await self._closed.wait(wait)
        if not self._given_up and self._settled() != seen:
            await self._rotate()

    async def _rotate(self) -> str | None:
        try:
            answer = await rotate_jobs(self._queue.executor)
        except _PASSING as error:
            if not self._failing:
                logger.warning("alk.rotate_jobs failed (%s): trying again", one_line(error), extra=self._fields())
            self._failing = True
            return None
        except (psycopg.Error, AlkError) as error:
            # Not passing: no rotation on this server (before version 0028),
            # no grant for this role.
            self._given_up = True
            logger.warning("not rotating the job storage (%s): working on without", one_line(error),
                           extra=self._fields())
            return None
        self._failing = False
        self.answers[answer] = self.answers.get(answer, 0) + 1
        if answer == "rotated":
            logger.debug("rotated the job storage", extra=self._fields())
        return answer
