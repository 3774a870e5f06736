"""The outbox: bindings of alk.outbox_enqueue, alk.outbox_claim, the
delivery loop step ``run_once`` and the relay loop ``run`` around it.

The rules (backing queue ``alk:outbox:<name>``, the outbox stamps, claim,
fencing, backoff) are in sql/outbox.sql and sql/queue/ (docs/contract.md#outbox);
this module encodes arguments, decodes rows and settles a delivery.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from pyalk import _codec
from pyalk._async.job import AsyncJobHandle
from pyalk.backoff import Backoff
from pyalk.errors import TRANSIENT_ERRORS, InvalidArgument
from pyalk.queue_params import ENQUEUE_OPTIONS, enqueue_params
from pyalk.values import JOB_COLUMNS, Job, QueueOpts, job_from_row
from pyalk.worker.errors import one_line

if TYPE_CHECKING:
    from psycopg import AsyncConnection

    from pyalk._async.executor import AsyncExecutor
    from pyalk.stop_token import AsyncStopToken

logger = logging.getLogger("pyalk.outbox")

_ENQUEUE = (
    "SELECT alk.outbox_enqueue(outbox => %(queue)s, payload => %(payload)s::jsonb, dedup_key => %(dedup_key)s::text,"
    + ENQUEUE_OPTIONS
    + ")"
)
_ENQUEUE_BATCH = (
    "SELECT * FROM alk.outbox_enqueue_batch(outbox => %(queue)s, payloads => %(payloads)s::jsonb[],"
    + ENQUEUE_OPTIONS
    + ")"
)
_CLAIM = "SELECT " + JOB_COLUMNS + " FROM alk.outbox_claim(%(outbox)s, %(worker_id)s, %(n)s::bigint)"
_GET_JOB = (
    "SELECT " + JOB_COLUMNS + " FROM alk.outbox_get_job(%(outbox)s, %(job_id)s::bigint) WHERE id IS NOT NULL"
)

#: What a delivery callable receives: the claimed message, whose ``payload``
#: is the enqueued value and whose ``heartbeat`` extends a long delivery.
Delivery = Callable[[AsyncJobHandle], Awaitable[None]]


#: The first pause after a transient database error in :meth:`AsyncOutbox.run`;
#: it doubles up to the loop's ``poll_interval``.
_RETRY_FIRST = 0.1


@dataclass(slots=True)
class RelayCounts:
    """What one :meth:`AsyncOutbox.run` did: deliveries that returned (the
    message acked) and deliveries that raised (retried, or dead once its
    attempts were spent)."""

    delivered: int = 0
    failed: int = 0


def _error_text(error: BaseException) -> str:
    """The ``err`` a failed delivery records: ``str(error)``, or the class name
    when that is empty; NUL (which text cannot hold) shown as ``\\0``."""
    return (str(error) or type(error).__name__).replace("\x00", "\\0")


class AsyncOutbox:
    """One outbox, by name: messages written with the caller's transaction,
    delivered afterwards at least once by :meth:`run_once` loops.

    ``opts`` overrides the outbox stamps (None fields keep the SQL defaults:
    60 s visibility, 5 attempts, 5 s backoff base, dead rows kept forever).
    """

    def __init__(self, executor: AsyncExecutor, name: str, opts: QueueOpts | None = None) -> None:
        self.executor = executor
        # The name goes to the alk.outbox_* functions, which derive the backing queue.
        self.name = _codec.text(name, "outbox")
        self.opts = opts or QueueOpts()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    async def enqueue(
        self,
        payload: Any,
        *,
        delay: int | timedelta | None = None,
        run_at: int | datetime | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        expires: int | timedelta | None = None,
        dedup_key: str | None = None,
        conn: AsyncConnection | None = None,
    ) -> int:
        """Write one message and return its job id.

        Pass ``conn`` (a psycopg connection inside your transaction) so the
        message commits or rolls back with your own writes; pyalk never
        commits or rolls back a connection it was given.
        """
        params = enqueue_params(self.name, self.opts, delay, run_at, priority, max_attempts, expires)
        params["payload"] = _codec.payload(payload)
        params["dedup_key"] = None if dedup_key is None else _codec.text(dedup_key, "dedup_key")
        return int(await self.executor.value(_ENQUEUE, params, conn=conn, transactional=True))

    async def enqueue_batch(
        self,
        payloads: Iterable[Any],
        *,
        delay: int | timedelta | None = None,
        run_at: int | datetime | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        expires: int | timedelta | None = None,
        conn: AsyncConnection | None = None,
    ) -> list[int]:
        """Write many messages in one round trip; their job ids in input order."""
        params = enqueue_params(self.name, self.opts, delay, run_at, priority, max_attempts, expires)
        params["payloads"] = _codec.payloads(payloads)
        rows = await self.executor.rows(_ENQUEUE_BATCH, params, conn=conn, transactional=True)
        return [row[0] for row in rows]

    async def claim_batch(self, worker_id: str, n: int) -> list[AsyncJobHandle]:
        """Claim up to ``n`` due messages (``n <= 0`` claims nothing); settle
        each with ``ack()`` or ``retry(err)``. :meth:`run_once` does both."""
        params = {"outbox": self.name, "worker_id": _codec.text(worker_id, "worker_id"), "n": _codec.bigint(n, "n")}
        rows = await self.executor.rows(_CLAIM, params)
        return [AsyncJobHandle(self.executor, job_from_row(row)) for row in rows]

    async def claim_one(self, worker_id: str) -> AsyncJobHandle | None:
        """Claim the next due message, or None when there is none."""
        handles = await self.claim_batch(worker_id, 1)
        return handles[0] if handles else None

    async def get_job(self, job_id: int, *, conn: AsyncConnection | None = None) -> Job | None:
        """The message in any state (dead included, ``last_error`` says why),
        or None once it was delivered."""
        params = {"outbox": self.name, "job_id": _codec.bigint(job_id, "job_id")}
        rows = await self.executor.rows(_GET_JOB, params, conn=conn, transactional=True)
        return job_from_row(rows[0]) if rows else None

    async def sweep_expired(self) -> int:
        """Bury expired messages and purge dead ones past their retention;
        how many rows changed."""
        return int(await self.executor.value("SELECT alk.outbox_sweep_expired(%(outbox)s)", {"outbox": self.name}))

    async def run_once(self, worker_id: str, delivery: Delivery) -> bool:
        """Claim one message and deliver it; False when none was due.

        ``delivery(message)`` returning means delivered: the message is
        acked. Raising an :class:`Exception` means not delivered: the message
        is retried with ``str(error)`` on the row's backoff curve
        (``backoff_base_s * 2^(attempts-1)``), and dead once its attempts are
        spent. Either way run_once returns True.

        The settling op carries the claim's fencing token: if the delivery
        outlived the visibility timeout and the message was claimed again,
        the stale ack (or retry) changes nothing and a warning is logged;
        the message stays with its new claim.
        """
        message = await self.claim_one(worker_id)
        if message is None:
            return False
        try:
            await delivery(message)
        except Exception as error:
            settled = await message.retry(_error_text(error))
            outcome = "retry"
        else:
            settled = await message.ack()
            outcome = "ack"
        if not settled:
            logger.warning(
                "outbox %r: the %s of message %s (attempt %s) was refused: its claim lapsed or was taken over "
                "before the delivery finished",
                self.name,
                outcome,
                message.id,
                message.job.attempts,
            )
        return True

    async def run(
        self,
        stop: AsyncStopToken,
        delivery: Delivery,
        *,
        worker_id: str | None = None,
        poll_interval: float = 1.0,
        burst: bool = False,
    ) -> RelayCounts:
        """The relay loop: deliver every due message, one :meth:`run_once` at
        a time, until ``stop`` is cancelled; what it did.

        When nothing is due it looks again every ``poll_interval`` seconds
        (a cancel wakes it at once); with ``burst`` it returns instead.
        ``worker_id`` names its claims (default ``relay:<outbox>``). A
        delivery that raises is logged with its error (a retry keeps no
        error text on the row) and retried by the message's backoff. A lost
        connection or a failed checkout (``pyalk.errors.TRANSIENT_ERRORS``)
        is logged and tried again after a growing pause, up to
        ``poll_interval``; any other error is raised.
        """
        worker_id = f"relay:{self.name}" if worker_id is None else str(_codec.text(worker_id, "worker_id"))
        if isinstance(poll_interval, bool) or not isinstance(poll_interval, int | float) or not poll_interval > 0:
            raise InvalidArgument(f"poll_interval must be a number of seconds > 0, got {poll_interval!r}")
        counts = RelayCounts()
        extra = {"outbox": self.name, "worker_id": worker_id}

        async def counted(message: AsyncJobHandle) -> None:
            try:
                await delivery(message)
            except Exception as error:
                counts.failed += 1
                job = message.job
                then = "dead" if job.attempts_spent >= job.max_attempts else "retried later"
                logger.warning("outbox %r: message %s (attempt %s of %s) not delivered, %s: %s: %s", self.name,
                               message.id, job.attempts, job.max_attempts, then, type(error).__name__, error,
                               extra={**extra, "job_id": message.id})
                raise
            counts.delivered += 1

        failing = Backoff(_RETRY_FIRST, poll_interval)
        while not stop.is_cancelled():
            try:
                if await self.run_once(worker_id, counted):
                    failing.reset()
                    continue
            except TRANSIENT_ERRORS as error:
                pause = failing.next()
                logger.warning("outbox %r: database unavailable (%s); trying again in %.1fs", self.name,
                               one_line(error), pause, extra=extra)
                await stop.wait(pause)
                continue
            failing.reset()
            if burst:
                break
            await stop.wait(poll_interval)  # nothing due: look again then
        return counts
