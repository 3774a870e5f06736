-- pyalk 0034: turns_without_hot_path_triggers (issue 26). Two corrections to 0032 and 0033, which landed on main
-- as written and stay so.
-- - 0032 kept serial groups' turns with an AFTER DELETE trigger and a deferred AFTER INSERT constraint trigger
--   on alk.jobs; jobs without a group paid their WHEN tests, 10-12% on claim 1 + ack and on enqueue (server
--   side). Now ack, ack_batch, settle and cancel unpark with the group keys their delete returned, and the
--   enqueues write one row per group enqueued into to alk.group_arrivals, whose deferred trigger parks at
--   commit; alk.rotate_jobs no longer needs its alk.rotating flag. alk._group_turns takes (queue, group key)
--   pairs; alk._group_park is a plain function behind two trigger functions.
-- - 0033's alk._wake_freed let the planner run its due-job check (a hash semi-join over every pending job of
--   the queue, 42 ms at 2 x 10^5) before its idle-worker test: a limited queue's claim 1 + ack fell from ~1,300
--   to ~35 tps. The idle test is now a statement of its own, first, and alk._due_pending probes each priority
--   with LATERAL ... LIMIT 1.

-- hand-written: 0032's triggers on every insert and delete go; the returned-to-pending trigger is re-pointed.
DROP TRIGGER jobs_group_arrived ON alk.jobs;
DROP TRIGGER jobs_group_gone ON alk.jobs;
DROP TRIGGER jobs_group_returned ON alk.jobs;
DROP FUNCTION alk._group_park();
DROP FUNCTION alk._group_turns(text, text[]);

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

-- alk._due_pending(text,bigint): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._due_pending(queue text, clock bigint)
RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- One probe per distinct pending priority (jobs_claim_pending), as
    -- alk.next_claim_at walks them, stopping at the first with a due job.
    WITH RECURSIVE priorities(priority) AS (
        (SELECT j.priority FROM alk.jobs j
          WHERE j.queue = $1 AND j.state = 'pending' AND j.after_left = 0
          ORDER BY j.priority DESC LIMIT 1)
        UNION ALL
        SELECT (SELECT j.priority FROM alk.jobs j
                 WHERE j.queue = $1 AND j.state = 'pending' AND j.after_left = 0 AND j.priority < p.priority
                 ORDER BY j.priority DESC LIMIT 1)
          FROM priorities p WHERE p.priority IS NOT NULL
    )
    -- LATERAL with LIMIT 1: one index probe per priority. As an EXISTS the
    -- planner made it a hash semi-join over every pending job of the queue
    -- (42 ms at 2 x 10^5 pending, measured).
    SELECT EXISTS (SELECT FROM priorities p
                    CROSS JOIN LATERAL (SELECT FROM alk.jobs j
                                         WHERE j.queue = $1 AND j.state = 'pending' AND j.after_left = 0
                                           AND j.priority = p.priority AND j.run_at <= $2 LIMIT 1) d
                    WHERE p.priority IS NOT NULL)
$$;
COMMENT ON FUNCTION alk._due_pending(text, bigint) IS
'internal: whether the queue has a due pending job with nothing left to wait for';

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

-- alk._wake_freed(text[]): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._wake_freed(queues text[])
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock bigint := alk.now();
    q text;
    woke boolean := false;
BEGIN
    -- Nobody sleeps (a busy system): nothing to wake, one probe. A statement
    -- of its own: inside the one below the planner ran the costlier tests
    -- first.
    IF NOT EXISTS (SELECT FROM alk.idle_workers w WHERE queues IS NULL OR w.queue = ANY (queues)) THEN
        RETURN false;
    END IF;
    FOR q IN
        SELECT l.queue FROM alk.limited_queues l
         WHERE l.max_running IS NOT NULL AND (queues IS NULL OR l.queue = ANY (queues))
           -- Someone sleeps, a slot is free, and a due job waits for it.
           AND EXISTS (SELECT FROM alk.idle_workers w WHERE w.queue = l.queue)
           AND (SELECT count(*) FROM (SELECT FROM alk.jobs j
                                       WHERE j.queue = l.queue AND j.state = 'processing'
                                         AND j.claim_expires_at >= clock LIMIT l.max_running) r) < l.max_running
           AND alk._due_pending(l.queue, clock)
    LOOP
        PERFORM alk._wake(q);
        woke := true;
    END LOOP;
    RETURN woke;
END
$$;
COMMENT ON FUNCTION alk._wake_freed(text[]) IS
'internal: after a settle of jobs of these queues (NULL: any), wake the idle workers of each that has max_running, '
'a free slot and a due job; true when one was woken';

