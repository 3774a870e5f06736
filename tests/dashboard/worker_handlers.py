"""Handlers for the ``pyalk worker --metrics-port`` tests (run in a worker
process started by the CLI): each outcome by the payload's ``kind``."""

from __future__ import annotations

from typing import Any

from pyalk import PermanentError, Snooze


def _outcome(kind: str, attempts: int) -> None:
    if (kind == "flaky" and attempts == 1) or kind == "broken":
        raise ValueError(kind)  # retried; "broken" until the SQL buries it
    if kind == "permanent":
        raise PermanentError(kind)  # failed at once
    if kind == "sleepy" and attempts == 1:
        raise Snooze(0)  # snoozed, due again at once: acked on its second run


def observed(job: Any) -> None:
    _outcome(job.payload["kind"], job.job.attempts)
    if job.payload["kind"] == "self-ack":
        job.ack()  # the worker's own settle is then refused: lost


async def observed_async(job: Any) -> None:
    _outcome(job.payload["kind"], job.job.attempts)
    if job.payload["kind"] == "self-ack":
        await job.ack()
