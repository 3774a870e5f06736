-- pyalk 0032: group_turns (issue 26). A claim no longer walks past the jobs of busy serial groups: a pending
-- job that is not one of its group's turns (when the group has room, the first max_running_per_group - running
-- jobs of each of its priorities by run_at; none when full) is parked, after_left = -1, out of jobs_claim_pending.
-- alk._group_turns unparks a group's turns after a job of it leaves processing or pending (called by ack,
-- ack_batch, settle and cancel; a trigger on the updates that retry, snooze, release, complete or bury);
-- alk._group_park parks at the commit of a transaction that enqueued into a group (alk.group_arrivals, written by
-- the enqueues) or returned a grouped job to pending (deferred triggers). An advisory lock per group orders the
-- two (the rule and its proof are in sql/queue/38_group_turns.sql). Jobs without a group meet no new trigger on
-- insert or delete. queue_stats counts parked jobs as ready or scheduled by run_at, as before;
-- jobs_after_waiting becomes jobs_waiting (after jobs and parked). The claim rule (alk._group_has_room) is
-- unchanged. Jobs already pending stay unparked until their group's next event.

-- hand-written: the waiting index holds parked jobs too, by kind; parked jobs by group for the turns.
DROP INDEX alk.jobs_after_waiting;
CREATE INDEX jobs_waiting ON alk.jobs (queue, after_left, run_at) WHERE state = 'pending' AND after_left <> 0;
CREATE INDEX jobs_group_parked ON alk.jobs (queue, group_key, priority DESC, run_at, id)
    WHERE state = 'pending' AND after_left = -1;

-- hand-written: the arrivals table (as sql/queue/38_group_turns.sql has it).
-- The groups a transaction enqueued into, one row per enqueue (per group
-- for a batch), each handed to alk._group_park at its commit by a deferred
-- trigger, which deletes it: rows live only inside their transaction. A
-- side table rather than a trigger on the insert of every job, which would
-- cost each job without a group its WHEN test and after-trigger setup.
CREATE TABLE alk.group_arrivals (
    id bigint GENERATED ALWAYS AS IDENTITY,
    queue text NOT NULL,
    group_key text NOT NULL,
    CONSTRAINT group_arrivals_pkey PRIMARY KEY (id)
);
COMMENT ON TABLE alk.group_arrivals IS
'Serial groups enqueued into by open transactions, parked at their commit. Private: written by the enqueues.';

-- alk._enqueue(text,jsonb[],bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,jsonb,text[]): changed or new in the current files
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

-- alk._enqueue_one(text,jsonb,bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,text,jsonb,text,bigint[]): changed or new in the current files
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
             WHERE j.queue = p_queue AND j.dedup_key = p_dedup_key AND j.state IN ('pending', 'processing');
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

-- alk._estimate_jobs(text,text,bigint): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._estimate_jobs(queue text, kind text, clock bigint)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    plan json;
BEGIN
    -- The planner's row estimate for one queue's entries of one kind: what
    -- its statistics (ANALYZE, autovacuum) and the table's current size
    -- say, read without visiting the entries. The query texts are fixed;
    -- the queue and the clock are bound as parameters.
    CASE kind
    WHEN 'ready' THEN
        EXECUTE 'EXPLAIN (FORMAT JSON) SELECT FROM alk.jobs j '
                'WHERE j.queue = $1 AND j.state = ''pending'' AND j.after_left = 0 AND j.run_at <= $2'
           INTO plan USING queue, clock;
    WHEN 'scheduled' THEN
        EXECUTE 'EXPLAIN (FORMAT JSON) SELECT FROM alk.jobs j '
                'WHERE j.queue = $1 AND j.state = ''pending'' AND j.after_left = 0 AND j.run_at > $2'
           INTO plan USING queue, clock;
    WHEN 'waiting' THEN
        EXECUTE 'EXPLAIN (FORMAT JSON) SELECT FROM alk.jobs j '
                'WHERE j.queue = $1 AND j.state = ''pending'' AND j.after_left > 0' INTO plan USING queue;
    WHEN 'parked ready' THEN
        EXECUTE 'EXPLAIN (FORMAT JSON) SELECT FROM alk.jobs j '
                'WHERE j.queue = $1 AND j.state = ''pending'' AND j.after_left = -1 AND j.run_at <= $2'
           INTO plan USING queue, clock;
    WHEN 'parked scheduled' THEN
        EXECUTE 'EXPLAIN (FORMAT JSON) SELECT FROM alk.jobs j '
                'WHERE j.queue = $1 AND j.state = ''pending'' AND j.after_left = -1 AND j.run_at > $2'
           INTO plan USING queue, clock;
    WHEN 'processing' THEN
        EXECUTE 'EXPLAIN (FORMAT JSON) SELECT FROM alk.jobs j '
                'WHERE j.queue = $1 AND j.state = ''processing''' INTO plan USING queue;
    WHEN 'lapsed' THEN
        EXECUTE 'EXPLAIN (FORMAT JSON) SELECT FROM alk.jobs j '
                'WHERE j.queue = $1 AND j.state = ''processing'' AND j.claim_expires_at < $2'
           INTO plan USING queue, clock;
    WHEN 'dead' THEN
        EXECUTE 'EXPLAIN (FORMAT JSON) SELECT FROM alk.jobs j '
                'WHERE j.queue = $1 AND j.state = ''dead''' INTO plan USING queue;
    WHEN 'completed' THEN
        EXECUTE 'EXPLAIN (FORMAT JSON) SELECT FROM alk.jobs j '
                'WHERE j.queue = $1 AND j.state = ''completed''' INTO plan USING queue;
    END CASE;
    RETURN round((plan -> 0 -> 'Plan' ->> 'Plan Rows')::numeric)::bigint;
END
$$;
COMMENT ON FUNCTION alk._estimate_jobs(text, text, bigint) IS
'internal: the planner''s estimate of how many of a queue''s jobs are ready, scheduled, waiting (on after jobs), '
'parked ready or parked scheduled (serial groups), '
'processing, lapsed, dead or completed '
'(alk.queue_stats past its exact_limit)';

-- alk._group_arrived(): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._group_arrived()
RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM alk._group_park(NEW.queue, NEW.group_key);
    DELETE FROM alk.group_arrivals a WHERE a.id = NEW.id;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION alk._group_arrived() IS
'internal: trigger, at commit: park a group enqueued into (alk._group_park) and forget its arrival row';

