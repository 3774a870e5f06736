-- pyalk queue, enqueue (docs/contract.md#queue): the one insert path behind
-- every enqueue form, and alk.enqueue / alk.enqueue_batch.
--
-- After wake-ups (the function bodies' "wake-ups section above" is
-- 20_wake.sql); the outbox and the scheduler call alk._enqueue too. Landed in
-- 0002_queue.sql; changed by 0009 (dedup keys, alk._enqueue_one), 0017, 0021,
-- 0026 (headers), 0028 (after: 35_after.sql), 0029 (serial groups' group keys).

-- enqueue -------------------------------------------------------------------

-- A batch's group keys: one per payload, each NULL (no group) or a name
-- (LK001 otherwise, as a single enqueue's group_key).
CREATE FUNCTION alk._check_group_keys(group_keys text[], payloads bigint)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF cardinality(group_keys) <> payloads THEN
        PERFORM alk._raise('LK002', 'group_keys must have one entry per payload: got ' || coalesce(payloads, 0)
            || ' payloads and ' || cardinality(group_keys) || ' group_keys');
    END IF;
    PERFORM alk._name_ok('group_key', k, true) FROM unnest(group_keys) AS g(k) WHERE k IS NOT NULL;
END
$$;
COMMENT ON FUNCTION alk._check_group_keys(text[], bigint) IS
'internal: LK002 unless group_keys has one entry per payload, LK001 unless each is NULL or a valid name';

-- The one implementation behind every enqueue form (plain, batch, outbox,
-- scheduler): resolves the ready time, expiry and stamps against one clock
-- reading, inserts, and notifies the queue's channel. The caller has validated the queue name; stamp
-- defaults come from the caller so the outbox can resolve its own set.
CREATE FUNCTION alk._enqueue(
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
    default_backoff_base_s bigint,
    headers jsonb DEFAULT NULL,
    group_keys text[] DEFAULT NULL
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
    IF headers IS NOT NULL AND pg_catalog.jsonb_typeof(headers) <> 'object' THEN
        PERFORM alk._check_headers(headers);
    END IF;
    IF group_keys IS NOT NULL THEN
        PERFORM alk._check_group_keys(group_keys, cardinality(payloads));
    END IF;
    IF cardinality(payloads) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH inserted AS (
        INSERT INTO alk.jobs (queue, payload, priority, run_at, max_attempts, created_at, expires_at,
                              visibility_timeout_s, backoff_base_s, dead_letter_retention_s, headers, group_key,
                              slot)
        SELECT queue, p.payload, coalesce(priority, 0), v_run_at, coalesce(max_attempts, default_max_attempts),
               clock, alk._sat_add(clock, expires), coalesce(visibility_timeout_s, default_visibility_timeout_s),
               coalesce(backoff_base_s, default_backoff_base_s), dead_letter_retention_s, headers,
               group_keys[p.ord],
               -- Once per statement (an InitPlan), not the column default's once per row.
               (SELECT s.current_slot FROM alk.job_slots s)
        FROM unnest(payloads) WITH ORDINALITY AS p(payload, ord)
        ORDER BY p.ord
        RETURNING alk.jobs.id
    )
    -- Identity values are drawn in insertion order, so id order is input order.
    SELECT inserted.id FROM inserted ORDER BY inserted.id;
    -- Serial groups: each group enqueued into is parked at commit
    -- (38_group_turns.sql).
    IF group_keys IS NOT NULL THEN
        INSERT INTO alk.group_arrivals (queue, group_key)
        SELECT DISTINCT _enqueue.queue, k FROM unnest(group_keys) AS g(k) WHERE k IS NOT NULL;
    END IF;
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
COMMENT ON FUNCTION alk._enqueue(text, jsonb[], bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, jsonb, text[]) IS
'internal: insert jobs with resolved stamps and wake idle workers; the batch forms and the scheduler call it';

-- One job, optionally deduplicated: every single-job enqueue form calls it
-- with resolved stamps and a validated queue name.
CREATE FUNCTION alk._enqueue_one(
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
    p_dedup_key text,
    p_headers jsonb DEFAULT NULL,
    p_group_key text DEFAULT NULL,
    -- alk.enqueue's after (35_after.sql); NULL: waits for nothing.
    p_after bigint[] DEFAULT NULL
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
    IF p_headers IS NOT NULL AND pg_catalog.jsonb_typeof(p_headers) <> 'object' THEN
        PERFORM alk._check_headers(p_headers);
    END IF;
    IF p_group_key IS NOT NULL THEN
        PERFORM alk._name_ok('group_key', p_group_key, true);
    END IF;
    IF p_after IS NOT NULL THEN
        PERFORM alk._after_check(p_queue, p_after);
    END IF;
    IF p_dedup_key IS NULL THEN
        INSERT INTO alk.jobs (queue, payload, priority, run_at, max_attempts, created_at, expires_at,
                              visibility_timeout_s, backoff_base_s, dead_letter_retention_s, headers, group_key,
                              slot)
        VALUES (p_queue, p_payload, p_priority,
                CASE WHEN p_delay IS NOT NULL THEN alk._sat_add(p_clock, p_delay)
                     WHEN p_run_at IS NOT NULL THEN p_run_at ELSE p_clock END,
                p_max_attempts, p_clock, alk._sat_add(p_clock, p_expires),
                p_visibility_timeout_s, p_backoff_base_s, p_dead_letter_retention_s, p_headers, p_group_key,
                (SELECT s.current_slot FROM alk.job_slots s))
        RETURNING alk.jobs.id INTO v_id;
    ELSE
        PERFORM alk._name_ok('dedup_key', p_dedup_key, true);
        -- No rotation while this transaction lasts, so the key's live holder
        -- is in the slot we insert into (see jobs_dedup).
        PERFORM pg_catalog.pg_advisory_xact_lock_shared(alk._rotation_lock());
        LOOP
            -- The unique index decides: a concurrent enqueue of the same key
            -- waits for ours (or we for it) and then does nothing.
            INSERT INTO alk.jobs (queue, payload, priority, run_at, max_attempts, created_at, expires_at,
                                  visibility_timeout_s, backoff_base_s, dead_letter_retention_s, dedup_key,
                                  headers, group_key, slot)
            VALUES (p_queue, p_payload, p_priority,
                    CASE WHEN p_delay IS NOT NULL THEN alk._sat_add(p_clock, p_delay)
                         WHEN p_run_at IS NOT NULL THEN p_run_at ELSE p_clock END,
                    p_max_attempts, p_clock, alk._sat_add(p_clock, p_expires),
                    p_visibility_timeout_s, p_backoff_base_s, p_dead_letter_retention_s, p_dedup_key, p_headers,
                    p_group_key, (SELECT s.current_slot FROM alk.job_slots s))
            ON CONFLICT (queue, dedup_key, slot) WHERE dedup_key IS NOT NULL AND state IN ('pending', 'processing')
            DO NOTHING
            RETURNING alk.jobs.id INTO v_id;
            EXIT WHEN v_id IS NOT NULL;
            -- Held: return the holder's id and write nothing (no wake-up
            -- either). Should the holder have gone since, insert again.
            SELECT j.id INTO v_id FROM alk.jobs j
             WHERE j.slot <> 2 AND j.queue = p_queue AND j.dedup_key = p_dedup_key AND j.state IN ('pending', 'processing');
            IF v_id IS NOT NULL THEN
                RETURN v_id;
            END IF;
        END LOOP;
    END IF;
    -- A new job only (a dedup hit returned above, its holder unchanged).
    IF p_after IS NOT NULL THEN
        PERFORM alk._after_link(p_queue, ARRAY[v_id], p_after);
    END IF;
    -- Its serial group is parked at commit (38_group_turns.sql).
    IF p_group_key IS NOT NULL THEN
        INSERT INTO alk.group_arrivals (queue, group_key) VALUES (p_queue, p_group_key);
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
COMMENT ON FUNCTION alk._enqueue_one(text, jsonb, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, text, jsonb, text, bigint[]) IS
'internal: insert one job with resolved stamps (or return the live holder of its dedup key) and wake idle workers';

CREATE FUNCTION alk.enqueue(
    queue text,
    payload jsonb,
    delay bigint DEFAULT NULL,
    run_at bigint DEFAULT NULL,
    priority bigint DEFAULT 0,
    max_attempts bigint DEFAULT 3,
    expires bigint DEFAULT NULL,
    visibility_timeout_s bigint DEFAULT 300,
    backoff_base_s bigint DEFAULT 5,
    dead_letter_retention_s bigint DEFAULT NULL,
    dedup_key text DEFAULT NULL,
    headers jsonb DEFAULT NULL,
    group_key text DEFAULT NULL,
    after bigint[] DEFAULT NULL
)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT alk._enqueue_one(alk._name_ok('queue', $1, false), $2, alk.now(), $3, $4, coalesce($5, 0),
                            coalesce($6, 3), $7, coalesce($8, 300), coalesce($9, 5), $10, $11, $12, $13, $14)
$$;
COMMENT ON FUNCTION alk.enqueue(text, jsonb, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, text, jsonb, text, bigint[]) IS
'Enqueue one job; returns its id. Ready time: delay (seconds from now) wins over run_at (absolute unix seconds); '
'neither means now. expires is a TTL in seconds from now. Stamps default to 300 s visibility, 3 attempts, 5 s backoff base, '
'dead rows kept forever. dedup_key: while a live (pending or processing) job of this queue holds the key, nothing is '
'written and that job''s id is returned; NULL: no dedup. headers: a JSON object that travels with the job (trace '
'context, correlation ids; get_job and claim return it), or NULL; anything else is LK002. group_key: the job''s serial '
'group: jobs of this queue with one key run at most max_running_per_group at a time (alk.set_queue_limits; default 1, '
'one after another in claim order); NULL: no group; checked as a name (LK001). '
'after: ids of jobs of this queue; the job stays pending but is not claimed until none of them exists any more '
'(acked, cancelled or purged) or is completed; ids that no longer exist count as done; an id of another queue or a '
'NULL entry is LK002. When a listed job dies the job dies too (last_error ''after job <id> died''), and '
'requeue_dead of that job brings it back, waiting again. A dedup hit ignores after. '
'Example: SELECT alk.enqueue(queue => ''emails'', payload => ''{"to": 1}'', delay => 30, dedup_key => ''welcome:1''); '
'SELECT alk.enqueue(''emails'', ''{"step": 2}'', after => ARRAY[41]);';

CREATE FUNCTION alk.enqueue_batch(
    queue text,
    payloads jsonb[],
    delay bigint DEFAULT NULL,
    run_at bigint DEFAULT NULL,
    priority bigint DEFAULT 0,
    max_attempts bigint DEFAULT 3,
    expires bigint DEFAULT NULL,
    visibility_timeout_s bigint DEFAULT 300,
    backoff_base_s bigint DEFAULT 5,
    dead_letter_retention_s bigint DEFAULT NULL,
    dedup_keys text[] DEFAULT NULL,
    headers jsonb DEFAULT NULL,
    group_keys text[] DEFAULT NULL,
    after bigint[] DEFAULT NULL
)
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock bigint := alk.now();
    q text := alk._name_ok('queue', enqueue_batch.queue, false);
    ids bigint[];
BEGIN
    IF dedup_keys IS NULL AND enqueue_batch.after IS NOT NULL THEN
        -- One after list for the whole batch: every job waits for all of it.
        PERFORM alk._after_check(q, enqueue_batch.after);
        ids := ARRAY(SELECT * FROM alk._enqueue(q, payloads, clock,
            delay, enqueue_batch.run_at, enqueue_batch.priority, enqueue_batch.max_attempts,
            expires, enqueue_batch.visibility_timeout_s, enqueue_batch.backoff_base_s,
            enqueue_batch.dead_letter_retention_s, 300, 3, 5, enqueue_batch.headers, enqueue_batch.group_keys));
        PERFORM alk._after_link(q, ids, enqueue_batch.after);
        RETURN QUERY SELECT * FROM unnest(ids);
        RETURN;
    END IF;
    IF dedup_keys IS NULL THEN
        RETURN QUERY SELECT * FROM alk._enqueue(q, payloads, clock,
            delay, enqueue_batch.run_at, enqueue_batch.priority, enqueue_batch.max_attempts,
            expires, enqueue_batch.visibility_timeout_s, enqueue_batch.backoff_base_s,
            enqueue_batch.dead_letter_retention_s, 300, 3, 5, enqueue_batch.headers, enqueue_batch.group_keys);
        RETURN;
    END IF;
    PERFORM alk._check_payloads(payloads);
    IF cardinality(dedup_keys) <> cardinality(payloads) THEN
        PERFORM alk._raise('LK002', 'dedup_keys must have one entry per payload: got ' || cardinality(payloads)
            || ' payloads and ' || cardinality(dedup_keys) || ' dedup_keys');
    END IF;
    IF group_keys IS NOT NULL THEN
        PERFORM alk._check_group_keys(group_keys, cardinality(payloads));
    END IF;
    -- One at a time, in input order: a key repeated within the batch is
    -- held by its first occurrence, whose id the later ones return.
    FOR i IN 1 .. cardinality(payloads) LOOP
        RETURN NEXT alk._enqueue_one(q, payloads[i], clock, delay, enqueue_batch.run_at,
            coalesce(enqueue_batch.priority, 0), coalesce(enqueue_batch.max_attempts, 3), expires,
            coalesce(enqueue_batch.visibility_timeout_s, 300), coalesce(enqueue_batch.backoff_base_s, 5),
            enqueue_batch.dead_letter_retention_s, dedup_keys[i], enqueue_batch.headers, group_keys[i],
            enqueue_batch.after);
    END LOOP;
END
$$;
COMMENT ON FUNCTION alk.enqueue_batch(text, jsonb[], bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, text[], jsonb, text[], bigint[]) IS
'Enqueue several jobs in one call with the same options; returns their ids in input order. dedup_keys, when given, '
'holds one key (or NULL) per payload, with alk.enqueue''s rule: a key held by a live job, or by an earlier payload of '
'the same batch, writes nothing and returns the holder''s id. headers, like every other option, is one value for '
'the whole batch (a JSON object or NULL, else LK002): the trace context of the call that enqueued it. group_keys, when '
'given, holds one serial group key (or NULL) per payload, as alk.enqueue''s group_key; another length is LK002. '
'after is one list for the whole batch: every job of it waits for all of them (alk.enqueue''s rule). '
'Example: SELECT * FROM alk.enqueue_batch(''emails'', ARRAY[''{"to": 1}'', ''{"to": 2}'']::jsonb[], priority => 5);';
