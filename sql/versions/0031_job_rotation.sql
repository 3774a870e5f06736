-- pyalk 0031: job_rotation (issue 25). alk.jobs becomes a table partitioned by slot: two rotating slots (jobs_0,
-- jobs_1) and a kept one (jobs_kept). New jobs go to the current rotating slot; alk.rotate_jobs, which workers
-- call as they go, moves the current slot's live rows to the other one and its dead and completed rows to the
-- kept slot, then empties it with TRUNCATE: a claim walks the index entries of the jobs taken since the last
-- rotation instead of every job since the last VACUUM, and the space comes back while a snapshot is held.
-- jobs_pkey and jobs_dedup gain the slot (a partitioned table's unique index must hold it); a keyed enqueue and
-- requeue_dead share an advisory lock with the rotation, so a key's live holder is always in the current slot.
-- Every row moves over as it is: ids, attempts (the fencing tokens), leases, dead and completed jobs; the id
-- sequence goes on from where it was. No public signature or result shape changes.

-- hand-written: the old table steps aside (its names are taken by the new one), with the functions whose
-- signatures hold its row type; its indexes and constraints are renamed, whatever they are (PostgreSQL 18
-- names NOT NULL constraints too, unique in the schema).
DROP FUNCTION alk._holds(alk.jobs, text, bigint, bigint);
ALTER TABLE alk.jobs RENAME TO jobs_before_0031;
ALTER SEQUENCE alk.jobs_id_seq RENAME TO jobs_before_0031_id_seq;
DO $$
DECLARE
    named record;
BEGIN
    FOR named IN SELECT c.conname FROM pg_catalog.pg_constraint c
                  WHERE c.conrelid = 'alk.jobs_before_0031'::regclass AND c.contype IN ('p', 'u', 'n') LOOP
        EXECUTE pg_catalog.format('ALTER TABLE alk.jobs_before_0031 RENAME CONSTRAINT %I TO %I',
                                  named.conname, 'before_0031_' || named.conname);
    END LOOP;
    FOR named IN SELECT i.relname FROM pg_catalog.pg_index x JOIN pg_catalog.pg_class i ON i.oid = x.indexrelid
                  WHERE x.indrelid = 'alk.jobs_before_0031'::regclass
                    AND NOT EXISTS (SELECT FROM pg_catalog.pg_constraint c WHERE c.conindid = x.indexrelid) LOOP
        EXECUTE pg_catalog.format('ALTER INDEX alk.%I RENAME TO %I', named.relname, 'before_0031_' || named.relname);
    END LOOP;
END
$$;

-- hand-written: the slot state (as sql/queue/10_table.sql has it).
-- Which rotating slot takes new jobs, and where the last rotation found the
-- id sequence (how many jobs the current slot has taken since). One row,
-- written once per rotation only.
CREATE TABLE alk.job_slots (
    only_row boolean NOT NULL DEFAULT true,
    current_slot bigint NOT NULL DEFAULT 0,
    rotated_at_id bigint NOT NULL DEFAULT 0,
    rotated_at bigint,
    rotations bigint NOT NULL DEFAULT 0,
    CONSTRAINT job_slots_pkey PRIMARY KEY (only_row),
    CONSTRAINT job_slots_one_row CHECK (only_row),
    CONSTRAINT job_slots_rotating CHECK (current_slot IN (0, 1))
);
COMMENT ON TABLE alk.job_slots IS
'The slot of alk.jobs that takes new jobs, and the last rotation. Private: use alk.rotate_jobs.';
INSERT INTO alk.job_slots DEFAULT VALUES;

-- alk._after_revive(text,bigint[]): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._after_revive(queue text, after_ids bigint[])
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock bigint := alk.now();
    revived bigint;
BEGIN
    WITH RECURSIVE down(job_id) AS (
        SELECT e.job_id FROM alk.job_after e WHERE e.after_id = ANY (after_ids)
        UNION
        SELECT e.job_id FROM down d JOIN alk.job_after e ON e.after_id = d.job_id
    )
    UPDATE alk.jobs j
       SET state = 'pending', run_at = clock, attempts_refunded = j.attempts,
           worker_id = NULL, claimed_at = NULL, claim_expires_at = NULL,
           last_error = NULL, died_at = NULL, purge_at = NULL,
           expires_at = alk._sat_add(clock, alk._sat_sub(j.expires_at, j.created_at)),
           -- Into the current slot, as requeue_dead's own (under its rotation lock).
           slot = (SELECT s.current_slot FROM alk.job_slots s)
      FROM down d
     WHERE j.id = d.job_id AND j.queue = _after_revive.queue AND j.state = 'dead'
       -- requeue_dead's dedup rule: a key a live job holds stays with it.
       AND (j.dedup_key IS NULL OR NOT EXISTS (
            SELECT FROM alk.jobs h WHERE h.queue = j.queue AND h.dedup_key = j.dedup_key
                                     AND h.state IN ('pending', 'processing')));
    GET DIAGNOSTICS revived = ROW_COUNT;
    RETURN revived;
END
$$;
COMMENT ON FUNCTION alk._after_revive(text, bigint[]) IS
'internal: requeue_dead of awaited jobs brings their dead waiters back, still waiting';

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

-- alk._job_slot(): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._job_slot()
RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT s.current_slot FROM alk.job_slots s
$$;
COMMENT ON FUNCTION alk._job_slot() IS 'internal: the rotating slot of alk.jobs that takes new jobs';

-- alk._role_functions(): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._role_functions()
RETURNS TABLE (kind text, function_name text)
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT l.kind, l.function_name FROM (VALUES
        -- every kind: the clock and the schema check a client runs at connect
        ('base', 'now'), ('base', 'pinned_clock'), ('base', 'schema_info'),
        -- reader: inspection only (pyalk status, pyalk jobs, dashboards)
        ('reader', 'get_job'), ('reader', 'list_jobs'), ('reader', 'queue_stats'), ('reader', 'next_claim_at'),
        ('reader', 'outbox_get_job'), ('reader', 'read_since'), ('reader', 'get_offset'),
        ('reader', 'stream_channel'), ('reader', 'get_lock'), ('reader', 'get_schedule'),
        ('reader', 'list_schedules'), ('reader', 'cron_next'),
        -- the dashboard's and exporter's reads (0011)
        ('reader', 'browse_jobs'), ('reader', 'browse_events'), ('reader', 'stream_stats'),
        ('reader', 'stream_consumer_lag'), ('reader', 'queue_throughput'), ('reader', 'schedule_overview'),
        ('reader', 'list_locks'),
        -- the registry of running workers (0024)
        ('reader', 'workers'),
        -- a queue's completed-job retention (0026), where its outcomes are announced (0030)
        ('reader', 'queue_retention'), ('reader', 'outcome_channel'),
        -- a queue's claim limits (0029)
        ('reader', 'queue_limits'),
        -- producer: write work and events, and look at what it wrote
        ('producer', 'enqueue'), ('producer', 'enqueue_batch'), ('producer', 'outbox_enqueue'),
        ('producer', 'outbox_enqueue_batch'), ('producer', 'publish'), ('producer', 'publish_batch'),
        ('producer', 'get_job'), ('producer', 'outbox_get_job'),
        -- wait for a job's outcome: the queue keeps it, and where it is announced (0030)
        ('producer', 'queue_retention'), ('producer', 'outcome_channel'),
        -- worker: claim and settle jobs (pyalk worker, outbox delivery),
        -- consume streams with checkpoints, hold its own locks
        ('worker', 'claim'), ('worker', 'ack'), ('worker', 'ack_batch'), ('worker', 'retry'), ('worker', 'fail'),
        ('worker', 'heartbeat'), ('worker', 'release_jobs'), ('worker', 'settle_and_claim'), ('worker', 'settle'),
        ('worker', 'snooze'),
        -- idle workers advertise themselves so enqueues wake them (docs/design.md)
        ('worker', 'wait_for_jobs'), ('worker', 'wake_fence'), ('worker', 'stop_waiting'),
        ('worker', 'next_claim_at'), ('worker', 'queue_channel'), ('worker', 'get_job'),
        -- pyalk worker checks the queue name with list_jobs(queue, n => 1) before it starts
        ('worker', 'list_jobs'),
        ('worker', 'outbox_claim'), ('worker', 'outbox_get_job'),
        ('worker', 'read_since'), ('worker', 'read_from_consumer'), ('worker', 'save_offset'),
        ('worker', 'get_offset'), ('worker', 'stream_channel'),
        ('worker', 'try_lock'), ('worker', 'renew_lock'), ('worker', 'release_lock'), ('worker', 'get_lock'),
        -- a running worker keeps its row in the registry (0024)
        ('worker', 'worker_register'), ('worker', 'worker_beat'), ('worker', 'worker_deregister'),
        -- workers rotate the job storage as they go (0028)
        ('worker', 'rotate_jobs'),
        -- admin: everything above (alk._kind_functions adds it) and these
        ('admin', 'cancel'), ('admin', 'sweep_expired'), ('admin', 'outbox_sweep_expired'), ('admin', 'trim_to'),
        ('admin', 'requeue_dead'), ('admin', 'pause_queue'), ('admin', 'resume_queue'),
        ('admin', 'set_queue_retention'), ('admin', 'set_queue_limits'),
        ('admin', 'schedule'), ('admin', 'unschedule'), ('admin', 'tick'), ('admin', 'scheduler_tick'),
        -- stop a worker from anywhere (0024)
        ('admin', 'request_stop'),
        -- the scheduler's leader loop holds the reserved lock alk:scheduler
        ('admin', '_try_lock'), ('admin', '_renew_lock'), ('admin', '_release_lock'),
        ('admin', 'grant_reader'), ('admin', 'grant_producer'), ('admin', 'grant_worker'), ('admin', 'grant_admin'),
        ('admin', 'revoke_all'), ('admin', 'role_grants'), ('admin', 'role_functions'),
        ('admin', 'limit_names'), ('admin', 'name_limits')
    ) AS l(kind, function_name)
$$;
COMMENT ON FUNCTION alk._role_functions() IS
'internal: the function names each role kind gets (base goes to every kind; admin also gets every other kind''s)';

-- alk._rotation_lock(): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._rotation_lock()
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT 27422281159569268::bigint $$;
COMMENT ON FUNCTION alk._rotation_lock() IS
'internal: the advisory lock key alk.rotate_jobs takes and keyed enqueues share';

-- alk.requeue_dead(text,bigint[]): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.requeue_dead(queue text, job_ids bigint[] DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    clock bigint := alk.now();
    moved bigint;
    awaited bigint[];
BEGIN
    PERFORM alk._check_name('queue', requeue_dead.queue);
    -- Back into the current slot, where a keyed enqueue looks for the key's
    -- holder; so, like a keyed enqueue, never beside a rotation.
    PERFORM pg_catalog.pg_advisory_xact_lock_shared(alk._rotation_lock());
    -- A fresh life: pending and due now, every attempt spent so far refunded
    -- (attempts itself stays: its tokens stay dead), no worker, no error.
    -- The stamps and priority stay. An expiring job keeps its TTL, counted
    -- again from now (else an expired job would die again at once). A dead
    -- job whose dedup key a live job holds stays dead (that work is queued
    -- already), and of several dead jobs with one key only the first moves.
    -- Two statements rather than "job_ids IS NULL OR ...", so each keeps its
    -- index (jobs_dead for a whole queue, jobs_pkey for given ids) in a
    -- generic plan.
    IF job_ids IS NULL THEN
        WITH requeued AS (
            UPDATE alk.jobs j
               SET state = 'pending', run_at = clock, attempts_refunded = j.attempts,
                   worker_id = NULL, claimed_at = NULL, claim_expires_at = NULL,
                   last_error = NULL, died_at = NULL, purge_at = NULL,
                   expires_at = alk._sat_add(clock, alk._sat_sub(j.expires_at, j.created_at)),
                   slot = (SELECT s.current_slot FROM alk.job_slots s)
             WHERE j.queue = requeue_dead.queue AND j.state = 'dead'
               AND (j.dedup_key IS NULL OR (
                    NOT EXISTS (SELECT FROM alk.jobs h WHERE h.queue = j.queue AND h.dedup_key = j.dedup_key
                                                         AND h.state IN ('pending', 'processing'))
                    AND j.id = (SELECT min(d.id) FROM alk.jobs d WHERE d.queue = j.queue AND d.dedup_key = j.dedup_key
                                                                  AND d.state = 'dead')))
            RETURNING j.id, j.awaited
        )
        SELECT count(*), array_agg(m.id) FILTER (WHERE m.awaited) INTO moved, awaited FROM requeued m;
    ELSE
        WITH requeued AS (
            UPDATE alk.jobs j
               SET state = 'pending', run_at = clock, attempts_refunded = j.attempts,
                   worker_id = NULL, claimed_at = NULL, claim_expires_at = NULL,
                   last_error = NULL, died_at = NULL, purge_at = NULL,
                   expires_at = alk._sat_add(clock, alk._sat_sub(j.expires_at, j.created_at)),
                   slot = (SELECT s.current_slot FROM alk.job_slots s)
             WHERE j.queue = requeue_dead.queue AND j.state = 'dead' AND j.id = ANY (job_ids)
               AND (j.dedup_key IS NULL OR (
                    NOT EXISTS (SELECT FROM alk.jobs h WHERE h.queue = j.queue AND h.dedup_key = j.dedup_key
                                                         AND h.state IN ('pending', 'processing'))
                    AND j.id = (SELECT min(d.id) FROM alk.jobs d WHERE d.queue = j.queue AND d.dedup_key = j.dedup_key
                                                                  AND d.state = 'dead' AND d.id = ANY (job_ids))))
            RETURNING j.id, j.awaited
        )
        SELECT count(*), array_agg(m.id) FILTER (WHERE m.awaited) INTO moved, awaited FROM requeued m;
    END IF;
    -- The jobs enqueued after these come back too, waiting (35_after.sql).
    IF awaited IS NOT NULL THEN
        moved := moved + alk._after_revive(requeue_dead.queue, awaited);
    END IF;
    IF moved > 0 THEN
        PERFORM alk._wake(requeue_dead.queue);
    END IF;
    RETURN moved;
END
$$;
COMMENT ON FUNCTION alk.requeue_dead(text, bigint[]) IS
'Send dead jobs back to pending (completed jobs are never touched), due now, with every attempt spent so far refunded (attempts_refunded = attempts, '
'so the job has max_attempts again and no earlier fencing token becomes valid), no worker and no last_error; every '
'dead job of the queue when job_ids is NULL, else those of job_ids that are dead in this queue (others are ignored). '
'A dead job whose dedup_key a live job holds stays dead (of several with one key, the first moves). An expiring job '
'gets its TTL again from now. Dead jobs enqueued after a moved job (alk.enqueue''s after, transitively) move too and '
'wait for it again. Returns how many moved; idle workers are woken. '
'Example: SELECT alk.requeue_dead(''emails''); SELECT alk.requeue_dead(''emails'', ARRAY[41, 42]);';

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

-- hand-written: the partitioned table (as sql/queue/10_table.sql has it), every row moved over, the id sequence
-- continued, the old table dropped.
CREATE TABLE alk.jobs (
    id bigint GENERATED ALWAYS AS IDENTITY,
    queue text NOT NULL,
    state text NOT NULL DEFAULT 'pending',
    payload jsonb NOT NULL,
    priority bigint NOT NULL,
    run_at bigint NOT NULL,
    -- The fencing token: +1 per claim, never decreases, so a token once
    -- issued is never valid again (not after release_jobs or requeue_dead).
    attempts bigint NOT NULL DEFAULT 0,
    max_attempts bigint NOT NULL,
    worker_id text,
    claimed_at bigint,
    claim_expires_at bigint,
    created_at bigint NOT NULL,
    expires_at bigint,
    visibility_timeout_s bigint NOT NULL,
    backoff_base_s bigint NOT NULL,
    dead_letter_retention_s bigint,
    last_error text,
    died_at bigint,
    -- When a dead or completed row's retention ends (alk._purge_at); NULL:
    -- kept forever.
    purge_at bigint,
    -- While a live (pending or processing) job holds it, an enqueue with the
    -- same key in the same queue writes nothing (jobs_dedup). NULL: no dedup.
    dedup_key text,
    -- Claims given back (release_jobs: one; requeue_dead: all). The attempts
    -- a job has spent, which claimability, burial and backoff count, are
    -- attempts - attempts_refunded.
    attempts_refunded bigint NOT NULL DEFAULT 0,
    -- Opaque metadata that travels with the job (trace context, correlation
    -- ids): a JSON object or NULL, as enqueued.
    headers jsonb,
    -- What the ack stored, and when: completed rows only (queue_settings).
    result jsonb,
    completed_at bigint,
    -- Dependencies (alk.enqueue's after; 0028): how many listed jobs this one
    -- still waits for (its rows in alk.job_after). Only a job at 0 is in
    -- jobs_claim_pending, so waiting jobs cost a claim nothing.
    after_left bigint NOT NULL DEFAULT 0,
    -- Some job was enqueued after this one: its ack, cancel, completion or
    -- death looks in alk.job_after (alk._after_sync); unset, it never does.
    awaited boolean NOT NULL DEFAULT false,
    -- The job's serial group (alk.set_queue_limits' max_running_per_group):
    -- at most that many (default 1) of a queue's jobs with one key run at a
    -- time. NULL: no group.
    group_key text,
    -- The partition the row sits in (alk.job_slots): 0 or 1 for the rotating
    -- slots, 2 for dead and completed rows a rotation moved out of them.
    slot bigint NOT NULL DEFAULT alk._job_slot(),
    -- The key holds the queue so the table can be hash-distributed by queue,
    -- and the slot because a partitioned table's key must; id leads it so ops
    -- by id (ack, retry, ...) are one probe of each slot's index.
    CONSTRAINT jobs_pkey PRIMARY KEY (id, queue, slot),
    CONSTRAINT jobs_state_known CHECK (state IN ('pending', 'processing', 'dead', 'completed')),
    CONSTRAINT jobs_queue_named CHECK (queue <> '')
    -- Cross-column rules (a processing job has a lease, a dead one died_at,
    -- a completed one completed_at)
    -- are the functions' to keep: CHECKs cost every insert and claim ~10 us
    -- each, and the table has no other writer. The SQL tests pin them.
) PARTITION BY LIST (slot);
COMMENT ON TABLE alk.jobs IS 'Every job of every queue. Private: use the alk.* functions.';
CREATE TABLE alk.jobs_0 PARTITION OF alk.jobs FOR VALUES IN (0);
COMMENT ON TABLE alk.jobs_0 IS 'Rotating slot 0 of alk.jobs (alk.rotate_jobs). Private: use the alk.* functions.';
CREATE TABLE alk.jobs_1 PARTITION OF alk.jobs FOR VALUES IN (1);
COMMENT ON TABLE alk.jobs_1 IS 'Rotating slot 1 of alk.jobs (alk.rotate_jobs). Private: use the alk.* functions.';
CREATE TABLE alk.jobs_kept PARTITION OF alk.jobs FOR VALUES IN (2);
COMMENT ON TABLE alk.jobs_kept IS
'Dead and completed jobs a rotation moved out of the rotating slots. Private: use the alk.* functions.';

-- The claim path: due pending jobs in claim order. Partial, so processing
-- and dead rows, and pending jobs still waiting on their after jobs, never
-- cost a claim anything.
CREATE INDEX jobs_claim_pending ON alk.jobs (queue, priority DESC, run_at, id)
    WHERE state = 'pending' AND after_left = 0;
-- Pending jobs waiting on their after jobs (0028): queue_stats counts them
-- as scheduled; empty unless dependencies are used.
CREATE INDEX jobs_after_waiting ON alk.jobs (queue, run_at) WHERE state = 'pending' AND after_left > 0;
-- Lapsed leases (crashed workers) are found by their deadline.
CREATE INDEX jobs_claim_lapsed ON alk.jobs (queue, claim_expires_at) WHERE state = 'processing';
-- Expiry and retention sweeps.
CREATE INDEX jobs_expiring ON alk.jobs (queue, expires_at) WHERE expires_at IS NOT NULL AND state <> 'dead';
-- Dead rows, by the end of their retention: the sweep reads only those due.
CREATE INDEX jobs_dead ON alk.jobs (queue, purge_at) WHERE state = 'dead';
-- Completed rows, the same way. Its own index rather than jobs_dead widened:
-- queue_stats counts each state index-only from its own partial index, and a
-- queue without retention never writes an entry here.
CREATE INDEX jobs_completed ON alk.jobs (queue, purge_at) WHERE state = 'completed';
-- One live job per dedup key and queue; dead and completed rows keep their
-- key for inspection without holding it. Enqueues insert with ON CONFLICT on
-- it, so concurrent enqueues of one key leave one row, never a
-- read-then-write race. A partitioned table's unique index must hold the
-- slot: it is unique per slot, and one slot holds every live keyed job
-- because a keyed enqueue and a rotation never overlap (alk._rotation_lock).
CREATE UNIQUE INDEX jobs_dedup ON alk.jobs (queue, dedup_key, slot)
    WHERE dedup_key IS NOT NULL AND state IN ('pending', 'processing');

-- Serial groups (40_claim.sql): a grouped candidate is claimable only while
-- its group has room, which the claim asks of these two, per candidate. Both
-- partial on group_key IS NOT NULL, so queues without groups never write an
-- entry. Processing jobs by group: is the group busy?
CREATE INDEX jobs_group_running ON alk.jobs (queue, group_key) WHERE state = 'processing' AND group_key IS NOT NULL;
-- Pending jobs by group in claim order: is a due job of the group ahead?
-- Jobs waiting on their after jobs are never ahead (alk._group_has_room).
CREATE INDEX jobs_group_pending ON alk.jobs (queue, group_key, priority DESC, run_at, id)
    WHERE state = 'pending' AND group_key IS NOT NULL AND after_left = 0;

-- A slot drains and refills all day: vacuum it early and often so dead
-- index entries from claims and acks do not pile up between rotations.
-- (Storage parameters are the partitions', not the parent's.)
ALTER TABLE alk.jobs_0 SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 500,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02
);
ALTER TABLE alk.jobs_1 SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 500,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02
);

