-- pyalk 0009: queue semantics in SQL, dedup keys, pause, release, batch
-- settlement and idle-only wake-ups (issues 11 and 12; docs/queue.md,
-- docs/design.md "Wake-ups"). The rules live in sql/queue.sql and
-- sql/outbox.sql; this file moves an installed schema there.
--
-- Breaking for older clients (alk.schema_info: breaking_since 0009):
--   * get_job and outbox_get_job return SETOF alk.job (zero rows when
--     missing) instead of a composite of NULLs;
--   * alk.job and queue_stat gain columns; priority, attempts and
--     max_attempts are bigint;
--   * enqueues notify only workers that advertise themselves idle
--     (alk.wait_for_jobs): a bare LISTEN is no longer woken;
--   * requeue_dead refunds attempts instead of resetting them, so a fencing
--     token once issued is never valid again.

-- one integer width; dedup keys; refunded attempts ------------------------------

ALTER TABLE alk.jobs
    ALTER COLUMN priority TYPE bigint,
    ALTER COLUMN attempts TYPE bigint,
    ALTER COLUMN max_attempts TYPE bigint,
    ADD COLUMN dedup_key text,
    ADD COLUMN attempts_refunded bigint NOT NULL DEFAULT 0;

ALTER TYPE alk.job
    ALTER ATTRIBUTE priority TYPE bigint,
    ALTER ATTRIBUTE attempts TYPE bigint,
    ALTER ATTRIBUTE max_attempts TYPE bigint,
    ADD ATTRIBUTE dedup_key text,
    ADD ATTRIBUTE attempts_refunded bigint;

CREATE UNIQUE INDEX jobs_dedup ON alk.jobs (queue, dedup_key) WHERE dedup_key IS NOT NULL AND state <> 'dead';

-- pause; idle adverts ---------------------------------------------------------

CREATE TABLE alk.paused_queues (
    queue text NOT NULL,
    paused_at bigint NOT NULL,
    CONSTRAINT paused_queues_pkey PRIMARY KEY (queue)
);
COMMENT ON TABLE alk.paused_queues IS 'Queues whose claims return nothing until resumed. Private: use alk.pause_queue.';

CREATE UNLOGGED TABLE alk.idle_workers (
    queue text NOT NULL,
    worker_id text NOT NULL,
    pid integer NOT NULL,
    since bigint NOT NULL,
    CONSTRAINT idle_workers_pkey PRIMARY KEY (queue, worker_id)
);
COMMENT ON TABLE alk.idle_workers IS 'Workers waiting idle for a queue''s NOTIFY. Private: use alk.wait_for_jobs.';

-- result shapes ---------------------------------------------------------------

CREATE TYPE alk.settle_claim_row AS (
    kind text,
    id bigint,
    queue text,
    state text,
    payload jsonb,
    priority bigint,
    run_at bigint,
    attempts bigint,
    max_attempts bigint,
    worker_id text,
    claimed_at bigint,
    claim_expires_at bigint,
    created_at bigint,
    expires_at bigint,
    visibility_timeout_s bigint,
    backoff_base_s bigint,
    dead_letter_retention_s bigint,
    last_error text,
    died_at bigint,
    dedup_key text,
    attempts_refunded bigint
);
COMMENT ON TYPE alk.settle_claim_row IS
'A row of alk.settle_and_claim: kind ''settled'' (id, queue, attempts = the token given, state = what it led to or '
'NULL when refused) or ''claimed'' (a whole alk.job).';

-- Signatures and result types that change: drop, then create below.
DROP FUNCTION alk.enqueue(text, jsonb, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint);
DROP FUNCTION alk.enqueue_batch(text, jsonb[], bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint);
DROP FUNCTION alk.outbox_enqueue(text, jsonb, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint);
DROP FUNCTION alk.get_job(text, bigint);
DROP FUNCTION alk.outbox_get_job(text, bigint);
DROP FUNCTION alk._get_job(text, bigint);
DROP FUNCTION alk.queue_stats(text);
DROP TYPE alk.queue_stat;

CREATE TYPE alk.queue_stat AS (
    queue text,
    pending bigint,
    ready bigint,
    scheduled bigint,
    processing bigint,
    lapsed bigint,
    dead bigint,
    oldest_ready_age_s bigint,
    next_run_at bigint,
    paused boolean
);
COMMENT ON TYPE alk.queue_stat IS 'One queue''s row of alk.queue_stats.';

-- functions, as in the current files ---------------------------------------------

