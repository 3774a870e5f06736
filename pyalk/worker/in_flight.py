"""The jobs whose handlers are running, shared by the runners (which add and
remove them), the heartbeater (which renews them) and a draining stop (which
waits for them to leave). Plain code, for both workers."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class InFlight(Generic[T]):
    """The running jobs, by identity (no key to build per job).
    ``on_leave`` is called whenever one leaves once ``watched`` is set (a
    draining stop waits on it); not before, which saves an event set per job."""

    def __init__(self, on_leave: Callable[[], None]) -> None:
        self._jobs: set[T] = set()
        self._lock = threading.Lock()
        self._on_leave = on_leave
        self.watched = False

    def __len__(self) -> int:
        return len(self._jobs)

    def add(self, running: T) -> None:
        with self._lock:
            self._jobs.add(running)

    def remove(self, running: T) -> None:
        with self._lock:
            self._jobs.discard(running)
        if self.watched:  # set before the watcher's count: a leave after it is seen
            self._on_leave()

    def jobs(self) -> list[T]:
        with self._lock:
            return list(self._jobs)
