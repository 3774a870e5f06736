"""A worker's lifecycle: its states, the transitions between them, and a
small thread-safe holder that enforces them.

::

    state      entered when                                    next
    ---------  ----------------------------------------------  ------------------------
    NEW        the worker is built                             STARTING
    STARTING   run() began: signals, heartbeater, settlement   RUNNING, DRAINING, FORCED
               batcher and listener start
    RUNNING    the claim loop runs                             DRAINING, FORCED
    DRAINING   stop() / SIGINT / SIGTERM / burst done: no      FORCED, FLUSHING
               more claims, running handlers get the grace
               period and their outcomes are recorded
    FORCED     stop(force=True) / second signal / run()        FLUSHING
               interrupted: no grace wait, recording a
               failure is no longer retried
    FLUSHING   the grace period is over: handlers still        STOPPED
               running are left to lease expiry (their
               outcomes discarded), finished outcomes are
               flushed, heartbeats and listener stop
    STOPPED    run() returned (terminal: a worker runs once)   -

A stop requested while NEW is remembered and applied as soon as run() enters
STARTING, so run() then goes STARTING -> DRAINING -> FLUSHING -> STOPPED and
returns at once. Any other transition raises :class:`IllegalTransition`.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable

from pyalk.worker.deadline import StopDeadline


class WorkerState(enum.Enum):
    NEW = "new"
    STARTING = "starting"
    RUNNING = "running"
    DRAINING = "draining"
    FORCED = "forced"
    FLUSHING = "flushing"
    STOPPED = "stopped"


_S = WorkerState

#: The legal transitions: each state's possible successors.
TRANSITIONS: dict[WorkerState, frozenset[WorkerState]] = {
    _S.NEW: frozenset({_S.STARTING}),
    _S.STARTING: frozenset({_S.RUNNING, _S.DRAINING, _S.FORCED}),
    _S.RUNNING: frozenset({_S.DRAINING, _S.FORCED}),
    _S.DRAINING: frozenset({_S.FORCED, _S.FLUSHING}),
    _S.FORCED: frozenset({_S.FLUSHING}),
    _S.FLUSHING: frozenset({_S.STOPPED}),
    _S.STOPPED: frozenset(),
}

#: States in which no claim is made any more.
STOPPING = frozenset({_S.DRAINING, _S.FORCED, _S.FLUSHING, _S.STOPPED})
#: States past the grace period (or without one): recording a failed job's
#: outcome is no longer retried.
CUT_OFF = frozenset({_S.FORCED, _S.FLUSHING, _S.STOPPED})
#: States in which a handler that returns has its outcome discarded.
ABANDONED = frozenset({_S.FLUSHING, _S.STOPPED})
#: States in which run() is in progress.
ACTIVE = frozenset({_S.STARTING, _S.RUNNING, _S.DRAINING, _S.FORCED, _S.FLUSHING})


class IllegalTransition(RuntimeError):
    """A transition the table does not allow (e.g. running a worker twice)."""


class Lifecycle:
    """The current :class:`WorkerState`, changed only along :data:`TRANSITIONS`.

    ``on_change(old, new)`` is called after every transition (outside the
    lock; from whichever thread made it). ``deadline``, when given, begins
    with the stop itself: before DRAINING or FORCED can be seen, so no
    thread that sees the worker stopping finds its deadline not yet begun
    (which on_change, running after, could not promise). Safe from any
    thread.
    """

    def __init__(self, on_change: Callable[[WorkerState, WorkerState], None],
                 deadline: StopDeadline | None = None) -> None:
        self._state = WorkerState.NEW
        self._pending: WorkerState | None = None  # a stop asked for while NEW
        self._lock = threading.Lock()
        self._on_change = on_change
        self._deadline = deadline

    @property
    def state(self) -> WorkerState:
        return self._state

    def stopping(self) -> bool:
        """Whether claiming is over (or a stop is pending)."""
        return self._state in STOPPING or self._pending is not None

    def advance(self, new: WorkerState) -> None:
        """Move to ``new``; :class:`IllegalTransition` when the table forbids it."""
        with self._lock:
            old = self._move(new)
            pending, self._pending = self._pending, None  # only NEW holds one
        self._on_change(old, new)
        if pending is not None:
            self.request_stop(force=pending is WorkerState.FORCED)

    def begin_running(self) -> bool:
        """STARTING -> RUNNING unless a stop came first; whether it ran."""
        with self._lock:
            if self._state is not WorkerState.STARTING:
                return False
            old = self._move(WorkerState.RUNNING)
        self._on_change(old, WorkerState.RUNNING)
        return True

    def request_stop(self, *, force: bool) -> None:
        """A stop: DRAINING (``force``: FORCED) when that is a legal next
        state, remembered when NEW, ignored when already past it."""
        target = WorkerState.FORCED if force else WorkerState.DRAINING
        with self._lock:
            if self._state is WorkerState.NEW:
                if self._pending is not WorkerState.FORCED:
                    self._pending = target
                return
            if target not in TRANSITIONS[self._state]:
                return
            old = self._move(target)
        self._on_change(old, target)

    def _move(self, new: WorkerState) -> WorkerState:
        old = self._state
        if new not in TRANSITIONS[old]:
            raise IllegalTransition(f"a worker cannot go from {old.value} to {new.value}")
        if self._deadline is not None and new in (WorkerState.DRAINING, WorkerState.FORCED):
            self._deadline.begin(force=new is WorkerState.FORCED)
        self._state = new
        return old