-- Live rows into slot 0 (the current one), dead and completed rows into the kept slot.
INSERT INTO alk.jobs (id, queue, state, payload, priority, run_at, attempts, max_attempts, worker_id, claimed_at, claim_expires_at, created_at, expires_at, visibility_timeout_s, backoff_base_s, dead_letter_retention_s, last_error, died_at, purge_at, dedup_key, attempts_refunded, headers, result, completed_at, after_left, awaited, group_key, slot) OVERRIDING SYSTEM VALUE
SELECT id, queue, state, payload, priority, run_at, attempts, max_attempts, worker_id, claimed_at, claim_expires_at, created_at, expires_at, visibility_timeout_s, backoff_base_s, dead_letter_retention_s, last_error, died_at, purge_at, dedup_key, attempts_refunded, headers, result, completed_at, after_left, awaited, group_key, CASE WHEN state IN ('pending', 'processing') THEN 0 ELSE 2 END
  FROM alk.jobs_before_0031;
SELECT pg_catalog.setval('alk.jobs_id_seq', s.last_value, s.is_called) FROM alk.jobs_before_0031_id_seq s;
DROP TABLE alk.jobs_before_0031;

-- alk._holds(alk.jobs,text,bigint,bigint): unchanged, created again on the new row type
CREATE FUNCTION alk._holds(job alk.jobs, worker_id text, attempt bigint, clock bigint)
RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT pg_catalog.texteq(job.state, 'processing')
       AND job.worker_id OPERATOR(pg_catalog.=) worker_id
       AND (attempt IS NULL OR job.attempts OPERATOR(pg_catalog.=) attempt)
       AND job.claim_expires_at OPERATOR(pg_catalog.>=) clock
       AND (NOT alk._limits_active() OR alk._in_scope(job.queue))
$$;
COMMENT ON FUNCTION alk._holds(alk.jobs, text, bigint, bigint) IS 'internal: the claimed-job validity predicate (name limits included: a job outside them is never held)';

-- The trigger of 0030 went with the old table: on the new one, as sql/queue/65_outcome.sql has it.
CREATE TRIGGER jobs_outcome AFTER UPDATE OF died_at, completed_at ON alk.jobs
    FOR EACH ROW WHEN (NEW.state IN ('completed', 'dead') AND OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION alk._notify_outcome();
COMMENT ON TRIGGER jobs_outcome ON alk.jobs IS
'Announces completed and dead jobs of queues that keep completed jobs on alk.outcome_channel (alk._notify_outcome).';

SELECT alk._regrant();

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
