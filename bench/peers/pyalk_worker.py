"""The slot for pyalk's own worker in the end-to-end row (issue 7 §2) and the
wake-latency row (§3).

pyalk's worker does not exist yet. When it lands, fill in ``run`` the same
way the peers do: enqueue ``args.jobs`` no-op jobs with ``alk.enqueue_batch``
(through the Python wrapper), start the worker with concurrency
``args.concurrency`` and its recommended throughput settings, tick the
Countdown from the handler, and return a PeerResult named "pyalk". The row
(bench/rows_e2e.py) picks it up as soon as ``import pyalk.worker`` works.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bench.peers.common import Args, PeerResult, PeerUnavailable, main

if TYPE_CHECKING:
    from bench.registry import Context, RowResult


def missing() -> str | None:
    try:
        import pyalk.worker  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        return "pyalk's worker (pyalk.worker) does not exist yet"
    return None


async def run(args: Args) -> PeerResult:
    reason = missing()
    if reason:
        raise PeerUnavailable(reason)
    raise PeerUnavailable("pyalk.worker exists: write bench/peers/pyalk_worker.run against its API")


def wake_latency(ctx: Context) -> RowResult:
    """Enqueue-commit to handler-start latency (p50/p99) with the worker idle
    on LISTEN/NOTIFY. To be written with the worker."""
    raise NotImplementedError("wake latency: write it when pyalk's worker lands")


if __name__ == "__main__":
    main(run)
