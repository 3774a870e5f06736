-- pyalk 0021: wake_held. An enqueue that sees idle adverts but can lock none (each held by another enqueue) waits up to 20 ms for the holders (alk._wake_held) instead of notifying: a holder that commits covers it; one that rolls back gives the advert back, taken and notified; one still open makes it notify (the notify lock serialised nearly every durable enqueue while a worker was idle).

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
        -- Took one: notify. Saw only adverts others hold: their holders'
        -- commits cover us; alk._wake_held waits briefly to know they commit.
        IF FOUND OR NOT alk._wake_held(_enqueue.queue) THEN
            PERFORM pg_catalog.pg_notify(alk._queue_channel(_enqueue.queue), '');
        END IF;
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
        -- Took one: notify. Saw only adverts others hold: their holders'
        -- commits cover us; alk._wake_held waits briefly to know they commit.
        IF FOUND OR NOT alk._wake_held(p_queue) THEN
            PERFORM pg_catalog.pg_notify(alk._queue_channel(p_queue), '');
        END IF;
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

-- alk._wake_held(text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._wake_held(queue text)
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

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
