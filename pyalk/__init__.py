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
from pyalk._async.executor import AsyncExecutor
from pyalk._async.job import AsyncJobHandle
from pyalk._async.lock import AsyncLock
from pyalk._async.outbox import AsyncOutbox
from pyalk._async.outcome import AsyncDeferredJob
from pyalk._async.queue import AsyncQueue
from pyalk._async.schedule import AsyncSchedules
from pyalk._async.stream import AsyncStream, AsyncSubscription
from pyalk._async.worker import AsyncWorker
from pyalk._sync.client import Alk
from pyalk._sync.executor import Executor
from pyalk._sync.job import JobHandle
from pyalk._sync.lock import Lock
from pyalk._sync.outbox import Outbox
from pyalk._sync.outcome import DeferredJob
from pyalk._sync.queue import Queue
from pyalk._sync.schedule import Schedules
from pyalk._sync.stream import Stream, Subscription
from pyalk._sync.worker import Worker
from pyalk.errors import (
    AlkError,
    ClaimInTransaction,
    CodecError,
    ConnectError,
    InvalidArgument,
    InvalidName,
    InvalidSchedule,
    JobCancelled,
    JobDied,
    JobNotFound,
    LeadershipLost,
    LockLost,
    LockNotAcquired,
    NoResultKept,
    NotPermitted,
    SchemaMismatch,
    WaitTimeout,
)
from pyalk.stop_token import AsyncStopToken, StopToken
from pyalk.tasks import Task, TaskError, Tasks
from pyalk.values import Fired, Job, LockInfo, QueueLimits, QueueOpts, QueueStats, Schedule, StreamEvent, WorkerInfo
from pyalk.worker.errors import PermanentError, Snooze
from pyalk.worker.tally import WorkerCounts

__all__ = [
    "Alk",
    "AlkError",
    "AsyncAlk",
    "AsyncDeferredJob",
    "AsyncExecutor",
    "AsyncJobHandle",
    "AsyncLock",
    "AsyncOutbox",
    "AsyncQueue",
    "AsyncSchedules",
    "AsyncStopToken",
    "AsyncStream",
    "AsyncSubscription",
    "AsyncWorker",
    "ClaimInTransaction",
    "CodecError",
    "ConnectError",
    "DeferredJob",
    "Executor",
    "Fired",
    "InvalidArgument",
    "InvalidName",
    "InvalidSchedule",
    "Job",
    "JobCancelled",
    "JobDied",
    "JobHandle",
    "JobNotFound",
    "LeadershipLost",
    "Lock",
    "LockInfo",
    "LockLost",
    "LockNotAcquired",
    "NoResultKept",
    "NotPermitted",
    "Outbox",
    "PermanentError",
    "Queue",
    "QueueLimits",
    "QueueOpts",
    "QueueStats",
    "Schedule",
    "Schedules",
    "SchemaMismatch",
    "Snooze",
    "StopToken",
    "Stream",
    "StreamEvent",
    "Subscription",
    "Task",
    "TaskError",
    "Tasks",
    "WaitTimeout",
    "Worker",
    "WorkerCounts",
    "WorkerInfo",
]