CREATE OR REPLACE FUNCTION alk._channel(prefix text, name text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT prefix OPERATOR(pg_catalog.||) pg_catalog.left(pg_catalog.encode(
        pg_catalog.sha256(pg_catalog.convert_to(name, 'UTF8')), 'hex'), 32)
$$;
COMMENT ON FUNCTION alk._channel(text, text) IS 'internal: a NOTIFY channel name for a queue or stream name';

CREATE OR REPLACE FUNCTION alk._claim(queue text, worker_id text, n bigint)
RETURNS SETOF alk.job
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
-- The candidate queries always walk jobs_claim_pending in claim order; a
-- custom plan per call bought nothing but planning time (0.55 ms against
-- 0.25 ms per claim at 10^4+ pending, measured), whatever the statistics say.
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    clock bigint := alk.now();
    wid text := alk._name_ok('worker_id', worker_id, true);
    wanted bigint := n;
    picked bigint[];
    claimed bigint;
BEGIN
    -- An extent: n <= 0 (or NULL) claims nothing.
    IF wanted IS NULL OR wanted <= 0 THEN
        RETURN;
    END IF;
    LOOP
        -- Lock the first due rows in claim order from both sources: pending
        -- rows whose run_at has come, and processing rows whose lease lapsed.
        -- Due rows without walking future ones: a loose index scan visits
        -- each distinct pending priority in claim order (one probe each);
        -- within a priority jobs_claim_pending is in run_at order, so
        -- run_at <= clock is an index bound that stops at the first future
        -- row. The nested loop is pulled lazily under the LIMIT: once wanted
        -- rows are found, lower priorities are neither probed nor locked.
        WITH RECURSIVE priorities(priority) AS (
            (SELECT j.priority FROM alk.jobs j
              WHERE j.queue = _claim.queue AND j.state = 'pending'
              ORDER BY j.priority DESC LIMIT 1)
            UNION ALL
            SELECT (SELECT j.priority FROM alk.jobs j
                     WHERE j.queue = _claim.queue AND j.state = 'pending' AND j.priority < p.priority
                     ORDER BY j.priority DESC LIMIT 1)
              FROM priorities p WHERE p.priority IS NOT NULL
        ), due AS (
            SELECT d.id, d.priority, d.run_at
              FROM priorities p
             CROSS JOIN LATERAL (
                SELECT j.id, j.priority, j.run_at FROM alk.jobs j
                 WHERE j.queue = _claim.queue AND j.state = 'pending'
                   AND j.priority = p.priority AND j.run_at <= clock
                 ORDER BY j.priority DESC, j.run_at, j.id
                 LIMIT wanted
                   FOR UPDATE SKIP LOCKED) d
             WHERE p.priority IS NOT NULL
             LIMIT wanted
        ), lapsed AS (
            SELECT j.id, j.priority, j.run_at FROM alk.jobs j
             WHERE j.queue = _claim.queue AND j.state = 'processing' AND j.claim_expires_at < clock
             ORDER BY j.priority DESC, j.run_at, j.id
             LIMIT wanted
               FOR UPDATE SKIP LOCKED
        )
        SELECT array_agg(c.id ORDER BY c.priority DESC, c.run_at, c.id) INTO picked
          FROM (SELECT * FROM due UNION ALL SELECT * FROM lapsed
                ORDER BY priority DESC, run_at, id LIMIT wanted) c
         -- A paused queue claims nothing: one primary-key probe of a tiny
         -- table, a one-time filter that runs before any row is locked (in
         -- this statement rather than its own: one statement less per claim).
         WHERE NOT EXISTS (SELECT FROM alk.paused_queues p WHERE p.queue = _claim.queue);
        EXIT WHEN picked IS NULL;

        -- One update claims the live rows and buries the due rows that can
        -- no longer run (out of attempts, or expired). Attempts spent are
        -- attempts - attempts_refunded; attempts itself only grows (the
        -- fencing token).
        RETURN QUERY
        WITH moved AS (
            UPDATE alk.jobs j
               SET state = CASE WHEN j.attempts - j.attempts_refunded >= j.max_attempts OR j.expires_at <= clock THEN 'dead' ELSE 'processing' END,
                   died_at = CASE WHEN j.attempts - j.attempts_refunded >= j.max_attempts OR j.expires_at <= clock THEN clock END,
                   purge_at = CASE WHEN j.attempts - j.attempts_refunded >= j.max_attempts OR j.expires_at <= clock THEN alk._purge_at(clock, j.dead_letter_retention_s) END,
                   last_error = CASE WHEN j.attempts - j.attempts_refunded >= j.max_attempts THEN 'max attempts exceeded'
                                     WHEN j.expires_at <= clock THEN 'expired' END,
                   worker_id = CASE WHEN j.attempts - j.attempts_refunded >= j.max_attempts OR j.expires_at <= clock THEN j.worker_id ELSE wid END,
                   claimed_at = CASE WHEN j.attempts - j.attempts_refunded >= j.max_attempts OR j.expires_at <= clock THEN j.claimed_at ELSE clock END,
                   claim_expires_at = CASE WHEN j.attempts - j.attempts_refunded >= j.max_attempts OR j.expires_at <= clock THEN j.claim_expires_at
                                           ELSE alk._sat_add(clock, j.visibility_timeout_s) END,
                   attempts = CASE WHEN j.attempts - j.attempts_refunded >= j.max_attempts OR j.expires_at <= clock THEN j.attempts ELSE j.attempts + 1 END
             WHERE j.id = ANY (picked) AND j.queue = _claim.queue
            RETURNING j.*
        )
        SELECT c.id, c.queue, c.state, c.payload, c.priority, c.run_at, c.attempts, c.max_attempts, c.worker_id,
               c.claimed_at, c.claim_expires_at, c.created_at, c.expires_at, c.visibility_timeout_s,
               c.backoff_base_s, c.dead_letter_retention_s, c.last_error, c.died_at, c.dedup_key,
               c.attempts_refunded
          FROM moved c
         WHERE c.state = 'processing'
         ORDER BY c.priority DESC, c.run_at, c.id;
        GET DIAGNOSTICS claimed = ROW_COUNT;
        wanted := wanted - claimed;
        -- Only burying leaves room to look again; otherwise the queue is empty
        -- of claimable rows (or we have enough).
        EXIT WHEN cardinality(picked) = claimed OR wanted <= 0;
    END LOOP;
END
$$;
COMMENT ON FUNCTION alk._claim(text, text, bigint) IS 'internal: the claim rule for an already validated queue name';

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
    -- for it. A later statement than the insert: a fresh snapshot under
    -- READ COMMITTED (the protocol in the wake-ups section above).
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed'
       OR EXISTS (SELECT FROM alk.idle_workers w WHERE w.queue = _enqueue.queue) THEN
        PERFORM pg_catalog.pg_notify(alk._queue_channel(_enqueue.queue), '');
    END IF;
END
$$;
COMMENT ON FUNCTION alk._enqueue(text, jsonb[], bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint) IS
'internal: insert jobs with resolved stamps and wake idle workers; the batch forms and the scheduler call it';

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
    -- for it. A later statement than the insert: a fresh snapshot under
    -- READ COMMITTED (the protocol in the wake-ups section above).
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed'
       OR EXISTS (SELECT FROM alk.idle_workers w WHERE w.queue = p_queue) THEN
        PERFORM pg_catalog.pg_notify(alk._queue_channel(p_queue), '');
    END IF;
    RETURN v_id;
END
$$;
COMMENT ON FUNCTION alk._enqueue_one(text, jsonb, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, text) IS
'internal: insert one job with resolved stamps (or return the live holder of its dedup key) and wake idle workers';

CREATE OR REPLACE FUNCTION alk._get_job(queue text, job_id bigint)
RETURNS SETOF alk.job
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
ROWS 1
AS $$
    SELECT j.id, j.queue, j.state, j.payload, j.priority, j.run_at, j.attempts, j.max_attempts, j.worker_id,
           j.claimed_at, j.claim_expires_at, j.created_at, j.expires_at, j.visibility_timeout_s,
           j.backoff_base_s, j.dead_letter_retention_s, j.last_error, j.died_at, j.dedup_key,
           j.attempts_refunded
      FROM alk.jobs j WHERE j.queue = $1 AND j.id = $2
$$;
COMMENT ON FUNCTION alk._get_job(text, bigint) IS 'internal: get_job for an already validated queue name';

CREATE OR REPLACE FUNCTION alk._name_ok(argument text, value text, reserved_ok boolean)
RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE
        WHEN value OPERATOR(pg_catalog.<>) ''
         AND pg_catalog.octet_length(value) OPERATOR(pg_catalog.<=) 1024
         AND (reserved_ok OR NOT pg_catalog.starts_with(value, 'alk:'))
            THEN value
        ELSE alk._check_name(argument, value, reserved_ok)
    END
$$;
COMMENT ON FUNCTION alk._name_ok(text, text, boolean) IS 'internal: value when it is a valid name, else the LK001 of alk._check_name (inlinable)';

CREATE OR REPLACE FUNCTION alk._queue_channel(queue text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT alk._channel('alk_q_', $1)
$$;
COMMENT ON FUNCTION alk._queue_channel(text) IS 'internal: the NOTIFY channel of a queue (no name check)';

CREATE OR REPLACE FUNCTION alk._settle(queue text, worker_id text, job_ids bigint[], attempts bigint[], outcomes text[],
                            errs text[], delays bigint[])
RETURNS TABLE (job_id bigint, attempt bigint, state text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    clock bigint := alk.now();
    wid text := alk._name_ok('worker_id', _settle.worker_id, true);
    k bigint := coalesce(cardinality(_settle.job_ids), 0);
    bad bigint;
BEGIN
    IF (_settle.attempts IS NOT NULL AND cardinality(_settle.attempts) <> k)
       OR (_settle.outcomes IS NOT NULL AND cardinality(_settle.outcomes) <> k)
       OR (_settle.errs IS NOT NULL AND cardinality(_settle.errs) <> k)
       OR (_settle.delays IS NOT NULL AND cardinality(_settle.delays) <> k) THEN
        PERFORM alk._raise('LK002', 'attempts, outcomes, errs and delays must each be NULL or have one entry per '
            || 'job id: got ' || k || ' job_ids, ' || coalesce(cardinality(_settle.attempts)::text, 'NULL')
            || ' attempts, ' || coalesce(cardinality(_settle.outcomes)::text, 'NULL') || ' outcomes, '
            || coalesce(cardinality(_settle.errs)::text, 'NULL') || ' errs and '
            || coalesce(cardinality(_settle.delays)::text, 'NULL') || ' delays');
    END IF;
    -- NULL outcomes (all ack, a batching worker's usual call): nothing to
    -- check, and no statement spent on it.
    IF _settle.outcomes IS NOT NULL THEN
        SELECT min(o.ord) INTO bad FROM unnest(_settle.outcomes) WITH ORDINALITY AS o(outcome, ord)
         WHERE o.outcome IS NULL OR o.outcome NOT IN ('ack', 'retry', 'fail');
    END IF;
    IF bad IS NOT NULL THEN
        PERFORM alk._raise('LK002', 'outcome ' || bad || ' must be ''ack'', ''retry'' or ''fail'', got '
            || alk._show(_settle.outcomes[bad]));
    END IF;
    IF k = 0 THEN
        RETURN;
    END IF;
    IF _settle.outcomes IS NULL THEN
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
            DELETE FROM alk.jobs j USING first f
             WHERE j.id = f.id AND (_settle.queue IS NULL OR j.queue = _settle.queue)
               AND alk._holds(j, wid, f.attempt, clock)
            RETURNING j.id
        )
        SELECT i.id, i.attempt, CASE WHEN a.id IS NOT NULL THEN 'acked' END
          FROM input i
          LEFT JOIN first f ON f.ord = i.ord
          LEFT JOIN acked a ON a.id = f.id
         ORDER BY i.ord;
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
         WHERE f.outcome = 'ack' AND j.id = f.id AND (_settle.queue IS NULL OR j.queue = _settle.queue)
           AND alk._holds(j, wid, f.attempt, clock)
        RETURNING j.id, 'acked'::text AS state
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
         WHERE f.outcome <> 'ack' AND j.id = f.id AND (_settle.queue IS NULL OR j.queue = _settle.queue)
           AND alk._holds(j, wid, f.attempt, clock)
        RETURNING j.id, j.state
    ), done AS (
        SELECT a.id, a.state FROM acked a UNION ALL SELECT m.id, m.state FROM moved m
    )
    SELECT i.id, i.attempt, d.state
      FROM input i
      LEFT JOIN first f ON f.ord = i.ord
      LEFT JOIN done d ON d.id = f.id
     ORDER BY i.ord;
END
$$;
COMMENT ON FUNCTION alk._settle(text, text, bigint[], bigint[], text[], text[], bigint[]) IS
'internal: the settlement rule (ack, retry, fail) for a batch; queue NULL: any queue';

CREATE OR REPLACE FUNCTION alk._wake(queue text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- Called in a statement after the insert (see above): a fresh snapshot
    -- under READ COMMITTED. alk._enqueue and alk._enqueue_one write this
    -- check out inline (no call frame per enqueue): change all three.
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed'
       OR EXISTS (SELECT FROM alk.idle_workers w WHERE w.queue = _wake.queue) THEN
        PERFORM pg_catalog.pg_notify(alk._queue_channel(_wake.queue), '');
    END IF;
END
$$;
COMMENT ON FUNCTION alk._wake(text) IS
'internal: notify the queue''s channel when a worker waits idle on it (or the isolation level is above READ COMMITTED)';

CREATE OR REPLACE FUNCTION alk.ack(job_id bigint, worker_id text, attempt bigint DEFAULT NULL, queue text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock bigint := alk.now();
    wid text := alk._name_ok('worker_id', ack.worker_id, true);
BEGIN
    DELETE FROM alk.jobs j
     WHERE j.id = job_id AND (ack.queue IS NULL OR j.queue = ack.queue)
       AND alk._holds(j, wid, attempt, clock);
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION alk.ack(bigint, text, bigint, text) IS
'Acknowledge a claimed job: it is deleted. False, and nothing changes, unless the job is processing, held by worker_id '
'under claim attempt (the fencing token the claim returned; NULL skips that check) and its lease has not lapsed '
'(claim_expires_at >= now). worker_id follows the name rule (LK001). queue is optional routing for sharded deployments. '
'Example: SELECT alk.ack(job_id => 42, worker_id => ''worker-1'', attempt => 1);';

CREATE OR REPLACE FUNCTION alk.ack_batch(job_ids bigint[], worker_id text, attempts bigint[] DEFAULT NULL, queue text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock bigint := alk.now();
    wid text := alk._name_ok('worker_id', ack_batch.worker_id, true);
    acked bigint;
BEGIN
    IF attempts IS NOT NULL AND cardinality(attempts) <> cardinality(job_ids) THEN
        PERFORM alk._raise('LK002', 'attempts must have one entry per job id: got ' || cardinality(job_ids)
            || ' job_ids and ' || cardinality(attempts) || ' attempts');
    END IF;
    DELETE FROM alk.jobs j
     USING unnest(ack_batch.job_ids, ack_batch.attempts) AS w(id, attempt)
     WHERE j.id = w.id AND (ack_batch.queue IS NULL OR j.queue = ack_batch.queue)
       AND alk._holds(j, wid, w.attempt, clock);
    GET DIAGNOSTICS acked = ROW_COUNT;
    RETURN acked;
END
$$;
COMMENT ON FUNCTION alk.ack_batch(bigint[], text, bigint[], text) IS
'Acknowledge several claimed jobs in one call; returns how many were validly held (and are now deleted). '
'attempts, when given, holds each job''s fencing token in the same order. '
'Example: SELECT alk.ack_batch(ARRAY[41, 42], ''worker-1'', ARRAY[1, 1]);';

CREATE OR REPLACE FUNCTION alk.claim(queue text, worker_id text, n bigint DEFAULT 1)
RETURNS SETOF alk.job
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT * FROM alk._claim(alk._name_ok('queue', $1, false), $2, $3)
$$;
COMMENT ON FUNCTION alk.claim(text, text, bigint) IS
'Claim up to n due jobs for worker_id, in order priority DESC, run_at, id. Each claimed job is processing, '
'leased until now + visibility_timeout_s, with attempts + 1 (the fencing token for ack/retry/fail/heartbeat). '
'Due jobs out of attempts (attempts - attempts_refunded >= max_attempts) or past expiry become dead instead. '
'n <= 0 claims nothing; a paused queue (alk.pause_queue) claims nothing. '
'Example: SELECT id, attempts, payload FROM alk.claim(''emails'', ''worker-1'', 10);';

CREATE OR REPLACE FUNCTION alk.enqueue(
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
    dedup_key text DEFAULT NULL
)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT alk._enqueue_one(alk._name_ok('queue', $1, false), $2, alk.now(), $3, $4, coalesce($5, 0),
                            coalesce($6, 3), $7, coalesce($8, 300), coalesce($9, 5), $10, $11)
$$;
COMMENT ON FUNCTION alk.enqueue(text, jsonb, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, text) IS
'Enqueue one job; returns its id. Ready time: delay (seconds from now) wins over run_at (absolute unix seconds); '
'neither means now. expires is a TTL in seconds from now. Stamps default to 300 s visibility, 3 attempts, 5 s backoff base, '
'dead rows kept forever. dedup_key: while a live (pending or processing) job of this queue holds the key, nothing is '
'written and that job''s id is returned; NULL: no dedup. '
'Example: SELECT alk.enqueue(queue => ''emails'', payload => ''{"to": 1}'', delay => 30, dedup_key => ''welcome:1'');';

CREATE OR REPLACE FUNCTION alk.enqueue_batch(
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
    dedup_keys text[] DEFAULT NULL
)
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock bigint := alk.now();
    q text := alk._name_ok('queue', enqueue_batch.queue, false);
BEGIN
    IF dedup_keys IS NULL THEN
        RETURN QUERY SELECT * FROM alk._enqueue(q, payloads, clock,
            delay, enqueue_batch.run_at, enqueue_batch.priority, enqueue_batch.max_attempts,
            expires, enqueue_batch.visibility_timeout_s, enqueue_batch.backoff_base_s,
            enqueue_batch.dead_letter_retention_s, 300, 3, 5);
        RETURN;
    END IF;
    PERFORM alk._check_payloads(payloads);
    IF cardinality(dedup_keys) <> cardinality(payloads) THEN
        PERFORM alk._raise('LK002', 'dedup_keys must have one entry per payload: got ' || cardinality(payloads)
            || ' payloads and ' || cardinality(dedup_keys) || ' dedup_keys');
    END IF;
    -- One at a time, in input order: a key repeated within the batch is
    -- held by its first occurrence, whose id the later ones return.
    FOR i IN 1 .. cardinality(payloads) LOOP
        RETURN NEXT alk._enqueue_one(q, payloads[i], clock, delay, enqueue_batch.run_at,
            coalesce(enqueue_batch.priority, 0), coalesce(enqueue_batch.max_attempts, 3), expires,
            coalesce(enqueue_batch.visibility_timeout_s, 300), coalesce(enqueue_batch.backoff_base_s, 5),
            enqueue_batch.dead_letter_retention_s, dedup_keys[i]);
    END LOOP;
END
$$;
COMMENT ON FUNCTION alk.enqueue_batch(text, jsonb[], bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, text[]) IS
'Enqueue several jobs in one call with the same options; returns their ids in input order. dedup_keys, when given, '
'holds one key (or NULL) per payload, with alk.enqueue''s rule: a key held by a live job, or by an earlier payload of '
'the same batch, writes nothing and returns the holder''s id. '
'Example: SELECT * FROM alk.enqueue_batch(''emails'', ARRAY[''{"to": 1}'', ''{"to": 2}'']::jsonb[], priority => 5);';

CREATE OR REPLACE FUNCTION alk.fail(job_id bigint, worker_id text, attempt bigint DEFAULT NULL, err text DEFAULT NULL,
                         queue text DEFAULT NULL)
RETURNS boolean
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT s.state IS NOT NULL
      FROM alk._settle($5, $2, ARRAY[$1], ARRAY[$3], ARRAY['fail'], ARRAY[$4], NULL) s
$$;
COMMENT ON FUNCTION alk.fail(bigint, text, bigint, text, text) IS
'Fail a claimed job for good: dead with last_error = err (or ''failed''). False, and nothing changes, when the claim '
'is no longer valid (see alk.ack). Example: SELECT alk.fail(42, ''worker-1'', 1, ''bad address'');';

CREATE OR REPLACE FUNCTION alk.get_job(queue text, job_id bigint)
RETURNS SETOF alk.job
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
ROWS 1
AS $$
    SELECT * FROM alk._get_job(alk._name_ok('queue', $1, false), $2)
$$;
COMMENT ON FUNCTION alk.get_job(text, bigint) IS
'The whole job row in any state, dead included; no row when there is no such job (NULL as a scalar subquery). '
'Example: SELECT * FROM alk.get_job(''emails'', 42); SELECT (SELECT alk.get_job(''emails'', 42)) IS NULL;';

CREATE OR REPLACE FUNCTION alk.heartbeat(job_id bigint, worker_id text, attempt bigint DEFAULT NULL, extend bigint DEFAULT NULL,
                              queue text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock bigint := alk.now();
    wid text := alk._name_ok('worker_id', heartbeat.worker_id, true);
BEGIN
    UPDATE alk.jobs j
       SET claim_expires_at = alk._sat_add(clock, coalesce(extend, j.visibility_timeout_s))
     WHERE j.id = job_id AND (heartbeat.queue IS NULL OR j.queue = heartbeat.queue)
       AND alk._holds(j, wid, attempt, clock);
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION alk.heartbeat(bigint, text, bigint, bigint, text) IS
'Extend a claimed job''s lease to now + extend seconds (the row''s visibility_timeout_s when NULL). True when the '
'claim was valid at call time; a negative extend leaves a lapsed lease that voids the claim on the next op. '
'Example: SELECT alk.heartbeat(42, ''worker-1'', 1, 600);';

CREATE OR REPLACE FUNCTION alk.list_jobs(queue text, state text DEFAULT NULL, n bigint DEFAULT 100, after_id bigint DEFAULT NULL)
RETURNS SETOF alk.job
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
BEGIN
    PERFORM alk._check_name('queue', list_jobs.queue);
    IF state IS NOT NULL AND state NOT IN ('pending', 'processing', 'dead') THEN
        PERFORM alk._raise('LK002', 'state must be pending, processing, dead or NULL, got ' || alk._show(state));
    END IF;
    -- An extent: n <= 0 (or NULL) lists nothing, never "all rows".
    IF n IS NULL OR n <= 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT j.id, j.queue, j.state, j.payload, j.priority, j.run_at, j.attempts, j.max_attempts, j.worker_id,
           j.claimed_at, j.claim_expires_at, j.created_at, j.expires_at, j.visibility_timeout_s,
           j.backoff_base_s, j.dead_letter_retention_s, j.last_error, j.died_at, j.dedup_key,
           j.attempts_refunded
      FROM alk.jobs j
     WHERE j.queue = list_jobs.queue
       AND (state IS NULL OR j.state = state)
       AND j.id > coalesce(after_id, -9223372036854775808)
     ORDER BY j.id
     LIMIT n;
END
$$;
COMMENT ON FUNCTION alk.list_jobs(text, text, bigint, bigint) IS
'Up to n jobs of a queue in id order, optionally only one state (pending, processing or dead), after the id '
'after_id (keyset paging: pass the last id you saw). Whole rows, as alk.get_job returns them. n <= 0 lists nothing. '
'Example: SELECT id, attempts, last_error, died_at FROM alk.list_jobs(''emails'', state => ''dead'', n => 20);';

CREATE OR REPLACE FUNCTION alk.next_claim_at(queue text)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    clock bigint := alk.now();
    first_run_at bigint;
    first_lease_end bigint;
    next_at bigint;
BEGIN
    PERFORM alk._check_name('queue', next_claim_at.queue);
    -- A paused queue has nothing to claim until alk.resume_queue notifies.
    IF EXISTS (SELECT FROM alk.paused_queues p WHERE p.queue = next_claim_at.queue) THEN
        RETURN NULL;
    END IF;
    -- The earliest run_at of a pending job. jobs_claim_pending is ordered by
    -- (priority DESC, run_at), so the minimum over all priorities is the first
    -- entry of each distinct priority: a loose index scan that costs one probe
    -- per distinct priority, not one per row.
    WITH RECURSIVE priorities(priority) AS (
        (SELECT j.priority FROM alk.jobs j
          WHERE j.queue = next_claim_at.queue AND j.state = 'pending'
          ORDER BY j.priority DESC LIMIT 1)
        UNION ALL
        SELECT (SELECT j.priority FROM alk.jobs j
                 WHERE j.queue = next_claim_at.queue AND j.state = 'pending' AND j.priority < p.priority
                 ORDER BY j.priority DESC LIMIT 1)
          FROM priorities p WHERE p.priority IS NOT NULL
    )
    SELECT min((SELECT j.run_at FROM alk.jobs j
                 WHERE j.queue = next_claim_at.queue AND j.state = 'pending' AND j.priority = p.priority
                 ORDER BY j.priority DESC, j.run_at LIMIT 1))
      INTO first_run_at
      FROM priorities p WHERE p.priority IS NOT NULL;
    -- The first lease to lapse (one probe of jobs_claim_lapsed). A lease is
    -- claimable once claim_expires_at < now, i.e. from the next second on.
    SELECT min(j.claim_expires_at) INTO first_lease_end
      FROM alk.jobs j WHERE j.queue = next_claim_at.queue AND j.state = 'processing';
    next_at := least(first_run_at, alk._sat_add(first_lease_end, 1));
    IF next_at IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN greatest(next_at, clock);
END
$$;
COMMENT ON FUNCTION alk.next_claim_at(text) IS
'When alk.claim on this queue can next return a job: now when one is due (or a lease has lapsed), else the earliest '
'run_at of a pending job or the second after the earliest lease ends, whichever comes first; NULL when the queue has '
'no pending or processing job, or is paused. A worker sleeps until then (or until a NOTIFY on alk.queue_channel). '
'Due jobs that claim will bury (out of attempts, expired) count as claimable. '
'Example: SELECT alk.next_claim_at(''emails'') - alk.now() AS seconds_to_wait;';

CREATE OR REPLACE FUNCTION alk.outbox_enqueue(
    outbox text,
    payload jsonb,
    delay bigint DEFAULT NULL,
    run_at bigint DEFAULT NULL,
    priority bigint DEFAULT 0,
    max_attempts bigint DEFAULT 5,
    expires bigint DEFAULT NULL,
    visibility_timeout_s bigint DEFAULT 60,
    backoff_base_s bigint DEFAULT 5,
    dead_letter_retention_s bigint DEFAULT NULL,
    dedup_key text DEFAULT NULL
)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT alk._enqueue_one(alk._outbox_queue($1), $2, alk.now(), $3, $4, coalesce($5, 0), coalesce($6, 5), $7,
                            coalesce($8, 60), coalesce($9, 5), $10, $11)
$$;
COMMENT ON FUNCTION alk.outbox_enqueue(text, jsonb, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, text) IS
'Write one outbox message into the backing queue alk:outbox:<outbox>, inside the caller''s transaction (it exists '
'if and only if that transaction commits); returns its job id. Options as alk.enqueue, with the outbox stamps: '
'60 s visibility, 5 attempts, 5 s backoff base, dead rows kept forever. dedup_key: while an undelivered message of '
'this outbox holds the key, nothing is written and its id is returned. '
'Example: BEGIN; UPDATE invoices SET paid = true WHERE id = 7; '
'SELECT alk.outbox_enqueue(outbox => ''billing'', payload => ''{"invoice": 7}'', dedup_key => ''invoice:7''); COMMIT;';

CREATE OR REPLACE FUNCTION alk.outbox_get_job(outbox text, job_id bigint)
RETURNS SETOF alk.job
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
ROWS 1
AS $$
    SELECT * FROM alk._get_job(alk._outbox_queue($1), $2)
$$;
COMMENT ON FUNCTION alk.outbox_get_job(text, bigint) IS
'The whole row of an outbox message in any state, dead included (last_error says why); no row once it was delivered '
'(NULL as a scalar subquery). Example: SELECT state, attempts, last_error FROM alk.outbox_get_job(''billing'', 42);';

CREATE OR REPLACE FUNCTION alk.pause_queue(queue text)
RETURNS boolean
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH paused AS (
        INSERT INTO alk.paused_queues (queue, paused_at)
        VALUES (alk._name_ok('queue', $1, false), alk.now())
        ON CONFLICT (queue) DO NOTHING
        RETURNING 1
    )
    SELECT EXISTS (SELECT FROM paused)
$$;
COMMENT ON FUNCTION alk.pause_queue(text) IS
'Pause a queue: its claims (alk.claim, alk.settle_and_claim) return nothing and alk.next_claim_at is NULL until '
'alk.resume_queue; enqueue, ack, retry, fail, heartbeat and sweeps work as usual. True when it was not paused. '
'Example: SELECT alk.pause_queue(''emails'');';

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
'every later-committing enqueue, release or requeue of the queue, and by alk.resume_queue; with an empty payload: '
'on wake-up, claim. Example: SELECT alk.queue_channel(''emails''); then LISTEN "<that channel>";';

CREATE OR REPLACE FUNCTION alk.queue_stats(queue text DEFAULT NULL)
RETURNS SETOF alk.queue_stat
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    clock bigint := alk.now();
    only_queue text := queue_stats.queue;
BEGIN
    IF only_queue IS NOT NULL THEN
        -- Read-only, so reserved names (outbox backing queues) are accepted.
        PERFORM alk._check_name('queue', only_queue, true);
    END IF;
    -- Every row is in exactly one of the three partial indexes (pending,
    -- processing, dead), and each leads with the queue: the queue names come
    -- from a loose scan of the three (three index probes per queue, whatever
    -- the row count), and each count is an index-only scan of one queue's
    -- entries in one of them. Nothing reads the heap but for pages the
    -- visibility map does not yet know to be all-visible.
    RETURN QUERY
    WITH RECURSIVE names(name) AS (
        SELECT coalesce(only_queue, '')
        UNION ALL
        SELECT least(
            (SELECT j.queue FROM alk.jobs j WHERE j.state = 'pending' AND j.queue > n.name ORDER BY j.queue LIMIT 1),
            (SELECT j.queue FROM alk.jobs j WHERE j.state = 'processing' AND j.queue > n.name
              ORDER BY j.queue LIMIT 1),
            (SELECT j.queue FROM alk.jobs j WHERE j.state = 'dead' AND j.queue > n.name ORDER BY j.queue LIMIT 1))
          FROM names n WHERE n.name IS NOT NULL AND only_queue IS NULL
    )
    SELECT n.name, p.pending, p.ready, p.pending - p.ready, r.processing, r.lapsed, d.dead,
           alk._sat_sub(clock, p.oldest_ready), p.next_run_at,
           EXISTS (SELECT FROM alk.paused_queues pq WHERE pq.queue = n.name)
      FROM names n
     CROSS JOIN LATERAL (
        SELECT count(*) AS pending,
               count(*) FILTER (WHERE j.run_at <= clock) AS ready,
               min(j.run_at) FILTER (WHERE j.run_at <= clock) AS oldest_ready,
               min(j.run_at) FILTER (WHERE j.run_at > clock) AS next_run_at
          FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'pending') p
     CROSS JOIN LATERAL (
        SELECT count(*) AS processing,
               count(*) FILTER (WHERE j.claim_expires_at < clock) AS lapsed
          FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'processing') r
     CROSS JOIN LATERAL (
        SELECT count(*) AS dead
          FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'dead') d
     WHERE n.name IS NOT NULL AND n.name <> ''
     ORDER BY n.name;
END
$$;
COMMENT ON FUNCTION alk.queue_stats(text) IS
'One row per queue (every queue holding a job, reserved outbox queues included; or only the given queue, even when '
'empty): pending (= ready + scheduled), ready (pending and due), scheduled (pending, run_at in the future), '
'processing (leased, lapsed included), lapsed (lease ended: claimable again), dead, oldest_ready_age_s (now minus '
'the earliest run_at of a ready job: the queue''s lag; NULL when none is ready) and next_run_at (the earliest run_at '
'of a scheduled job; NULL when none) and paused (alk.pause_queue). Cost: index-only scans of the partial indexes, linear in the rows counted '
'(docs/worker.md has numbers). Example: SELECT * FROM alk.queue_stats();';

CREATE OR REPLACE FUNCTION alk.release_jobs(job_ids bigint[], worker_id text, attempts bigint[], queue text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock bigint := alk.now();
    wid text := alk._name_ok('worker_id', release_jobs.worker_id, true);
    released bigint;
    queues text[];
BEGIN
    IF attempts IS NOT NULL AND cardinality(attempts) <> cardinality(job_ids) THEN
        PERFORM alk._raise('LK002', 'attempts must have one entry per job id: got ' || cardinality(job_ids)
            || ' job_ids and ' || cardinality(attempts) || ' attempts');
    END IF;
    -- Pending again at its place in claim order (run_at kept), with the
    -- claim's attempt refunded; attempts itself stays, so the token the
    -- claim issued is dead for good.
    WITH r AS (
        UPDATE alk.jobs j
           SET state = 'pending', worker_id = NULL, claimed_at = NULL, claim_expires_at = NULL,
               attempts_refunded = j.attempts_refunded + 1
          FROM unnest(release_jobs.job_ids, release_jobs.attempts) AS w(id, attempt)
         WHERE j.id = w.id AND (release_jobs.queue IS NULL OR j.queue = release_jobs.queue)
           AND alk._holds(j, wid, w.attempt, clock)
        RETURNING j.queue
    )
    SELECT count(*), array_agg(DISTINCT r.queue) INTO released, queues FROM r;
    PERFORM alk._wake(q.name) FROM unnest(queues) AS q(name);
    RETURN released;
END
$$;
COMMENT ON FUNCTION alk.release_jobs(bigint[], text, bigint[], text) IS
'Give claimed jobs that never started back at once: pending, due at their old place in claim order, without spending '
'an attempt (attempts_refunded + 1). attempts holds each job''s fencing token (NULL: skip that check); the validity '
'predicate of alk.ack applies and the token stays invalid for good (the next claim issues attempts + 1). Returns how '
'many were released. Example: SELECT alk.release_jobs(ARRAY[41, 42], ''worker-1'', ARRAY[1, 1]);';

CREATE OR REPLACE FUNCTION alk.requeue_dead(queue text, job_ids bigint[] DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    clock bigint := alk.now();
    moved bigint;
BEGIN
    PERFORM alk._check_name('queue', requeue_dead.queue);
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
        UPDATE alk.jobs j
           SET state = 'pending', run_at = clock, attempts_refunded = j.attempts,
               worker_id = NULL, claimed_at = NULL, claim_expires_at = NULL,
               last_error = NULL, died_at = NULL, purge_at = NULL,
               expires_at = alk._sat_add(clock, alk._sat_sub(j.expires_at, j.created_at))
         WHERE j.queue = requeue_dead.queue AND j.state = 'dead'
           AND (j.dedup_key IS NULL OR (
                NOT EXISTS (SELECT FROM alk.jobs h WHERE h.queue = j.queue AND h.dedup_key = j.dedup_key
                                                     AND h.state <> 'dead')
                AND j.id = (SELECT min(d.id) FROM alk.jobs d WHERE d.queue = j.queue AND d.dedup_key = j.dedup_key
                                                              AND d.state = 'dead')));
    ELSE
        UPDATE alk.jobs j
           SET state = 'pending', run_at = clock, attempts_refunded = j.attempts,
               worker_id = NULL, claimed_at = NULL, claim_expires_at = NULL,
               last_error = NULL, died_at = NULL, purge_at = NULL,
               expires_at = alk._sat_add(clock, alk._sat_sub(j.expires_at, j.created_at))
         WHERE j.queue = requeue_dead.queue AND j.state = 'dead' AND j.id = ANY (job_ids)
           AND (j.dedup_key IS NULL OR (
                NOT EXISTS (SELECT FROM alk.jobs h WHERE h.queue = j.queue AND h.dedup_key = j.dedup_key
                                                     AND h.state <> 'dead')
                AND j.id = (SELECT min(d.id) FROM alk.jobs d WHERE d.queue = j.queue AND d.dedup_key = j.dedup_key
                                                              AND d.state = 'dead' AND d.id = ANY (job_ids))));
    END IF;
    GET DIAGNOSTICS moved = ROW_COUNT;
    IF moved > 0 THEN
        PERFORM alk._wake(requeue_dead.queue);
    END IF;
    RETURN moved;
END
$$;
COMMENT ON FUNCTION alk.requeue_dead(text, bigint[]) IS
'Send dead jobs back to pending, due now, with every attempt spent so far refunded (attempts_refunded = attempts, '
'so the job has max_attempts again and no earlier fencing token becomes valid), no worker and no last_error; every '
'dead job of the queue when job_ids is NULL, else those of job_ids that are dead in this queue (others are ignored). '
'A dead job whose dedup_key a live job holds stays dead (of several with one key, the first moves). An expiring job '
'gets its TTL again from now. Returns how many moved; idle workers are woken. '
'Example: SELECT alk.requeue_dead(''emails''); SELECT alk.requeue_dead(''emails'', ARRAY[41, 42]);';

CREATE OR REPLACE FUNCTION alk.resume_queue(queue text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q text := alk._name_ok('queue', resume_queue.queue, false);
BEGIN
    DELETE FROM alk.paused_queues p WHERE p.queue = q;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    -- Every listener of the queue: idle workers claim again at commit.
    PERFORM pg_catalog.pg_notify(alk._queue_channel(q), '');
    RETURN true;
END
$$;
COMMENT ON FUNCTION alk.resume_queue(text) IS
'Resume a paused queue and notify its channel at commit, so waiting workers claim again. True when it was paused. '
'Example: SELECT alk.resume_queue(''emails'');';

CREATE OR REPLACE FUNCTION alk.retry(job_id bigint, worker_id text, attempt bigint DEFAULT NULL, err text DEFAULT NULL,
                          delay bigint DEFAULT NULL, queue text DEFAULT NULL)
RETURNS boolean
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT s.state IS NOT NULL
      FROM alk._settle($6, $2, ARRAY[$1], ARRAY[$3], ARRAY['retry'], ARRAY[$4], ARRAY[$5]) s
$$;
COMMENT ON FUNCTION alk.retry(bigint, text, bigint, text, bigint, text) IS
'Give a claimed job back for another attempt: pending again, no worker, ready at now + delay, or now + '
'backoff_base_s * 2^(spent - 1) when delay is NULL (spent = attempts - attempts_refunded). With its attempts spent '
'it becomes dead with last_error = err (or ''max attempts exceeded''). False, and nothing changes, when the claim is '
'no longer valid (see alk.ack); alk.settle says which state it led to. '
'Example: SELECT alk.retry(job_id => 42, worker_id => ''worker-1'', attempt => 1, err => ''smtp timeout'');';

CREATE OR REPLACE FUNCTION alk.schema_info(OUT version text, OUT breaking_since text)
RETURNS record
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT (SELECT max(v.version_num)::text FROM alk.alembic_version v), '0009'::text
$$;
COMMENT ON FUNCTION alk.schema_info() IS
'The installed schema version and breaking_since, the newest version that older clients cannot run on. '
'A client that knows versions up to K may run when breaking_since <= K; it needs pyalk migrate when version is '
'older than what it uses. Example: SELECT * FROM alk.schema_info();';

CREATE OR REPLACE FUNCTION alk.settle(job_ids bigint[], worker_id text, attempts bigint[] DEFAULT NULL,
                           outcomes text[] DEFAULT NULL, errs text[] DEFAULT NULL, delays bigint[] DEFAULT NULL,
                           queue text DEFAULT NULL)
RETURNS TABLE (job_id bigint, attempt bigint, state text)
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT * FROM alk._settle($7, $2, $1, $3, $4, $5, $6)
$$;
COMMENT ON FUNCTION alk.settle(bigint[], text, bigint[], text[], text[], bigint[], text) IS
'Settle several claimed jobs in one call and one transaction. Arrays aligned with job_ids: attempts (fencing tokens), '
'outcomes (''ack'', ''retry'' or ''fail''; NULL: all ack), errs (the error of a retry or fail) and delays (a retry''s '
'delay; NULL: the row''s backoff curve). One row per job id, in input order, with the state it led to: ''acked'' '
'(deleted), ''pending'' (retried), ''dead'' (failed, or retried with its attempts spent), or NULL when the claim was '
'no longer valid (nothing changed). Each entry follows alk.ack, alk.retry and alk.fail exactly. '
'Example: SELECT * FROM alk.settle(ARRAY[41, 42], ''worker-1'', ARRAY[1, 1], ARRAY[''ack'', ''retry''], '
'ARRAY[NULL, ''TimeoutError: smtp'']);';

CREATE OR REPLACE FUNCTION alk.settle_and_claim(queue text, worker_id text, n bigint, job_ids bigint[] DEFAULT NULL,
                                     attempts bigint[] DEFAULT NULL, outcomes text[] DEFAULT NULL,
                                     errs text[] DEFAULT NULL, delays bigint[] DEFAULT NULL)
RETURNS SETOF alk.settle_claim_row
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    -- Append runs its branches in order: every settlement is applied before
    -- the claim looks, all in the caller's one transaction.
    SELECT 'settled'::text, s.job_id, $1, s.state, NULL::jsonb, NULL::bigint, NULL::bigint, s.attempt,
           NULL::bigint, NULL::text, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint,
           NULL::bigint, NULL::bigint, NULL::text, NULL::bigint, NULL::text, NULL::bigint
      FROM alk._settle(alk._name_ok('queue', $1, false), $2, $4, $5, $6, $7, $8) s
    UNION ALL
    SELECT 'claimed'::text, c.* FROM alk._claim(alk._name_ok('queue', $1, false), $2, $3) c
$$;
COMMENT ON FUNCTION alk.settle_and_claim(text, text, bigint, bigint[], bigint[], text[], text[], bigint[]) IS
'One call, one transaction: settle a batch of this queue''s claimed jobs exactly as alk.settle does, then claim up to '
'n as alk.claim does. Returns flat rows: first one kind = ''settled'' row per settlement in input order (id, queue, '
'attempts = the token given, state = ''acked'', ''pending'', ''dead'' or NULL when refused; other columns NULL), then '
'kind = ''claimed'' rows, whole jobs in claim order. '
'Example: SELECT kind, id, state, attempts, payload FROM alk.settle_and_claim(''emails'', ''worker-1'', 10, '
'ARRAY[41, 42], ARRAY[1, 1], ARRAY[''ack'', ''fail''], ARRAY[NULL, ''ValueError: bad address'']);';

CREATE OR REPLACE FUNCTION alk.stop_waiting(queue text, worker_id text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q text := alk._name_ok('queue', stop_waiting.queue, true);
    wid text := alk._name_ok('worker_id', stop_waiting.worker_id, true);
BEGIN
    DELETE FROM alk.idle_workers w WHERE w.queue = q AND w.worker_id = wid;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION alk.stop_waiting(text, text) IS
'Withdraw the idle advert of alk.wait_for_jobs: enqueues stop notifying for this worker. True if it was advertised. '
'A busy system has no adverts, so its enqueues never notify. Example: SELECT alk.stop_waiting(''emails'', ''worker-1'');';

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
    -- here, off the hot path.
    DELETE FROM alk.idle_workers w
     WHERE w.queue = q
       AND w.pid NOT IN (SELECT a.pid FROM pg_catalog.pg_stat_get_activity(NULL) a WHERE a.pid IS NOT NULL);
    INSERT INTO alk.idle_workers AS w (queue, worker_id, pid, since)
    VALUES (q, wid, pg_catalog.pg_backend_pid(), alk.now())
    ON CONFLICT ON CONSTRAINT idle_workers_pkey DO UPDATE SET pid = excluded.pid, since = excluded.since;
    RETURN alk._queue_channel(q);
END
$$;
COMMENT ON FUNCTION alk.wait_for_jobs(text, text) IS
'Advertise worker_id as waiting idle on queue, so enqueues notify the queue''s channel (returned). The protocol: '
'LISTEN on the channel first; call this in its own transaction; then fence := alk.wake_fence(); claim; when the '
'claim is empty, wait for a notification, and meanwhile poll fence := alk.wake_fence(fence) on a short timer, '
'claiming again whenever it shrinks (an enqueue that was in flight has ended). Call alk.stop_waiting once busy again. '
'Example: LISTEN "alk_q_..."; SELECT alk.wait_for_jobs(''emails'', ''worker-1'');';

CREATE OR REPLACE FUNCTION alk.wake_fence(in_progress bigint[] DEFAULT NULL)
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

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