-- alk.rotate_jobs(bigint): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.rotate_jobs(min_jobs bigint DEFAULT 10000)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- More live rows than this and the rotation waits for the backlog to
    -- drain: moving them holds every claim, ack and enqueue of the slot
    -- (about 2 ms per 1,000 rows, measured).
    max_live constant bigint := 20000;
    -- The longest a rotation waits for its lock, and so holds up the claims
    -- and acks queued behind it.
    max_wait_s constant double precision := 0.1;
    previous_timeout text;
    since bigint;
    last_id bigint;
    cur bigint;
    nxt bigint;
    live bigint;
BEGIN
    IF min_jobs IS NULL OR min_jobs < 0 THEN
        PERFORM alk._raise('LK002', 'min_jobs must be >= 0, got ' || coalesce(min_jobs::text, 'NULL'));
    END IF;
    -- Never queue behind anybody: a waiting ACCESS EXCLUSIVE request would
    -- stall every claim and ack behind it. Whoever holds a lock, we go.
    IF NOT pg_catalog.pg_try_advisory_xact_lock(alk._rotation_lock()) THEN
        RETURN 'locked';
    END IF;
    SELECT s.current_slot, s.rotated_at_id INTO cur, since FROM alk.job_slots s;
    last_id := coalesce(pg_catalog.pg_sequence_last_value('alk.jobs_id_seq'), 0);
    IF last_id - since < min_jobs THEN
        RETURN 'not due';
    END IF;
    nxt := 1 - cur;
    -- Every statement on alk.jobs locks every slot it may touch until its
    -- transaction ends, and under load some claim or ack always holds the
    -- slot. Wait for it, briefly (the statements that queue behind our
    -- request wait as long), and only behind transactions under a second
    -- old (claims, acks): behind an old one (an enqueue in a long
    -- transaction, a pg_dump) we would stall everybody for nothing.
    BEGIN
        EXECUTE pg_catalog.format('LOCK TABLE alk.jobs_%s IN ACCESS EXCLUSIVE MODE NOWAIT', cur);
    EXCEPTION WHEN lock_not_available THEN
        IF EXISTS (SELECT FROM pg_catalog.pg_locks l JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
                    WHERE l.locktype = 'relation' AND l.database = a.datid AND l.granted
                      AND l.relation = pg_catalog.format('alk.jobs_%s', cur)::regclass
                      AND a.xact_start < pg_catalog.clock_timestamp() - interval '1 second') THEN
            RETURN 'locked';
        END IF;
        previous_timeout := pg_catalog.current_setting('lock_timeout');
        PERFORM pg_catalog.set_config('lock_timeout', (max_wait_s * 1000)::int::text, true);
        BEGIN
            EXECUTE pg_catalog.format('LOCK TABLE alk.jobs_%s IN ACCESS EXCLUSIVE MODE', cur);
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_catalog.set_config('lock_timeout', previous_timeout, true);
            RETURN 'locked';
        END;
        PERFORM pg_catalog.set_config('lock_timeout', previous_timeout, true);
    END;
    EXECUTE pg_catalog.format(
        'SELECT count(*) FROM (SELECT FROM alk.jobs_%s j WHERE j.state IN (''pending'', ''processing'') LIMIT %s) l',
        cur, max_live + 1) INTO live;
    IF live > max_live THEN
        RETURN 'too many live jobs';
    END IF;
    -- Through the parent, so the row moves whole (id, attempts, lease and
    -- all: every token stays valid). Whoever waited for our lock takes its
    -- snapshot after it, and finds the rows where they went.
    EXECUTE pg_catalog.format(
        'UPDATE alk.jobs SET slot = CASE WHEN state IN (''pending'', ''processing'') THEN %s ELSE 2 END WHERE slot = %s',
        nxt, cur);
    EXECUTE pg_catalog.format('TRUNCATE alk.jobs_%s', cur);
    UPDATE alk.job_slots s
       SET current_slot = nxt, rotated_at_id = last_id, rotated_at = alk.now(), rotations = s.rotations + 1;
    RETURN 'rotated';
END
$$;
COMMENT ON FUNCTION alk.rotate_jobs(bigint) IS
'Rotate the job storage once the current slot has taken min_jobs jobs (ids) since the last rotation: its pending '
'and processing jobs move to the other slot, its dead and completed jobs to the kept slot, and it is emptied with '
'TRUNCATE, which gives the space back even while a snapshot holds VACUUM back. Waits at most 100 ms for its lock, '
'and only behind transactions under a second old: returns '
'''rotated'', ''not due'', ''locked'' (a transaction that touched the jobs is open, or a rotation runs: try again) '
'or ''too many live jobs'' (over 20,000 pending and processing: waits for the backlog to drain). Workers call it; '
'without workers, call it every second or so (pg_cron). '
'Example: SELECT alk.rotate_jobs();';

-- hand-written: the triggers (as sql/queue/38_group_turns.sql has them).
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
