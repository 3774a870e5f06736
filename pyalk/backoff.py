"""Exponential backoff between retries, shared by the worker, its helpers and
stream subscriptions (pure arithmetic: no sleeping, no clock)."""

from __future__ import annotations

import random


class Backoff:
    """Delays from ``first`` doubling to ``cap`` seconds.

    ``jitter`` spreads each delay by +-20% so many clients that lost the same
    server do not come back in step; ``immediate`` makes the first delay 0 (a
    single blip is retried at once, repeated failures back off).
    """

    def __init__(self, first: float, cap: float, *, jitter: bool = True, immediate: bool = False) -> None:
        self.first = first
        self.cap = max(cap, first)
        self.jitter = jitter
        self.immediate = immediate
        self._next: float = first
        self._zero: bool = immediate

    def next(self) -> float:
        """The next delay, in seconds."""
        if self._zero:
            self._zero = False
            return 0.0
        delay = self._next
        self._next = min(self.cap, self._next * 2)
        return delay * random.uniform(0.8, 1.2) if self.jitter else delay

    def reset(self) -> None:
        """Back to the first delay (after a success)."""
        self._next = self.first
        self._zero = self.immediate