-- alk._group_heal(text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._group_heal(queue text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM alk._group_turns(array_agg(_group_heal.queue), array_agg(g.group_key))
       FROM (WITH RECURSIVE keys(group_key) AS (
                 (SELECT j.group_key FROM alk.jobs j
                   WHERE j.queue = _group_heal.queue AND j.state = 'pending' AND j.after_left = -1
                   ORDER BY j.group_key LIMIT 1)
                 UNION ALL
                 SELECT (SELECT j.group_key FROM alk.jobs j
                          WHERE j.queue = _group_heal.queue AND j.state = 'pending' AND j.after_left = -1
                            AND j.group_key > k.group_key ORDER BY j.group_key LIMIT 1)
                   FROM keys k WHERE k.group_key IS NOT NULL)
             SELECT k.group_key FROM keys k WHERE k.group_key IS NOT NULL) g
     HAVING count(*) > 0;
END
$$;
COMMENT ON FUNCTION alk._group_heal(text) IS 'internal: unpark the turns of every serial group of a queue with a parked job';

-- alk._group_left(): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._group_left()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM alk._group_turns(ARRAY[OLD.queue], ARRAY[OLD.group_key]);
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION alk._group_left() IS
'internal: trigger: unpark the turns of the group of a job that left processing or pending';

-- alk._group_lock(text,text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._group_lock(queue text, group_key text)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.hashtext($1 || E'\x1f' || $2)
$$;
COMMENT ON FUNCTION alk._group_lock(text, text) IS
'internal: the second key of a serial group''s advisory lock (the first is 1634495335, ''alkg'')';

-- alk._group_park(text,text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._group_park(queue text, group_key text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_variable
DECLARE
    room bigint;
    turns bigint[] := '{}';
    park bigint[];
    unpark bigint[];
BEGIN
    -- Above READ COMMITTED the reads below would not be fresh: park nothing.
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed'
       OR NOT pg_catalog.pg_try_advisory_xact_lock(1634495335, alk._group_lock(queue, group_key)) THEN
        RETURN;
    END IF;
    room := alk._group_room(queue, group_key);
    IF room > 0 THEN
        -- No parked job and no more pending ones than the room: all are
        -- turns (a group's first job, the usual case). Else compute them.
        IF NOT EXISTS (SELECT FROM alk.jobs j WHERE j.queue = queue AND j.group_key = group_key
                                                AND j.state = 'pending' AND j.after_left = -1)
           AND (SELECT count(*) FROM (SELECT FROM alk.jobs j
                                       WHERE j.queue = queue AND j.group_key = group_key
                                         AND j.state = 'pending' AND j.after_left = 0 LIMIT room + 1) c) <= room THEN
            RETURN;
        END IF;
        turns := alk._group_turn_ids(queue, group_key, room);
        SELECT array_agg(t.id) INTO unpark
          FROM (SELECT k.id FROM alk.jobs k
                 WHERE k.id = ANY (turns) AND k.queue = queue AND k.state = 'pending' AND k.after_left = -1
                   FOR NO KEY UPDATE SKIP LOCKED) t;
        IF unpark IS NOT NULL THEN
            UPDATE alk.jobs j SET after_left = 0 WHERE j.id = ANY (unpark) AND j.queue = queue;
        END IF;
    END IF;
    SELECT array_agg(t.id) INTO park
      FROM (SELECT k.id FROM alk.jobs k
             WHERE k.queue = queue AND k.group_key = group_key AND k.state = 'pending' AND k.after_left = 0
               AND k.id <> ALL (turns)
               FOR NO KEY UPDATE SKIP LOCKED) t;
    IF park IS NOT NULL THEN
        UPDATE alk.jobs j SET after_left = -1 WHERE j.id = ANY (park) AND j.queue = queue;
    END IF;
END
$$;
COMMENT ON FUNCTION alk._group_park(text, text) IS
'internal: park the pending jobs of a serial group that are not its turns, unpark those that are (at commit)';

-- alk._group_returned(): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._group_returned()
RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM alk._group_park(NEW.queue, NEW.group_key);
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION alk._group_returned() IS
'internal: trigger, at commit: park the group of a job pending again or done waiting (alk._group_park)';

-- alk._group_room(text,text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._group_room(queue text, group_key text)
RETURNS bigint
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT s.share - (SELECT count(*) FROM (SELECT FROM alk.jobs k
                                             WHERE k.queue = $1 AND k.group_key = $2 AND k.state = 'processing'
                                             LIMIT s.share) r)
      FROM (SELECT coalesce((SELECT l.max_running_per_group FROM alk.limited_queues l WHERE l.queue = $1), 1)
                   AS share) s
$$;
COMMENT ON FUNCTION alk._group_room(text, text) IS
'internal: how many more jobs of a serial group may run now (max_running_per_group, default 1, less its processing)';

-- alk._group_turn_ids(text,text,bigint): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._group_turn_ids(queue text, group_key text, room bigint)
RETURNS bigint[]
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    WITH RECURSIVE unparked(priority) AS (
        (SELECT j.priority FROM alk.jobs j
          WHERE j.queue = $1 AND j.group_key = $2 AND j.state = 'pending' AND j.after_left = 0
          ORDER BY j.priority DESC LIMIT 1)
        UNION ALL
        SELECT (SELECT j.priority FROM alk.jobs j
                 WHERE j.queue = $1 AND j.group_key = $2 AND j.state = 'pending' AND j.after_left = 0
                   AND j.priority < u.priority ORDER BY j.priority DESC LIMIT 1)
          FROM unparked u WHERE u.priority IS NOT NULL
    ), parked(priority) AS (
        (SELECT j.priority FROM alk.jobs j
          WHERE j.queue = $1 AND j.group_key = $2 AND j.state = 'pending' AND j.after_left = -1
          ORDER BY j.priority DESC LIMIT 1)
        UNION ALL
        SELECT (SELECT j.priority FROM alk.jobs j
                 WHERE j.queue = $1 AND j.group_key = $2 AND j.state = 'pending' AND j.after_left = -1
                   AND j.priority < p.priority ORDER BY j.priority DESC LIMIT 1)
          FROM parked p WHERE p.priority IS NOT NULL
    ), levels AS (
        SELECT u.priority FROM unparked u WHERE u.priority IS NOT NULL
        UNION
        SELECT p.priority FROM parked p WHERE p.priority IS NOT NULL
    )
    SELECT coalesce(array_agg(t.id), '{}')
      FROM levels l
     CROSS JOIN LATERAL (
        SELECT c.id FROM (
            (SELECT j.id, j.run_at FROM alk.jobs j
              WHERE j.queue = $1 AND j.group_key = $2 AND j.state = 'pending' AND j.after_left = 0
                AND j.priority = l.priority ORDER BY j.run_at, j.id LIMIT $3)
            UNION ALL
            (SELECT j.id, j.run_at FROM alk.jobs j
              WHERE j.queue = $1 AND j.group_key = $2 AND j.state = 'pending' AND j.after_left = -1
                AND j.priority = l.priority ORDER BY j.run_at, j.id LIMIT $3)) c
         ORDER BY c.run_at, c.id LIMIT $3) t
$$;
COMMENT ON FUNCTION alk._group_turn_ids(text, text, bigint) IS
'internal: a serial group''s turns for a room of `room` jobs: per priority, the first `room` pending jobs by run_at, id';

-- alk._group_turns(text[],text[]): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._group_turns(queues text[], group_keys text[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
-- One plan per statement: a custom plan of a statement on the partitioned
-- table costs more to plan than to run.
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    q text;
    g text;
    room bigint;
    turns bigint[];
    ids bigint[];
BEGIN
    FOR q, g IN SELECT DISTINCT u.q, u.k FROM unnest(queues, group_keys) AS u(q, k)
                 WHERE u.k IS NOT NULL ORDER BY u.q, u.k LOOP
        PERFORM pg_catalog.pg_advisory_xact_lock_shared(1634495335, alk._group_lock(q, g));
        CONTINUE WHEN NOT EXISTS (SELECT FROM alk.jobs j WHERE j.queue = q AND j.group_key = g
                                                          AND j.state = 'pending' AND j.after_left = -1);
        room := alk._group_room(q, g);
        CONTINUE WHEN room <= 0;
        turns := alk._group_turn_ids(q, g, room);
        -- SKIP LOCKED: a parked row is locked only by another settle
        -- unparking it, a cancel or a sweep; none needs us to wait.
        SELECT array_agg(t.id) INTO ids
          FROM (SELECT k.id FROM alk.jobs k
                 WHERE k.id = ANY (turns) AND k.queue = q AND k.state = 'pending' AND k.after_left = -1
                   FOR NO KEY UPDATE SKIP LOCKED) t;
        IF ids IS NOT NULL THEN
            UPDATE alk.jobs j SET after_left = 0 WHERE j.id = ANY (ids) AND j.queue = q;
        END IF;
    END LOOP;
END
$$;
COMMENT ON FUNCTION alk._group_turns(text[], text[]) IS
'internal: unpark the turns of these serial groups, (queue, group key) pairs (after a job of theirs left processing, '
'or a turn left pending)';

-- alk._settle(text,text,bigint[],bigint[],text[],text[],bigint[],jsonb[]): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._settle(queue text, worker_id text, job_ids bigint[], attempts bigint[], outcomes text[],
                            errs text[], delays bigint[], results jsonb[] DEFAULT NULL)
RETURNS TABLE (job_id bigint, attempt bigint, state text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
-- No nested loop between the batch and its rows: planned on a table never
-- analyzed, a plan (generic or custom) joined them that way, the whole
-- id = ANY (job_ids) list once per input row, quadratic in the batch (57-86
-- against 6-9 ms for 500 acks until autovacuum came). The rows come from
-- jobs_pkey by id = ANY (job_ids) and meet the batch in a hash join.
SET enable_nestloop = off
AS $$
#variable_conflict use_column
DECLARE
    clock bigint := alk.now();
    wid text := alk._name_ok('worker_id', _settle.worker_id, true);
    k bigint := coalesce(cardinality(_settle.job_ids), 0);
    bad bigint;
    all_ack boolean := true;
    this_minute bigint := clock / 60 * 60;
    me integer := pg_catalog.pg_backend_pid();
    completed bigint[];
    grouped boolean;
    group_queues text[];
    group_keys text[];
BEGIN
    IF (_settle.attempts IS NOT NULL AND cardinality(_settle.attempts) <> k)
       OR (_settle.outcomes IS NOT NULL AND cardinality(_settle.outcomes) <> k)
       OR (_settle.errs IS NOT NULL AND cardinality(_settle.errs) <> k)
       OR (_settle.delays IS NOT NULL AND cardinality(_settle.delays) <> k)
       OR (_settle.results IS NOT NULL AND cardinality(_settle.results) <> k) THEN
        PERFORM alk._raise('LK002', 'attempts, outcomes, errs, delays and results must each be NULL or have one '
            || 'entry per job id: got ' || k || ' job_ids, ' || coalesce(cardinality(_settle.attempts)::text, 'NULL')
            || ' attempts, ' || coalesce(cardinality(_settle.outcomes)::text, 'NULL') || ' outcomes, '
            || coalesce(cardinality(_settle.errs)::text, 'NULL') || ' errs, '
            || coalesce(cardinality(_settle.delays)::text, 'NULL') || ' delays and '
            || coalesce(cardinality(_settle.results)::text, 'NULL') || ' results');
    END IF;
    -- NULL outcomes (all ack, a batching worker's usual call): nothing to
    -- check, and no statement spent on it. Outcomes that are all 'ack' take
    -- the same all-ack statement below (an ack ignores its err and delay):
    -- measured at 250 jobs, 14 against 5 us per job, server side.
    IF _settle.outcomes IS NOT NULL THEN
        SELECT min(o.ord) FILTER (WHERE o.outcome IS NULL OR o.outcome NOT IN ('ack', 'retry', 'fail')),
               coalesce(bool_and(o.outcome = 'ack'), true)
          INTO bad, all_ack
          FROM unnest(_settle.outcomes) WITH ORDINALITY AS o(outcome, ord);
    END IF;
    IF bad IS NOT NULL THEN
        PERFORM alk._raise('LK002', 'outcome ' || bad || ' must be ''ack'', ''retry'' or ''fail'', got '
            || alk._show(_settle.outcomes[bad]));
    END IF;
    IF k = 0 THEN
        RETURN;
    END IF;
    -- Serial groups (38_group_turns.sql): the groups of the jobs to settle,
    -- read before the statements below delete them (a job's group never
    -- changes), given their next turns after. A queue running no grouped
    -- job pays one probe of the empty end of jobs_group_running.
    grouped := CASE WHEN _settle.queue IS NULL
        THEN EXISTS (SELECT FROM alk.jobs j WHERE j.state = 'processing' AND j.group_key IS NOT NULL)
        ELSE EXISTS (SELECT FROM alk.jobs j WHERE j.queue = _settle.queue AND j.state = 'processing'
                                              AND j.group_key IS NOT NULL) END;
    IF grouped THEN
        SELECT array_agg(j.queue), array_agg(j.group_key) INTO group_queues, group_keys
          FROM alk.jobs j
         WHERE j.id = ANY (_settle.job_ids) AND (_settle.queue IS NULL OR j.queue = _settle.queue)
           AND j.state = 'processing' AND j.group_key IS NOT NULL;
    END IF;
    -- Acks on queues that keep completed jobs, first; the statements below
    -- then delete the acked jobs they left.
    IF EXISTS (SELECT FROM alk.queue_settings s WHERE _settle.queue IS NULL OR s.queue = _settle.queue) THEN
        completed := alk._complete(_settle.queue, wid, clock, _settle.job_ids, _settle.attempts, _settle.outcomes,
                                   _settle.results);
    END IF;
    IF all_ack THEN
        -- All ack (a batching worker's usual call): the ack branch of the
        -- statement below on its own, without the retry/fail UPDATE that a
        -- generic plan would set up on every call for no rows.
        RETURN QUERY
        WITH input AS (
            SELECT i.id, i.attempt, i.ord
              FROM unnest(_settle.job_ids, _settle.attempts) WITH ORDINALITY AS i(id, attempt, ord)
        ), first AS (
            SELECT DISTINCT ON (i.id) i.* FROM input i ORDER BY i.id, i.ord
        ), acked AS (
            -- id = ANY (job_ids): the plan probes jobs_pkey per id rather than
            -- walking every row the worker holds (a generic plan knows no
            -- batch size; measured 22-137 ms a call at 500 held).
            DELETE FROM alk.jobs j USING first f
             WHERE j.id = ANY (_settle.job_ids) AND j.id = f.id AND (_settle.queue IS NULL OR j.queue = _settle.queue)
               AND alk._holds(j, wid, f.attempt, clock)
            RETURNING j.id, j.queue
        ), counted AS (
            INSERT INTO alk.queue_counts AS c (queue, minute, backend, acked)
            SELECT a.queue, this_minute, me, count(*) FROM acked a GROUP BY a.queue
            ON CONFLICT ON CONSTRAINT queue_counts_pkey DO UPDATE SET acked = c.acked + excluded.acked
            RETURNING c.queue
        )
        SELECT i.id, i.attempt, CASE WHEN a.id IS NOT NULL OR f.id = ANY (completed) THEN 'acked' END
          FROM input i
          LEFT JOIN first f ON f.ord = i.ord
          LEFT JOIN acked a ON a.id = f.id
         ORDER BY i.ord;
        -- Jobs enqueued after these (35_after.sql): RETURN QUERY keeps no
        -- awaited flag, so one probe of alk.job_after, empty unless
        -- dependencies are used, in a later statement than the settlement.
        IF EXISTS (SELECT FROM alk.job_after e WHERE e.after_id = ANY (_settle.job_ids)) THEN
            PERFORM alk._after_sync(_settle.job_ids);
        END IF;
        IF group_queues IS NOT NULL THEN
            PERFORM alk._group_turns(group_queues, group_keys);
        END IF;
        RETURN;
    END IF;
    RETURN QUERY
    WITH input AS (
        SELECT i.id, i.attempt, coalesce(i.outcome, 'ack') AS outcome, i.err, i.delay, i.ord
          FROM unnest(_settle.job_ids, _settle.attempts, _settle.outcomes, _settle.errs, _settle.delays)
               WITH ORDINALITY AS i(id, attempt, outcome, err, delay, ord)
    ), first AS (
        SELECT DISTINCT ON (i.id) i.* FROM input i ORDER BY i.id, i.ord
    ), acked AS (
        DELETE FROM alk.jobs j USING first f
         WHERE f.outcome = 'ack' AND j.id = ANY (_settle.job_ids) AND j.id = f.id AND (_settle.queue IS NULL OR j.queue = _settle.queue)
           AND alk._holds(j, wid, f.attempt, clock)
        RETURNING j.id, j.queue, 'acked'::text AS state
    ), moved AS (
        -- retry: pending again, no worker, ready at now + delay (NULL: the
        -- row's curve, base * 2^(spent - 1)), unless its attempts are spent:
        -- then, like fail, dead with the error.
        UPDATE alk.jobs j
           SET state = CASE WHEN f.outcome = 'fail' OR j.attempts - j.attempts_refunded >= j.max_attempts
                            THEN 'dead' ELSE 'pending' END,
               run_at = CASE WHEN f.outcome = 'fail' OR j.attempts - j.attempts_refunded >= j.max_attempts
                             THEN j.run_at
                             ELSE alk._sat_add(clock, coalesce(f.delay, alk._sat_mul_pow2(j.backoff_base_s,
                                  j.attempts - j.attempts_refunded - 1))) END,
               worker_id = CASE WHEN f.outcome = 'fail' OR j.attempts - j.attempts_refunded >= j.max_attempts
                                THEN j.worker_id END,
               claimed_at = CASE WHEN f.outcome = 'fail' OR j.attempts - j.attempts_refunded >= j.max_attempts
                                 THEN j.claimed_at END,
               claim_expires_at = CASE WHEN f.outcome = 'fail' OR j.attempts - j.attempts_refunded >= j.max_attempts
                                       THEN j.claim_expires_at END,
               last_error = CASE WHEN f.outcome = 'fail' THEN coalesce(f.err, 'failed')
                                 WHEN j.attempts - j.attempts_refunded >= j.max_attempts
                                 THEN coalesce(f.err, 'max attempts exceeded') END,
               died_at = CASE WHEN f.outcome = 'fail' OR j.attempts - j.attempts_refunded >= j.max_attempts
                              THEN clock END,
               purge_at = CASE WHEN f.outcome = 'fail' OR j.attempts - j.attempts_refunded >= j.max_attempts
                               THEN alk._purge_at(clock, j.dead_letter_retention_s) END
          FROM first f
         WHERE f.outcome <> 'ack' AND j.id = ANY (_settle.job_ids) AND j.id = f.id AND (_settle.queue IS NULL OR j.queue = _settle.queue)
           AND alk._holds(j, wid, f.attempt, clock)
        RETURNING j.id, j.queue, j.state
    ), done AS (
        SELECT a.id, a.queue, a.state FROM acked a UNION ALL SELECT m.id, m.queue, m.state FROM moved m
    ), counted AS (
        -- retried: pending again; dead: failed, or retried with attempts spent.
        INSERT INTO alk.queue_counts AS c (queue, minute, backend, acked, retried, dead)
        SELECT d.queue, this_minute, me, count(*) FILTER (WHERE d.state = 'acked'),
               count(*) FILTER (WHERE d.state = 'pending'), count(*) FILTER (WHERE d.state = 'dead')
          FROM done d GROUP BY d.queue
        ON CONFLICT ON CONSTRAINT queue_counts_pkey DO UPDATE
           SET acked = c.acked + excluded.acked, retried = c.retried + excluded.retried, dead = c.dead + excluded.dead
        RETURNING c.queue
    )
    SELECT i.id, i.attempt, coalesce(d.state, CASE WHEN f.id = ANY (completed) THEN 'acked' END)
      FROM input i
      LEFT JOIN first f ON f.ord = i.ord
      LEFT JOIN done d ON d.id = f.id
     ORDER BY i.ord;
    -- Acked or dead: the jobs enqueued after them are released or buried.
    IF EXISTS (SELECT FROM alk.job_after e WHERE e.after_id = ANY (_settle.job_ids)) THEN
        PERFORM alk._after_sync(_settle.job_ids);
    END IF;
    IF group_queues IS NOT NULL THEN
        PERFORM alk._group_turns(group_queues, group_keys);
    END IF;
END
$$;
COMMENT ON FUNCTION alk._settle(text, text, bigint[], bigint[], text[], text[], bigint[], jsonb[]) IS
'internal: the settlement rule (ack, retry, fail) for a batch, counted per queue for alk.queue_throughput; '
'queue NULL: any queue; results: the acks'' results, kept on queues that keep completed jobs';

-- alk._sweep_expired(text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._sweep_expired(queue text)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock bigint := alk.now();
    expired bigint;
    purged bigint;
    completed bigint;
    awaited bigint[];
    gone bigint[];
BEGIN
    -- Waiting rows past expiry, and processing rows past expiry whose lease
    -- lapsed; a row with a valid lease is left to its owner.
    WITH swept AS (
        UPDATE alk.jobs j
           SET state = 'dead', last_error = 'expired', died_at = clock,
               purge_at = alk._purge_at(clock, j.dead_letter_retention_s)
         WHERE j.queue = _sweep_expired.queue
           AND j.expires_at IS NOT NULL AND j.expires_at <= clock
           AND (j.state = 'pending' OR (j.state = 'processing' AND j.claim_expires_at < clock))
        RETURNING j.id, j.awaited
    )
    SELECT count(*), array_agg(w.id) FILTER (WHERE w.awaited) INTO expired, awaited FROM swept w;
    -- Dead rows past their retention.
    WITH purged_rows AS (
        DELETE FROM alk.jobs j
         WHERE j.queue = _sweep_expired.queue
           AND j.state = 'dead'
           AND j.purge_at <= clock
        RETURNING j.id, j.awaited
    )
    SELECT count(*), array_agg(d.id) FILTER (WHERE d.awaited) INTO purged, gone FROM purged_rows d;
    -- Expired: the jobs enqueued after them die too; purged: they no longer
    -- wait for them (35_after.sql). One call: it reads what each became.
    IF awaited IS NOT NULL OR gone IS NOT NULL THEN
        PERFORM alk._after_sync(coalesce(awaited, '{}') || coalesce(gone, '{}'));
    END IF;
    -- Completed rows past theirs (jobs_completed, as jobs_dead above).
    DELETE FROM alk.jobs j
     WHERE j.queue = _sweep_expired.queue
       AND j.state = 'completed'
       AND j.purge_at <= clock;
    GET DIAGNOSTICS completed = ROW_COUNT;
    -- A turn a settle under REPEATABLE READ left parked (38_group_turns.sql).
    PERFORM alk._group_heal(_sweep_expired.queue);
    RETURN expired + purged + completed;
END
$$;
COMMENT ON FUNCTION alk._sweep_expired(text) IS 'internal: sweep_expired for an already validated queue name';

-- alk.ack(bigint,text,bigint,text,jsonb): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.ack(job_id bigint, worker_id text, attempt bigint DEFAULT NULL, queue text DEFAULT NULL,
                        result jsonb DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    clock bigint := alk.now();
    wid text := alk._name_ok('worker_id', ack.worker_id, true);
    this_minute bigint := clock / 60 * 60;
    done boolean;
    awaited boolean;
    acked_queue text;
    acked_group text;
BEGIN
    IF EXISTS (SELECT FROM alk.queue_settings s WHERE ack.queue IS NULL OR s.queue = ack.queue) THEN
        IF alk._complete(ack.queue, wid, clock, ARRAY[ack.job_id], ARRAY[ack.attempt], NULL, ARRAY[ack.result])
           IS NOT NULL THEN
            RETURN true;
        END IF;
    END IF;
    WITH acked AS (
        DELETE FROM alk.jobs j
         WHERE j.id = ack.job_id AND (ack.queue IS NULL OR j.queue = ack.queue)
           AND alk._holds(j, wid, ack.attempt, clock)
        RETURNING j.queue, j.awaited, j.group_key
    ), counted AS (
        INSERT INTO alk.queue_counts AS c (queue, minute, backend, acked)
        SELECT a.queue, this_minute, pg_catalog.pg_backend_pid(), 1 FROM acked a
        ON CONFLICT ON CONSTRAINT queue_counts_pkey DO UPDATE SET acked = c.acked + excluded.acked
        RETURNING c.queue
    )
    SELECT true, a.awaited, a.queue, a.group_key INTO done, awaited, acked_queue, acked_group
      FROM counted, acked a;
    -- Jobs enqueued after this one may run now (35_after.sql).
    IF awaited THEN
        PERFORM alk._after_sync(ARRAY[ack.job_id]);
    END IF;
    -- Its serial group's next turn (38_group_turns.sql).
    IF acked_group IS NOT NULL THEN
        PERFORM alk._group_turns(ARRAY[acked_queue], ARRAY[acked_group]);
    END IF;
    RETURN done IS NOT NULL;
END
$$;
COMMENT ON FUNCTION alk.ack(bigint, text, bigint, text, jsonb) IS
'Acknowledge a claimed job: it is deleted, or, when its queue keeps completed jobs (alk.set_queue_retention), kept '
'as completed with completed_at = now and result (any JSON value; NULL: none) until its retention ends. False, and '
'nothing changes, unless the job is processing, held by worker_id under claim attempt (the fencing token the claim '
'returned; NULL skips that check) and its lease has not lapsed (claim_expires_at >= now). worker_id follows the name '
'rule (LK001). queue is optional routing for sharded deployments. '
'Example: SELECT alk.ack(job_id => 42, worker_id => ''worker-1'', attempt => 1, result => ''{"sent": true}'');';

-- alk.ack_batch(bigint[],text,bigint[],text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.ack_batch(job_ids bigint[], worker_id text, attempts bigint[] DEFAULT NULL, queue text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- No nested loop, as alk._settle (the same statement shape).
SET enable_nestloop = off
AS $$
#variable_conflict use_column
DECLARE
    clock bigint := alk.now();
    wid text := alk._name_ok('worker_id', ack_batch.worker_id, true);
    this_minute bigint := clock / 60 * 60;
    n_acked bigint;
    n_kept bigint := 0;
    awaited bigint[];
    group_queues text[];
    group_keys text[];
BEGIN
    IF ack_batch.attempts IS NOT NULL AND cardinality(ack_batch.attempts) <> coalesce(cardinality(ack_batch.job_ids), 0) THEN
        -- _settle raises the LK002 that names the arrays.
        PERFORM alk._settle(ack_batch.queue, ack_batch.worker_id, ack_batch.job_ids, ack_batch.attempts, NULL, NULL, NULL);
    END IF;
    IF EXISTS (SELECT FROM alk.queue_settings s WHERE ack_batch.queue IS NULL OR s.queue = ack_batch.queue) THEN
        n_kept := coalesce(cardinality(alk._complete(ack_batch.queue, wid, clock, ack_batch.job_ids,
                                                      ack_batch.attempts, NULL, NULL)), 0);
    END IF;
    WITH first AS (
        SELECT DISTINCT ON (i.id) i.id, i.attempt
          FROM unnest(ack_batch.job_ids, ack_batch.attempts) WITH ORDINALITY AS i(id, attempt, ord)
         ORDER BY i.id, i.ord
    ), acked AS (
        -- id = ANY (job_ids): jobs_pkey probes, as in _settle.
        DELETE FROM alk.jobs j USING first f
         WHERE j.id = ANY (ack_batch.job_ids) AND j.id = f.id
           AND (ack_batch.queue IS NULL OR j.queue = ack_batch.queue)
           AND alk._holds(j, wid, f.attempt, clock)
        RETURNING j.id, j.queue, j.awaited, j.group_key
    ), counted AS (
        INSERT INTO alk.queue_counts AS c (queue, minute, backend, acked)
        SELECT a.queue, this_minute, pg_catalog.pg_backend_pid(), count(*) FROM acked a GROUP BY a.queue
        ON CONFLICT ON CONSTRAINT queue_counts_pkey DO UPDATE SET acked = c.acked + excluded.acked
        RETURNING c.queue
    )
    SELECT count(*), array_agg(a.id) FILTER (WHERE a.awaited),
           array_agg(a.queue) FILTER (WHERE a.group_key IS NOT NULL),
           array_agg(a.group_key) FILTER (WHERE a.group_key IS NOT NULL)
      INTO n_acked, awaited, group_queues, group_keys FROM acked a;
    -- Jobs enqueued after these may run now (35_after.sql).
    IF awaited IS NOT NULL THEN
        PERFORM alk._after_sync(awaited);
    END IF;
    -- Their serial groups' next turns (38_group_turns.sql).
    IF group_queues IS NOT NULL THEN
        PERFORM alk._group_turns(group_queues, group_keys);
    END IF;
    RETURN n_acked + n_kept;
END
$$;
COMMENT ON FUNCTION alk.ack_batch(bigint[], text, bigint[], text) IS
'Acknowledge several claimed jobs in one call; returns how many were validly held (and are now deleted, or kept as '
'completed without a result when their queue keeps completed jobs). '
'attempts, when given, holds each job''s fencing token in the same order. '
'Example: SELECT alk.ack_batch(ARRAY[41, 42], ''worker-1'', ARRAY[1, 1]);';

-- alk.cancel(text,bigint): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.cancel(queue text, job_id bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    was text;
    holder text;
    awaited boolean;
    cancelled_group text;
BEGIN
    PERFORM alk._check_name('queue', cancel.queue);
    DELETE FROM alk.jobs j WHERE j.queue = cancel.queue AND j.id = job_id AND j.state IN ('pending', 'processing')
    RETURNING j.state, j.worker_id, j.awaited, j.group_key INTO was, holder, awaited, cancelled_group;
    IF was IS NULL THEN
        RETURN false;
    END IF;
    -- Its serial group's next turn (38_group_turns.sql).
    IF cancelled_group IS NOT NULL THEN
        PERFORM alk._group_turns(ARRAY[cancel.queue], ARRAY[cancelled_group]);
    END IF;
    -- A cancelled job no longer exists: the jobs enqueued after it are
    -- released, as by an ack (docs/queue.md "Dependencies").
    IF awaited THEN
        PERFORM alk._after_sync(ARRAY[job_id]);
    END IF;
    -- A processing job's holder learns at commit on its control channel
    -- (sql/workers.sql), so its handler stops instead of running to a refused
    -- outcome. Sent whatever the lease: a lapsed holder may still be running it.
    IF was = 'processing' AND holder IS NOT NULL THEN
        PERFORM pg_catalog.pg_notify(alk._worker_channel(holder), 'cancel ' || job_id);
    END IF;
    -- A producer waiting for the job's outcome (65_outcome.sql) learns too.
    IF EXISTS (SELECT FROM alk.queue_settings s WHERE s.queue = cancel.queue) THEN
        PERFORM pg_catalog.pg_notify(alk._outcome_channel(cancel.queue), job_id || ' cancelled');
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION alk.cancel(text, bigint) IS
'Delete a pending or processing job whatever its lease; true if a row went. Dead and completed jobs stay for '
'inspection (false). A processing job''s holder is told at commit: ''cancel <job_id>'' on its control channel '
'(alk.worker_register), so its handler is cancelled; its later ack, nack or settle is refused as for any lost job. '
'Jobs enqueued after it (alk.enqueue''s after) no longer wait for it, as after an ack. '
'On a queue that keeps completed jobs, ''<job_id> cancelled'' goes to alk.outcome_channel as well. '
'Example: SELECT alk.cancel(''emails'', 42);';

-- alk.queue_stats(text,bigint): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.queue_stats(queue text DEFAULT NULL, exact_limit bigint DEFAULT NULL)
RETURNS SETOF alk.queue_stat
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Planned per call: a generic plan keeps every LIMIT node and CASE that a
-- NULL exact_limit folds away (exact counts: 1.10x the time of 0017's, 1.06x
-- with this), and the plan costs less than a millisecond.
SET plan_cache_mode = force_custom_plan
AS $$
#variable_conflict use_column
DECLARE
    clock bigint := alk.now();
    only_queue text := queue_stats.queue;
    -- Held one below the largest bigint: the counts read cap + 1 entries.
    cap bigint := least(queue_stats.exact_limit, 9223372036854775806);
BEGIN
    IF only_queue IS NOT NULL THEN
        -- Read-only, so reserved names (outbox backing queues) are accepted.
        PERFORM alk._check_name('queue', only_queue, true);
    END IF;
    IF cap < 0 THEN
        PERFORM alk._raise('LK002', 'exact_limit must be >= 0 or NULL (every count exact), got ' || cap);
    END IF;
    -- Every row is in exactly one of the five partial indexes (pending,
    -- waiting on after jobs or parked, processing, dead, completed), and each leads with
    -- the queue: the queue names come from a loose scan of the five (five
    -- probes per queue, whatever
    -- the row count), and each count is an index-only scan of one queue's
    -- entries in one of them. Nothing reads the heap but for pages the
    -- visibility map does not yet know to be all-visible.
    -- An exact count visits every entry once, so its cost is per entry
    -- (docs/dashboard.md "Performance"): with exact_limit each count stops
    -- after exact_limit + 1 entries and, past it, is the planner's estimate
    -- instead (at least exact_limit + 1, so a count above exact_limit is
    -- always an estimate, and estimated says the row holds one). The ages
    -- come from a loose scan over the pending index's priorities (per
    -- priority, its first entry at or before the clock and its first after
    -- it), so they stay exact at any size.
    RETURN QUERY
    WITH RECURSIVE names(name) AS (
        SELECT coalesce(only_queue, '')
        UNION ALL
        SELECT least(
            (SELECT j.queue FROM alk.jobs j WHERE j.state = 'pending' AND j.after_left = 0 AND j.queue > n.name
              ORDER BY j.queue LIMIT 1),
            (SELECT j.queue FROM alk.jobs j WHERE j.state = 'pending' AND j.after_left <> 0 AND j.queue > n.name
              ORDER BY j.queue LIMIT 1),
            (SELECT j.queue FROM alk.jobs j WHERE j.state = 'processing' AND j.queue > n.name
              ORDER BY j.queue LIMIT 1),
            (SELECT j.queue FROM alk.jobs j WHERE j.state = 'dead' AND j.queue > n.name ORDER BY j.queue LIMIT 1),
            (SELECT j.queue FROM alk.jobs j WHERE j.state = 'completed' AND j.queue > n.name
              ORDER BY j.queue LIMIT 1))
          FROM names n WHERE n.name IS NOT NULL AND only_queue IS NULL
    ),
    -- MATERIALIZED: inlined, each count would run once per mention below.
    capped AS MATERIALIZED (
        SELECT n.name,
               (SELECT count(*) FROM (SELECT FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'pending'
                                         AND j.after_left = 0 AND j.run_at <= clock LIMIT cap + 1) e) AS ready,
               (SELECT count(*) FROM (SELECT FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'pending'
                                         AND j.after_left = 0 AND j.run_at > clock LIMIT cap + 1) e) AS scheduled,
               (SELECT count(*) FROM (SELECT FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'pending'
                                         AND j.after_left > 0 LIMIT cap + 1) e) AS waiting,
               (SELECT count(*) FROM (SELECT FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'pending'
                                         AND j.after_left = -1 AND j.run_at <= clock LIMIT cap + 1) e) AS parked_ready,
               (SELECT count(*) FROM (SELECT FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'pending'
                                         AND j.after_left = -1 AND j.run_at > clock LIMIT cap + 1) e)
                 AS parked_scheduled,
               (SELECT count(*) FROM (SELECT FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'processing'
                                       LIMIT cap + 1) e) AS processing,
               (SELECT count(*) FROM (SELECT FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'processing'
                                         AND j.claim_expires_at < clock LIMIT cap + 1) e) AS lapsed,
               (SELECT count(*) FROM (SELECT FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'dead'
                                       LIMIT cap + 1) e) AS dead,
               (SELECT count(*) FROM (SELECT FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'completed'
                                       LIMIT cap + 1) e) AS completed
          FROM names n
         WHERE n.name IS NOT NULL AND n.name <> '' AND (NOT alk._limits_active() OR alk._in_scope(n.name))
    ),
    counted AS MATERIALIZED (
        SELECT c.name,
               CASE WHEN c.ready > cap THEN greatest(alk._estimate_jobs(c.name, 'ready', clock), cap + 1)
                    ELSE c.ready END
               -- Parked jobs (38_group_turns.sql) are pending: by run_at.
               + CASE WHEN c.parked_ready > cap
                      THEN greatest(alk._estimate_jobs(c.name, 'parked ready', clock), cap + 1)
                      ELSE c.parked_ready END AS ready,
               -- Jobs waiting on their after jobs are pending and not due: scheduled.
               CASE WHEN c.scheduled > cap THEN greatest(alk._estimate_jobs(c.name, 'scheduled', clock), cap + 1)
                    ELSE c.scheduled END
               + CASE WHEN c.waiting > cap THEN greatest(alk._estimate_jobs(c.name, 'waiting', clock), cap + 1)
                      ELSE c.waiting END
               + CASE WHEN c.parked_scheduled > cap
                      THEN greatest(alk._estimate_jobs(c.name, 'parked scheduled', clock), cap + 1)
                      ELSE c.parked_scheduled END AS scheduled,
               CASE WHEN c.processing > cap THEN greatest(alk._estimate_jobs(c.name, 'processing', clock), cap + 1)
                    ELSE c.processing END AS processing,
               CASE WHEN c.lapsed > cap THEN greatest(alk._estimate_jobs(c.name, 'lapsed', clock), cap + 1)
                    ELSE c.lapsed END AS lapsed,
               CASE WHEN c.dead > cap THEN greatest(alk._estimate_jobs(c.name, 'dead', clock), cap + 1)
                    ELSE c.dead END AS dead,
               CASE WHEN c.completed > cap THEN greatest(alk._estimate_jobs(c.name, 'completed', clock), cap + 1)
                    ELSE c.completed END AS completed,
               coalesce(greatest(c.ready, c.scheduled, c.waiting, c.parked_ready, c.parked_scheduled, c.processing,
                                 c.lapsed, c.dead, c.completed) > cap, false)
                 AS estimated
          FROM capped c
    )
    SELECT c.name, c.ready + c.scheduled, c.ready, c.scheduled, c.processing,
           -- Two estimates may disagree: never more lapsed than processing.
           least(c.lapsed, c.processing), c.dead,
           alk._sat_sub(clock, least(t.oldest_ready, w.oldest_ready)), least(t.next_run_at, w.next_run_at),
           EXISTS (SELECT FROM alk.paused_queues pq WHERE pq.queue = c.name), c.estimated, c.completed
      FROM counted c
     CROSS JOIN LATERAL (
        WITH RECURSIVE priorities(priority) AS (
            (SELECT j.priority FROM alk.jobs j WHERE j.queue = c.name AND j.state = 'pending' AND j.after_left = 0
              ORDER BY j.priority DESC LIMIT 1)
            UNION ALL
            SELECT (SELECT j.priority FROM alk.jobs j WHERE j.queue = c.name AND j.state = 'pending'
                       AND j.after_left = 0 AND j.priority < p.priority ORDER BY j.priority DESC LIMIT 1)
              FROM priorities p WHERE p.priority IS NOT NULL
        )
        SELECT min((SELECT j.run_at FROM alk.jobs j WHERE j.queue = c.name AND j.state = 'pending'
                       AND j.after_left = 0 AND j.priority = p.priority AND j.run_at <= clock ORDER BY j.run_at LIMIT 1)) AS oldest_ready,
               min((SELECT j.run_at FROM alk.jobs j WHERE j.queue = c.name AND j.state = 'pending'
                       AND j.after_left = 0 AND j.priority = p.priority AND j.run_at > clock ORDER BY j.run_at LIMIT 1)) AS next_run_at
          FROM priorities p WHERE p.priority IS NOT NULL) t
     -- Parked jobs, in jobs_waiting by run_at.
     CROSS JOIN LATERAL (
        SELECT (SELECT j.run_at FROM alk.jobs j WHERE j.queue = c.name AND j.state = 'pending' AND j.after_left = -1
                   AND j.run_at <= clock ORDER BY j.run_at LIMIT 1) AS oldest_ready,
               (SELECT j.run_at FROM alk.jobs j WHERE j.queue = c.name AND j.state = 'pending' AND j.after_left = -1
                   AND j.run_at > clock ORDER BY j.run_at LIMIT 1) AS next_run_at) w
     ORDER BY c.name;
END
$$;
COMMENT ON FUNCTION alk.queue_stats(text, bigint) IS
'One row per queue (every queue holding a job, reserved outbox queues included; or only the given queue, even when '
'empty): pending (= ready + scheduled), ready (pending and due), scheduled (pending, run_at in the future, or '
'waiting on its after jobs: alk.enqueue), '
'processing (leased, lapsed included), lapsed (lease ended: claimable again), dead, oldest_ready_age_s (now minus '
'the earliest run_at of a ready job: the queue''s lag; NULL when none is ready), next_run_at (the earliest run_at '
'of a scheduled job not waiting on after jobs; NULL when none), paused (alk.pause_queue), estimated, and '
'completed (acked jobs kept by '
'alk.set_queue_retention; last, as it came last). Every count is exact unless '
'exact_limit is given: then a count stops after exact_limit + 1 index entries and, past exact_limit, is the '
'planner''s estimate (from the table''s statistics, which ANALYZE and autovacuum keep current), never below '
'exact_limit + 1, and estimated is true. The ages are exact either way. Cost: index-only scans of the partial '
'indexes, linear in the entries counted: with exact_limit at most about 8 x exact_limit per queue '
'(docs/dashboard.md has numbers). Example: SELECT * FROM alk.queue_stats(exact_limit => 10000);';

-- alk.set_queue_limits(text,bigint,bigint,bigint,bigint): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.set_queue_limits(queue text, max_running bigint DEFAULT NULL, rate bigint DEFAULT NULL,
                                     rate_period_s bigint DEFAULT NULL, max_running_per_group bigint DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    q text := alk._name_ok('queue', set_queue_limits.queue, false);
    previous alk.limited_queues;
    wanted alk.limited_queues := ROW(q, max_running, rate, rate_period_s, max_running_per_group);
BEGIN
    IF max_running <= 0 THEN
        PERFORM alk._raise('LK002', 'max_running must be > 0 or NULL (no limit), got ' || max_running);
    END IF;
    IF rate <= 0 THEN
        PERFORM alk._raise('LK002', 'rate must be > 0 or NULL (no limit), got ' || rate);
    END IF;
    IF rate_period_s <= 0 THEN
        PERFORM alk._raise('LK002', 'rate_period_s must be > 0 or NULL (no limit), got ' || rate_period_s);
    END IF;
    IF max_running_per_group <= 0 THEN
        PERFORM alk._raise('LK002', 'max_running_per_group must be > 0 or NULL (the default, 1), got '
            || max_running_per_group);
    END IF;
    IF (rate IS NULL) <> (rate_period_s IS NULL) THEN
        PERFORM alk._raise('LK002', 'rate and rate_period_s go together: both set (rate claims per rate_period_s '
            || 'seconds) or both NULL, got rate ' || coalesce(rate::text, 'NULL') || ' and rate_period_s '
            || coalesce(rate_period_s::text, 'NULL'));
    END IF;
    -- Waits for a claim of the queue in progress (it holds this row).
    SELECT * INTO previous FROM alk.limited_queues l WHERE l.queue = q FOR NO KEY UPDATE;
    IF num_nulls(max_running, rate, max_running_per_group) = 3 THEN
        DELETE FROM alk.limited_queues l WHERE l.queue = q;
        DELETE FROM alk.queue_rate_windows w WHERE w.queue = q;
    ELSE
        INSERT INTO alk.limited_queues AS l (queue, max_running, rate, rate_period_s, max_running_per_group)
        VALUES (q, max_running, rate, rate_period_s, max_running_per_group)
        ON CONFLICT ON CONSTRAINT limited_queues_pkey DO UPDATE
           SET max_running = excluded.max_running, rate = excluded.rate, rate_period_s = excluded.rate_period_s,
               max_running_per_group = excluded.max_running_per_group;
        IF rate IS NULL THEN
            DELETE FROM alk.queue_rate_windows w WHERE w.queue = q;
        END IF;
    END IF;
    IF previous IS NOT DISTINCT FROM wanted OR (previous.queue IS NULL AND wanted.max_running IS NULL
            AND wanted.rate IS NULL AND wanted.max_running_per_group IS NULL) THEN
        RETURN false;
    END IF;
    -- A new share changes every group's turns (38_group_turns.sql).
    IF previous.max_running_per_group IS DISTINCT FROM wanted.max_running_per_group THEN
        PERFORM alk._group_heal(q);
    END IF;
    -- Looser limits may leave room now: idle workers claim again at commit.
    PERFORM pg_catalog.pg_notify(alk._queue_channel(q), '');
    RETURN true;
END
$$;
COMMENT ON FUNCTION alk.set_queue_limits(text, bigint, bigint, bigint, bigint) IS
'Set a queue''s claim limits, all at once (each NULL lifts that limit; all NULL: none). max_running: claims never '
'leave more than this many of the queue''s jobs processing with a valid lease (lapsed leases do not count). rate per '
'rate_period_s (set together): at most rate jobs claimed in each window of rate_period_s seconds of alk.now(), a '
'fixed window opened by the first claim after the last one ended. max_running_per_group: jobs with one group_key run '
'at most this many at a time (NULL: 1). Claims return fewer jobs, never an error; a queue with limits is claimed one '
'claim at a time, under READ COMMITTED only. Values <= 0 are LK002. True when the limits changed (idle workers are '
'woken). Example: SELECT alk.set_queue_limits(''emails'', max_running => 5, rate => 100, rate_period_s => 60);';

-- hand-written: the triggers (as sql/queue/38_group_turns.sql has them).
-- A trigger rather than a call in each of the statements that retry, fail,
-- snooze, release, complete or bury a job. It fires only on the columns
-- those set and the claim does not (retry and snooze set run_at, release
-- attempts_refunded, a burial died_at, a completion completed_at), and WHEN
-- keeps jobs without a group out of it. A rotation's moved rows are deleted
-- and inserted, which fires no UPDATE trigger.
CREATE TRIGGER jobs_group_left AFTER UPDATE OF run_at, attempts_refunded, died_at, completed_at ON alk.jobs
    FOR EACH ROW WHEN (OLD.group_key IS NOT NULL AND OLD.state IN ('pending', 'processing') AND NEW.state <> OLD.state)
    EXECUTE FUNCTION alk._group_left();
COMMENT ON TRIGGER jobs_group_left ON alk.jobs IS
'Unparks the turns of the serial group of a job that left processing or pending (alk._group_turns).';

-- Deferred to the commit, so the group's lock is held from the fresh read
-- to the commit only, not for the life of the transaction that enqueued
-- (a settle of the group waits for that lock).
CREATE CONSTRAINT TRIGGER group_arrivals_park AFTER INSERT ON alk.group_arrivals
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    EXECUTE FUNCTION alk._group_arrived();
COMMENT ON TRIGGER group_arrivals_park ON alk.group_arrivals IS
'At commit, parks the pending jobs of the group enqueued into that are not its turns (alk._group_park).';

-- A job pending again (a retry's or snooze's run_at, requeue_dead) or done
-- waiting for its after jobs. Neither the claim nor an ack sets these
-- columns, so their hot path pays nothing; an unpark (-1 to 0) is a turn.
CREATE CONSTRAINT TRIGGER jobs_group_returned AFTER UPDATE OF run_at, after_left ON alk.jobs
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (NEW.group_key IS NOT NULL AND NEW.state = 'pending' AND NEW.after_left = 0 AND OLD.after_left <> -1)
    EXECUTE FUNCTION alk._group_returned();
COMMENT ON TRIGGER jobs_group_returned ON alk.jobs IS
'At commit, parks a grouped job that became pending again, or claimable after its after jobs, unless it is one of '
'its group''s turns (alk._group_park).';

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
