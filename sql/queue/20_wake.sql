-- pyalk queue, wake-ups (docs/contract.md#queue): the channel of a queue,
-- idle workers' adverts and the enqueue side that consumes them.
--
-- Before enqueue, whose functions call alk._wake. Landed in 0002_queue.sql
-- (the channel) and 0009_queue.sql (adverts, fence); 0017 made an enqueue
-- consume the advert it sees, 0021 added alk._wake_held; since 0032 a settle
-- that frees a max_running slot wakes through alk._wake too (40_claim.sql).

-- wake-ups --------------------------------------------------------------------

-- A queue's channel is alk._channel('alk_q_', queue): 38 bytes whatever the
-- name, one per queue so a worker hears only its own. The payload is empty, so PostgreSQL folds the notifications of one
-- transaction into one; NOTIFY is delivered at commit, and a rolled-back
-- enqueue wakes nobody. Inlinable (no SET clause), like alk._channel.
--
-- Who is notified (docs/design.md, "Wake-ups"): NOTIFY serialises the
-- commits of notifying transactions on one instance-wide lock, so an enqueue
-- notifies only while a worker's advert is visible to it, and the enqueue
-- that sees it consumes it: about one NOTIFY per idle period.
-- A worker LISTENs, commits its advert (alk.wait_for_jobs), then reads the
-- transactions in progress (alk.wake_fence) and claims, and again once each
-- of them has ended. An enqueue inserts first, then in a later statement (a
-- newer snapshot) deletes every advert of the queue it can lock (FOR UPDATE
-- SKIP LOCKED: no enqueue queues behind another for an advert) and notifies
-- if it took any. An enqueue that saw adverts but could take none (each held
-- by another transaction) waits for those holders, at most 20 ms
-- (alk._wake_held): a holder that commits covers it, so it does not notify;
-- a holder that rolls back gives the advert back, which it then takes and
-- notifies; a holder still open after the wait (an app's transaction that
-- consumed the advert and goes on) makes it notify, and its session then
-- notifies at once for that holder. Once a deletion has committed, later
-- enqueues see no advert and do not notify. A notified worker's advert is
-- gone: it advertises again and takes a new fence before it waits again,
-- every time, even when its claim came back empty. No wake-up is lost, for
-- an enqueue E:
-- * E took an advert, or an advert's holder rolled back or outlasted the
--   wait: E notifies at its commit;
-- * E saw an advert held by H, and H committed: H had not ended when E's
--   statement began, so H committed after E's insert. H is an enqueue (or
--   release, snooze, requeue), which notifies at that commit; or the worker
--   itself (alk.wait_for_jobs, which takes a fence after it commits, or
--   alk.stop_waiting, after which it claims before it waits again); or
--   alk.wait_for_jobs clearing the advert of a connection that is gone.
--   In each case the worker takes a fence or claims after a moment at which
--   E was in progress: the case below;
-- * E saw none because it had not committed in E's snapshot (the worker's
--   advert, or its advertising again): E had inserted, so it was in progress
--   at that commit, hence in the fence or ended before the claim after it;
-- * E saw none because a committed enqueue had deleted it: that enqueue's
--   notification reaches the worker, who advertises again after E's
--   statement began: the case above.
-- The price: an enqueue that meets a held advert waits for its holder's
-- commit (mostly its WAL flush) instead of taking the notify lock itself.
-- Outside READ COMMITTED a statement sees the transaction's first snapshot,
-- which may predate the advert, and a locking read of a row changed since
-- would fail the enqueue: such enqueues always notify and take no advert.
CREATE FUNCTION alk._queue_channel(queue text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT alk._channel('alk_q_', $1)
$$;
COMMENT ON FUNCTION alk._queue_channel(text) IS 'internal: the NOTIFY channel of a queue (no name check)';

CREATE FUNCTION alk.queue_channel(queue text)
RETURNS text
LANGUAGE sql IMMUTABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    -- Reserved names are accepted: an outbox relay may listen to its backing
    -- queue alk:outbox:<name>; a channel name reveals nothing.
    SELECT alk._queue_channel(alk._check_name('queue', $1, true))
$$;
COMMENT ON FUNCTION alk.queue_channel(text) IS
'The LISTEN channel of a queue: ''alk_q_'' and the first 32 hex digits of sha256(queue as UTF-8), a 38-byte '
'identifier whatever the name. A worker that waits idle (alk.wait_for_jobs) is notified there at the commit of '
'the first enqueue, release, snooze or requeue of the queue that commits after the advert, or settle that frees a '
'max_running slot while a due job waits (it consumes the '
'advert: one notification per idle period; advertise again before waiting again), and by alk.resume_queue; with '
'an empty payload: on wake-up, claim. Example: SELECT alk.queue_channel(''emails''); then LISTEN "<that channel>";';

CREATE FUNCTION alk._wake_held(queue text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
-- The longest wait for a holder: a durable commit under load, well below
-- deadlock_timeout, so a cycle through a holder ends here, not in 40P01.
SET lock_timeout = '20ms'
AS $$
DECLARE
    held tid[];
    holders text[];
BEGIN
    -- Called by a wake-up step whose locking read skipped every advert of
    -- the queue: true when each holder committed (it covers the caller, see
    -- the protocol above), false when the caller must notify.
    SELECT coalesce(pg_catalog.array_agg(v.ctid), '{}'),
           coalesce(pg_catalog.array_agg(v.xmax::text) FILTER (WHERE v.xmax::text <> '0'), '{}')
      INTO held, holders
      FROM alk.idle_workers v WHERE v.queue = _wake_held.queue;
    IF cardinality(held) = 0 THEN
        RETURN true;  -- deleted by holders that committed since the skip
    END IF;
    -- A holder that outlasted this session's last wait is an open
    -- transaction: do not wait for it again.
    IF holders && pg_catalog.string_to_array(pg_catalog.current_setting('alk.wake_slow_holders', true), ',') THEN
        RETURN false;
    END IF;
    BEGIN
        -- Waits for each holder: a row that comes back was given back by a
        -- rollback (or is a new advert): take it, and the caller notifies.
        DELETE FROM alk.idle_workers w
         WHERE w.ctid = ANY (ARRAY(SELECT v.ctid FROM alk.idle_workers v
                                    WHERE v.ctid = ANY (held) AND v.queue = _wake_held.queue FOR UPDATE));
        RETURN NOT FOUND;
    EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
        PERFORM pg_catalog.set_config('alk.wake_slow_holders', pg_catalog.array_to_string(holders, ','), false);
        RETURN false;
    END;
END
$$;
COMMENT ON FUNCTION alk._wake_held(text) IS
'internal: wait (at most 20 ms) for the holders of the queue''s adverts; true when each committed, false when the '
'caller must notify (a holder rolled back or stayed open)';

CREATE FUNCTION alk._wake(queue text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- Called in a statement after the insert (see above): a fresh snapshot
    -- under READ COMMITTED. alk._enqueue and alk._enqueue_one write this
    -- check out inline (no call frame per enqueue): change all three.
    -- Consume every advert of the queue that no one else holds (SKIP LOCKED:
    -- enqueues never wait for each other here); notify if any was visible.
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM pg_catalog.pg_notify(alk._queue_channel(_wake.queue), '');
    ELSIF EXISTS (SELECT FROM alk.idle_workers w WHERE w.queue = _wake.queue) THEN
        DELETE FROM alk.idle_workers w
         WHERE w.ctid = ANY (ARRAY(SELECT v.ctid FROM alk.idle_workers v WHERE v.queue = _wake.queue
                                     FOR UPDATE SKIP LOCKED));
        -- Took one: notify. Saw only adverts others hold: their holders'
        -- commits cover us; alk._wake_held waits briefly to know they commit.
        IF FOUND OR NOT alk._wake_held(_wake.queue) THEN
            PERFORM pg_catalog.pg_notify(alk._queue_channel(_wake.queue), '');
        END IF;
    END IF;
END
$$;
COMMENT ON FUNCTION alk._wake(text) IS
'internal: consume the queue''s idle adverts and notify its channel when one is visible (always above READ COMMITTED)';

CREATE FUNCTION alk.wait_for_jobs(queue text, worker_id text)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q text := alk._name_ok('queue', wait_for_jobs.queue, true);
    wid text := alk._name_ok('worker_id', wait_for_jobs.worker_id, true);
BEGIN
    -- Adverts of connections that are gone only cost notifies; clear them
    -- here, off the hot path. Never wait on a row lock: an advert locked by
    -- an enqueue is being consumed by it (SKIP LOCKED throughout).
    DELETE FROM alk.idle_workers w
     WHERE w.ctid = ANY (ARRAY(
            SELECT v.ctid FROM alk.idle_workers v
             WHERE v.queue = q
               AND v.pid NOT IN (SELECT a.pid FROM pg_catalog.pg_stat_get_activity(NULL) a WHERE a.pid IS NOT NULL)
               FOR UPDATE SKIP LOCKED));
    UPDATE alk.idle_workers w SET pid = pg_catalog.pg_backend_pid(), since = alk.now()
     WHERE w.ctid = ANY (ARRAY(SELECT v.ctid FROM alk.idle_workers v WHERE v.queue = q AND v.worker_id = wid
                                 FOR UPDATE SKIP LOCKED));
    -- A row we could not lock is an enqueue's to delete: it notifies at its
    -- commit (the caller advertises again then), or it rolls back and the
    -- advert stays. Inserting beside it would wait for that enqueue.
    IF NOT FOUND AND NOT EXISTS (SELECT FROM alk.idle_workers v WHERE v.queue = q AND v.worker_id = wid) THEN
        INSERT INTO alk.idle_workers AS w (queue, worker_id, pid, since)
        VALUES (q, wid, pg_catalog.pg_backend_pid(), alk.now())
        ON CONFLICT ON CONSTRAINT idle_workers_pkey DO NOTHING;
    END IF;
    RETURN alk._queue_channel(q);
END
$$;
COMMENT ON FUNCTION alk.wait_for_jobs(text, text) IS
'Advertise worker_id as waiting idle on queue, so the next enqueue notifies the queue''s channel (returned) and '
'consumes the advert. The protocol: LISTEN on the channel first; call this in its own transaction; then '
'fence := alk.wake_fence(); claim; when the claim is empty, wait for a notification, and meanwhile poll '
'fence := alk.wake_fence(fence) on a short timer, claiming again whenever it shrinks (an enqueue that was in flight '
'has ended). After every notification the advert is gone: claim, and before waiting again call this again and take '
'a new fence, even when the claim was empty. Call alk.stop_waiting once busy again. '
'Example: LISTEN "alk_q_..."; SELECT alk.wait_for_jobs(''emails'', ''worker-1''); SELECT alk.wake_fence(); '
'-- claim; wait; on a notification: claim, then SELECT alk.wait_for_jobs(''emails'', ''worker-1''); again';

CREATE FUNCTION alk.wake_fence(in_progress bigint[] DEFAULT NULL)
RETURNS bigint[]
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    -- NULL: the ids of every transaction in progress now. Else: those of
    -- in_progress that have not ended, as this statement's snapshot sees it
    -- (so a claim after it sees what they committed).
    SELECT coalesce(pg_catalog.array_agg(x.id ORDER BY x.id), '{}')
      FROM (SELECT t.xid::text::bigint AS id
              FROM pg_catalog.pg_snapshot_xip(pg_catalog.pg_current_snapshot()) AS t(xid)
             WHERE $1 IS NULL
            UNION ALL
            SELECT f.id FROM pg_catalog.unnest($1) AS f(id)
             WHERE NOT pg_catalog.pg_visible_in_snapshot(f.id::text::xid8, pg_catalog.pg_current_snapshot())) x
$$;
COMMENT ON FUNCTION alk.wake_fence(bigint[]) IS
'The idle worker''s fence (see alk.wait_for_jobs): with NULL, the ids of the transactions in progress now (call it '
'after the advert committed, before the next claim); given a fence, the part of it still in progress. An empty '
'array: every enqueue that could have missed the advert has ended and a claim after this call sees its jobs. '
'Example: SELECT alk.wake_fence(); SELECT alk.wake_fence(ARRAY[1234, 1240]);';

CREATE FUNCTION alk.stop_waiting(queue text, worker_id text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q text := alk._name_ok('queue', stop_waiting.queue, true);
    wid text := alk._name_ok('worker_id', stop_waiting.worker_id, true);
BEGIN
    -- SKIP LOCKED: an advert an enqueue holds is being consumed by it; a
    -- busy worker never waits for an enqueuer's commit.
    DELETE FROM alk.idle_workers w
     WHERE w.ctid = ANY (ARRAY(SELECT v.ctid FROM alk.idle_workers v WHERE v.queue = q AND v.worker_id = wid
                                 FOR UPDATE SKIP LOCKED));
    RETURN FOUND OR EXISTS (SELECT FROM alk.idle_workers v WHERE v.queue = q AND v.worker_id = wid);
END
$$;
COMMENT ON FUNCTION alk.stop_waiting(text, text) IS
'Withdraw the idle advert of alk.wait_for_jobs (an enqueue that consumed it has already): enqueues stop notifying '
'for this worker. Never waits for an enqueue. True if it was advertised. '
'A busy system has no adverts, so its enqueues never notify. Example: SELECT alk.stop_waiting(''emails'', ''worker-1'');';
