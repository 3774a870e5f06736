"""Stop tokens: how a caller tells a long-running pyalk loop
(:func:`run_schedules <pyalk._async.schedule.run_schedules>`) to return.

Two hand-written forms side by side, like pyalk/runtime.py: the
asyncio one (:class:`AsyncStopToken`) and the threaded one
(:class:`StopToken`). tools/unasync.py turns ``AsyncStopToken`` in the async
source into ``StopToken`` in the generated sync code, and both offer the same
three methods: ``cancel()``, ``is_cancelled()`` and ``wait(timeout)``, which
the loops sleep on so that a cancel wakes them at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading


class AsyncStopToken:
    """A stop request for asyncio loops.

    :meth:`cancel` may be called from any thread (or from a signal handler
    on the loop's thread); every :meth:`wait` in progress returns at once.
    Cancelling is final.
    """

    def __init__(self) -> None:
        self._cancelled = False
        self._guard = threading.RLock()  # reentrant: cancel() may run in a signal handler
        # One asyncio.Event per waiter, with the loop it belongs to: an
        # asyncio.Event may only be set from its own loop.
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(cancelled={self._cancelled})"

    def cancel(self) -> None:
        """Ask the loops watching this token to stop; wakes them now."""
        with self._guard:
            self._cancelled = True
            waiters = list(self._waiters)
        for loop, event in waiters:
            # Thread-safe even on the loop's own thread: it also wakes a loop
            # blocked in select(), as it is when a plain signal handler runs.
            # A closed loop raises RuntimeError: nobody is waiting on it any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(event.set)

    def is_cancelled(self) -> bool:
        return self._cancelled

    async def wait(self, timeout: float | None = None) -> bool:
        """Sleep until cancelled or ``timeout`` seconds (None: no limit);
        whether the token is cancelled."""
        if self._cancelled:
            return True
        if timeout is not None and timeout <= 0:
            return False
        waiter = (asyncio.get_running_loop(), asyncio.Event())
        with self._guard:
            if self._cancelled:
                return True
            self._waiters.add(waiter)
        try:
            await asyncio.wait_for(waiter[1].wait(), timeout)
        except TimeoutError:
            pass
        finally:
            with self._guard:
                self._waiters.discard(waiter)
        return self._cancelled


class StopToken:
    """A stop request for threaded loops: :meth:`cancel` from any thread
    wakes every :meth:`wait` in progress at once. Cancelling is final."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(cancelled={self._event.is_set()})"

    def cancel(self) -> None:
        """Ask the loops watching this token to stop; wakes them now."""
        self._event.set()

    def is_cancelled(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep until cancelled or ``timeout`` seconds (None: no limit);
        whether the token is cancelled."""
        if timeout is not None and timeout <= 0:
            return self._event.is_set()
        return self._event.wait(timeout)
