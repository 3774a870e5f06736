-- pyalk 0017: an idle advert is consumed by the enqueue that sees it (SKIP LOCKED; the enqueue notifies whenever an advert is visible to it): about one NOTIFY per idle period; the woken worker advertises again.

-- alk._enqueue(text,jsonb[],bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._enqueue(
    queue text,
    payloads jsonb[],
    clock bigint,
    delay bigint,
    run_at bigint,
    priority bigint,
    max_attempts bigint,
    expires bigint,
    visibility_timeout_s bigint,
    backoff_base_s bigint,
    dead_letter_retention_s bigint,
    default_visibility_timeout_s bigint,
    default_max_attempts bigint,
    default_backoff_base_s bigint
)
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    -- delay wins over run_at; neither means "now".
    v_run_at bigint := CASE
        WHEN delay IS NOT NULL THEN alk._sat_add(clock, delay)
        WHEN run_at IS NOT NULL THEN run_at
        ELSE clock END;
BEGIN
    -- alk._check_payloads raises; call it only when the cheap test fails.
    IF payloads IS NULL OR pg_catalog.array_position(payloads, NULL) IS NOT NULL THEN
        PERFORM alk._check_payloads(payloads);
    END IF;
    IF cardinality(payloads) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH inserted AS (
        INSERT INTO alk.jobs (queue, payload, priority, run_at, max_attempts, created_at, expires_at,
                              visibility_timeout_s, backoff_base_s, dead_letter_retention_s)
        SELECT queue, p.payload, coalesce(priority, 0), v_run_at, coalesce(max_attempts, default_max_attempts),
               clock, alk._sat_add(clock, expires), coalesce(visibility_timeout_s, default_visibility_timeout_s),
               coalesce(backoff_base_s, default_backoff_base_s), dead_letter_retention_s
        FROM unnest(payloads) WITH ORDINALITY AS p(payload, ord)
        ORDER BY p.ord
        RETURNING alk.jobs.id
    )
    -- Identity values are drawn in insertion order, so id order is input order.
    SELECT inserted.id FROM inserted ORDER BY inserted.id;
    -- alk._wake's check, written out here: the hot path pays no call frame
    -- for it (the protocol in the wake-ups section above). A later statement
    -- than the insert: a fresh snapshot under READ COMMITTED. The EXISTS
    -- keeps a busy queue (no adverts) to one index probe, no lock.
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM pg_catalog.pg_notify(alk._queue_channel(_enqueue.queue), '');
    ELSIF EXISTS (SELECT FROM alk.idle_workers w WHERE w.queue = _enqueue.queue) THEN
        DELETE FROM alk.idle_workers w
         WHERE w.ctid = ANY (ARRAY(SELECT v.ctid FROM alk.idle_workers v WHERE v.queue = _enqueue.queue
                                     FOR UPDATE SKIP LOCKED));
        -- Notify even when another enqueue held the advert: it may roll back
        -- or stay open, and only our own notification is certain.
        PERFORM pg_catalog.pg_notify(alk._queue_channel(_enqueue.queue), '');
    END IF;
END
$$;
COMMENT ON FUNCTION alk._enqueue(text, jsonb[], bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint) IS
'internal: insert jobs with resolved stamps and wake idle workers; the batch forms and the scheduler call it';

-- alk._enqueue_one(text,jsonb,bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._enqueue_one(
    p_queue text,
    p_payload jsonb,
    p_clock bigint,
    p_delay bigint,
    p_run_at bigint,
    p_priority bigint,
    p_max_attempts bigint,
    p_expires bigint,
    p_visibility_timeout_s bigint,
    p_backoff_base_s bigint,
    p_dead_letter_retention_s bigint,
    p_dedup_key text
)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
BEGIN
    IF p_payload IS NULL THEN
        PERFORM alk._check_payloads(ARRAY[p_payload]);
    END IF;
    IF p_dedup_key IS NULL THEN
        INSERT INTO alk.jobs (queue, payload, priority, run_at, max_attempts, created_at, expires_at,
                              visibility_timeout_s, backoff_base_s, dead_letter_retention_s)
        VALUES (p_queue, p_payload, p_priority,
                CASE WHEN p_delay IS NOT NULL THEN alk._sat_add(p_clock, p_delay)
                     WHEN p_run_at IS NOT NULL THEN p_run_at ELSE p_clock END,
                p_max_attempts, p_clock, alk._sat_add(p_clock, p_expires),
                p_visibility_timeout_s, p_backoff_base_s, p_dead_letter_retention_s)
        RETURNING alk.jobs.id INTO v_id;
    ELSE
        PERFORM alk._name_ok('dedup_key', p_dedup_key, true);
        LOOP
            -- The unique index decides: a concurrent enqueue of the same key
            -- waits for ours (or we for it) and then does nothing.
            INSERT INTO alk.jobs (queue, payload, priority, run_at, max_attempts, created_at, expires_at,
                                  visibility_timeout_s, backoff_base_s, dead_letter_retention_s, dedup_key)
            VALUES (p_queue, p_payload, p_priority,
                    CASE WHEN p_delay IS NOT NULL THEN alk._sat_add(p_clock, p_delay)
                         WHEN p_run_at IS NOT NULL THEN p_run_at ELSE p_clock END,
                    p_max_attempts, p_clock, alk._sat_add(p_clock, p_expires),
                    p_visibility_timeout_s, p_backoff_base_s, p_dead_letter_retention_s, p_dedup_key)
            ON CONFLICT (queue, dedup_key) WHERE dedup_key IS NOT NULL AND state <> 'dead' DO NOTHING
            RETURNING alk.jobs.id INTO v_id;
            EXIT WHEN v_id IS NOT NULL;
            -- Held: return the holder's id and write nothing (no wake-up
            -- either). Should the holder have gone since, insert again.
            SELECT j.id INTO v_id FROM alk.jobs j
             WHERE j.queue = p_queue AND j.dedup_key = p_dedup_key AND j.state <> 'dead';
            IF v_id IS NOT NULL THEN
                RETURN v_id;
            END IF;
        END LOOP;
    END IF;
    -- alk._wake's check, written out here: the hot path pays no call frame
    -- for it (the protocol in the wake-ups section above). A later statement
    -- than the insert: a fresh snapshot under READ COMMITTED. The EXISTS
    -- keeps a busy queue (no adverts) to one index probe, no lock.
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM pg_catalog.pg_notify(alk._queue_channel(p_queue), '');
    ELSIF EXISTS (SELECT FROM alk.idle_workers w WHERE w.queue = p_queue) THEN
        DELETE FROM alk.idle_workers w
         WHERE w.ctid = ANY (ARRAY(SELECT v.ctid FROM alk.idle_workers v WHERE v.queue = p_queue
                                     FOR UPDATE SKIP LOCKED));
        -- Notify even when another enqueue held the advert: it may roll back
        -- or stay open, and only our own notification is certain.
        PERFORM pg_catalog.pg_notify(alk._queue_channel(p_queue), '');
    END IF;
    RETURN v_id;
END
$$;
COMMENT ON FUNCTION alk._enqueue_one(text, jsonb, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, text) IS
'internal: insert one job with resolved stamps (or return the live holder of its dedup key) and wake idle workers';

-- alk._wake(text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._wake(queue text)
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
        -- Notify even when another enqueue held the advert: it may roll back
        -- or stay open, and only our own notification is certain.
        PERFORM pg_catalog.pg_notify(alk._queue_channel(_wake.queue), '');
    END IF;
END
$$;
COMMENT ON FUNCTION alk._wake(text) IS
'internal: consume the queue''s idle adverts and notify its channel when one is visible (always above READ COMMITTED)';

-- alk.queue_channel(text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.queue_channel(queue text)
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
'the first enqueue, release or requeue of the queue that commits after the advert (it consumes the advert: one '
'notification per idle period; advertise again before waiting again), and by alk.resume_queue; with an empty '
'payload: on wake-up, claim. Example: SELECT alk.queue_channel(''emails''); then LISTEN "<that channel>";';

-- alk.stop_waiting(text,text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.stop_waiting(queue text, worker_id text)
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

-- alk.wait_for_jobs(text,text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.wait_for_jobs(queue text, worker_id text)
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

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
