"""pyalk: job queues, streams, outbox, locks and a scheduler that live inside
PostgreSQL as versioned SQL functions; this package binds them.

    from pyalk import Alk
    with Alk("dbname=app") as alk:
        queue = alk.queue("emails")
        queue.enqueue({"to": "ada@example.com"})
        job = queue.claim_one("worker-1")
        if job:
            job.ack()

``AsyncAlk`` is the same surface for asyncio.
"""

from pyalk._async.client import AsyncAlk
from pyalk._async.queue import AsyncJobHandle, AsyncQueue
from pyalk._sync.client import Alk
from pyalk._sync.queue import JobHandle, Queue
from pyalk.errors import (
    AlkError,
    ClaimInTransaction,
    CodecError,
    InvalidArgument,
    InvalidName,
    InvalidSchedule,
    LeadershipLost,
)
from pyalk.job import Job
from pyalk.options import QueueOpts

__all__ = [
    "Alk",
    "AlkError",
    "AsyncAlk",
    "AsyncJobHandle",
    "AsyncQueue",
    "ClaimInTransaction",
    "CodecError",
    "InvalidArgument",
    "InvalidName",
    "InvalidSchedule",
    "Job",
    "JobHandle",
    "LeadershipLost",
    "Queue",
    "QueueOpts",
]
