"""The worker: claim jobs of one queue, run a handler on each, settle the
outcome. (The queue functions it calls are bound in pyalk/_async/queue.py.)

Every queue rule (claim order, leases, fencing, backoff, burial) is the SQL's
(sql/queue/); the worker only decides when to call it:

* it claims ahead into a local buffer (``prefetch``, default 1000 jobs, sized
  by the rate it starts jobs at), so one round trip feeds many handlers even
  at concurrency 1; ``concurrency`` runners (tasks, or threads) take jobs from
  the buffer one after the other, with no hand-off per job;
* a buffered job starts only while its lease surely holds: before half its
  visibility timeout (less a second for the whole-second clock) has passed
  since the claim was sent, or ``buffer_lifetime``; a job that waited longer,
  and every buffered job at a stop, goes back to pending at once without
  spending an attempt (``alk.release_jobs``);
* every outcome (ack, retry, fail) is settled in batches (flushed at
  ``settle_interval`` or when a batch is full) and carried with the next
  claim in one call (``alk.settle_and_claim``); the SQL reports what each
  led to (acked, pending again, dead), which is all the worker counts;
* when a claim comes back short it advertises itself idle
  (``alk.wait_for_jobs``, after LISTEN) so enqueues notify it, claims once
  more behind the advert's fence (``alk.wake_fence``), waits for NOTIFY, a
  fallback poll or ``alk.next_claim_at``, and withdraws the advert once busy
  again (``alk.stop_waiting``); a busy worker is never notified; the enqueue
  that notifies consumes the advert, so after any notification the worker
  advertises again (and takes a new fence) before it waits again;
* it heartbeats each running job every half visibility timeout, counted from
  its claim;
* on stop (``stop()``, SIGINT, SIGTERM) it stops claiming, releases what it
  buffered, gives running handlers ``grace_period`` seconds, flushes their
  outcomes and leaves whatever is still running to lease expiry;
* it treats a lost connection (server restart, terminated backend) as
  transient: it reconnects and carries on. A job whose outcome could not be
  recorded runs again after its lease: at least once, never lost.

One role per module: lifecycle.py (:class:`AsyncWorker`: options, start,
stop), claim.py (the claim loop), advert.py (the idle/wake handshake),
runners.py (the runners), settlement.py (the settlement batcher),
heartbeat.py (the heartbeater); the parts that do not wait are written once
in pyalk/worker/ (the prefetch buffer, the lifecycle table, the counts, the
observer protocol). The threaded form (pyalk/_sync/worker/) is generated
from this package; the primitives that differ (tasks vs threads, signals)
are in pyalk/runtime.py.
"""

# Re-exported with "as" (not __all__ strings, which the sync generator
# does not rename), so the threaded package exports Worker.
from pyalk._async.worker.advert import BUSY_POLL as BUSY_POLL
from pyalk._async.worker.lifecycle import SETTLE_INTERVAL as SETTLE_INTERVAL
from pyalk._async.worker.lifecycle import AsyncWorker as AsyncWorker
from pyalk._async.worker.runners import Handler as Handler
from pyalk.worker.buffer import PREFETCH as PREFETCH
from pyalk.worker.buffer import REFILL_AT as REFILL_AT
