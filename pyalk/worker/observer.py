"""The worker's observer: what a worker given one (its ``observer=`` option)
reports, at these points and nothing else:

* ``on_claimed(n, seconds)``: after each claim call (``alk.settle_and_claim``)
  that returned n jobs (n may be 0), with the call's duration;
* ``on_handler(seconds)``: when a handler returns or raises;
* ``on_settled(outcome, n, seconds)``: after each settle call (``alk.settle``,
  or the outcomes a claim call carried, or ``alk.snooze`` for a handler that
  raised :class:`~pyalk.Snooze`), once per outcome it covered, with n its
  jobs and the call's duration. The outcome is the state the SQL reports,
  named (:data:`OUTCOMES`): ``acked``; ``retried`` (pending again);
  ``failed`` (dead: the SQL decides burial); ``lost`` (refused: the claim was
  no longer valid, its lease lapsed); ``snoozed`` (pending again later, its
  attempt refunded);
* ``on_released(n)``: n claimed jobs this worker let go unsettled: released
  unstarted (``alk.release_jobs``, pending again at once), or left to their
  leases (abandoned past a stop's grace period, an outcome that could not be
  recorded).

In flight is claimed minus settled minus released: the jobs this worker
holds, buffered or running or waiting to be settled. Prometheus counters fed
this way are :class:`pyalk.dashboard.metrics.WorkerMetrics` (the
``dashboard`` extra); the worker itself imports nothing of it.
"""

from __future__ import annotations

from typing import Protocol

#: The outcomes ``on_settled`` names, one per state the SQL reports.
OUTCOMES = ("acked", "retried", "failed", "lost", "snoozed")


class WorkerObserver(Protocol):
    """What a worker reports, at the points listed in the module docstring."""

    def on_claimed(self, n: int, seconds: float) -> None: ...

    def on_handler(self, seconds: float) -> None: ...

    def on_settled(self, outcome: str, n: int, seconds: float) -> None: ...

    def on_released(self, n: int) -> None: ...
