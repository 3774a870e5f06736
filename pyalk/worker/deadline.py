"""The one deadline a stopping worker keeps (docs/worker.md, "Stopping"):
computed once, when the stop arrives, as the grace period plus a fixed
margin, and handed to every wait of the shutdown. Plain code, for both
workers.

Whatever the server does (down, restarting, every connection slot taken),
the worker waits for it only until this deadline: a claim in flight, the
release of unstarted jobs, the last flush, the background loops. Past it,
the worker lets go of what it still holds (the jobs run again after their
lease, as when a handler outlives the grace period) and ``run()`` returns.
"""

from __future__ import annotations

import math
import threading
import time

#: Seconds a stop allows beyond the grace period: the release of jobs put
#: back meanwhile, the final flush and the background loops' exit, each a
#: round trip or less against a healthy server. The rest of the second the
#: issue allows (grace + 1 s) is the process's own exit.
STOP_MARGIN = 0.25
#: Seconds a claim loop still out at a stop may take to come back: a healthy
#: claim takes milliseconds; one out longer is waiting for the server (a
#: connection slot, a reply on a dead socket) and is given up.
CLAIM_STRAGGLE = 0.25


class StopDeadline:
    """When a stopping worker's grace period ends and when it gives up
    waiting: :meth:`begin` at the stop (again at a forced stop, which only
    brings both closer), then :meth:`left` and :meth:`grace_left` for each
    wait. Before a stop both are infinite."""

    def __init__(self, grace_period: float) -> None:
        self.grace_period = grace_period
        self.grace_end = math.inf  # time.monotonic() when running handlers are let go
        self.at = math.inf  # time.monotonic() when the worker stops waiting for anything
        self._lock = threading.Lock()  # a signal's stop and run()'s own may race

    def begin(self, *, force: bool) -> None:
        """The stop arrived (``force``: with no grace period)."""
        now = time.monotonic()
        grace_end = now + (0.0 if force else self.grace_period)
        with self._lock:
            self.grace_end = min(self.grace_end, grace_end)
            self.at = min(self.at, grace_end + STOP_MARGIN)

    def left(self) -> float:
        """Seconds until the deadline (0 once past it)."""
        return max(self.at - time.monotonic(), 0.0)

    def grace_left(self) -> float:
        """Seconds until the grace period ends (0 once over)."""
        return max(self.grace_end - time.monotonic(), 0.0)

    def straggle(self) -> float:
        """Seconds a claim still out at the stop may take to come back."""
        return min(CLAIM_STRAGGLE, self.left())
