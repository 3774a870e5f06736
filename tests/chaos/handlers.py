"""Handlers the chaos tests run in real worker processes
(``pyalk worker tests.chaos.handlers:work``). Each appends one JSON line per
start to ``$CHAOS_LEDGER/<pid>.jsonl``: the job id, the attempt (the claim's
fencing token), the worker, the wall-clock start and the lease end as the
claim returned it. One unbuffered ``write`` per line survives a SIGKILL.
The payload says how long the job runs: ``{"n": ..., "s": seconds}``, and
with ``"retry": true`` (``work_or_retry``) that its first attempt raises, so
the worker retries it; that start's line says ``"raised": true``.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any


def _record(job: Any, raised: bool = False) -> float:
    row = job.job
    record = {"id": row.id, "attempt": row.attempts, "worker": row.worker_id, "pid": os.getpid(),
              "start": time.time(), "expires": row.claim_expires_at}
    if raised:
        record["raised"] = True
    line = json.dumps(record) + "\n"
    path = os.path.join(os.environ["CHAOS_LEDGER"], f"{os.getpid()}.jsonl")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    payload = row.payload if isinstance(row.payload, dict) else {}
    return float(payload.get("s", 0))


def work(job: Any) -> None:
    time.sleep(_record(job))


async def work_async(job: Any) -> None:
    await asyncio.sleep(_record(job))


class RetryMe(Exception):
    """What ``work_or_retry`` raises on a ``"retry"`` job's first attempt."""


def work_or_retry(job: Any) -> None:
    payload = job.job.payload if isinstance(job.job.payload, dict) else {}
    raised = bool(payload.get("retry")) and job.job.attempts == 1
    time.sleep(_record(job, raised))
    if raised:
        raise RetryMe("first attempt")
