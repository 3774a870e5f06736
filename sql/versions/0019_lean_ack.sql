-- pyalk 0019: alk.ack and alk.ack_batch apply the all-ack rule and its count in one statement of their own (no per-input result rows, no second function layer); alk._holds' state test no longer proves jobs_claim_lapsed's predicate, so ops by id probe jobs_pkey; alk._limits_active is STABLE (limit_names writes it so), so plans that fold it depend on it and a new name limit reaches a session's cached ack; alk._name_ok is STABLE and inlines. The retention of alk.queue_counts moves from each settle statement into one insert trigger (alk._prune_counts), so the rule lives once.

-- alk._holds(alk.jobs,text,bigint,bigint): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._holds(job alk.jobs, worker_id text, attempt bigint, clock bigint)
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

-- alk._limits_active(): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._limits_active()
RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT false $$;
COMMENT ON FUNCTION alk._limits_active() IS
'internal: whether any name limit exists (rewritten by alk.limit_names; constant-folded by the planner)';

-- alk._name_ok(text,text,boolean): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._name_ok(argument text, value text, reserved_ok boolean)
RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT CASE
        WHEN value OPERATOR(pg_catalog.<>) ''
         AND pg_catalog.octet_length(value) OPERATOR(pg_catalog.<=) 1024
         AND (reserved_ok OR NOT pg_catalog.starts_with(value, 'alk:'))
         -- While any role has name limits, every name goes through the full
         -- check; otherwise this folds away (alk._limits_active is a constant).
         AND NOT alk._limits_active()
            THEN value
        ELSE alk._check_name(argument, value, reserved_ok)
    END
$$;
COMMENT ON FUNCTION alk._name_ok(text, text, boolean) IS 'internal: value when it is a valid name, else the LK001 of alk._check_name (inlinable)';

-- alk._prune_counts(): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._prune_counts()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM alk.queue_counts c
     WHERE c.ctid = ANY (ARRAY(
         SELECT o.ctid FROM alk.queue_counts o
          WHERE o.queue = NEW.queue AND o.minute < alk._sat_sub(NEW.minute, 86400)
          ORDER BY o.minute LIMIT 1000
            FOR UPDATE SKIP LOCKED));
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION alk._prune_counts() IS
'internal: alk.queue_counts'' insert trigger: drop the queue''s counter rows past a day (at most 1000, skip locked)';

-- alk._settle(text,text,bigint[],bigint[],text[],text[],bigint[]): changed or new in the current files
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
    this_minute bigint := clock / 60 * 60;
    me integer := pg_catalog.pg_backend_pid();
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
    SELECT i.id, i.attempt, d.state
      FROM input i
      LEFT JOIN first f ON f.ord = i.ord
      LEFT JOIN done d ON d.id = f.id
     ORDER BY i.ord;
END
$$;
COMMENT ON FUNCTION alk._settle(text, text, bigint[], bigint[], text[], text[], bigint[]) IS
'internal: the settlement rule (ack, retry, fail) for a batch, counted per queue for alk.queue_throughput; '
'queue NULL: any queue';

-- alk.ack(bigint,text,bigint,text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.ack(job_id bigint, worker_id text, attempt bigint DEFAULT NULL, queue text DEFAULT NULL)
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
BEGIN
    WITH acked AS (
        DELETE FROM alk.jobs j
         WHERE j.id = ack.job_id AND (ack.queue IS NULL OR j.queue = ack.queue)
           AND alk._holds(j, wid, ack.attempt, clock)
        RETURNING j.queue
    ), counted AS (
        INSERT INTO alk.queue_counts AS c (queue, minute, backend, acked)
        SELECT a.queue, this_minute, pg_catalog.pg_backend_pid(), 1 FROM acked a
        ON CONFLICT ON CONSTRAINT queue_counts_pkey DO UPDATE SET acked = c.acked + excluded.acked
        RETURNING c.queue
    )
    SELECT true INTO done FROM counted;
    RETURN done IS NOT NULL;
END
$$;
COMMENT ON FUNCTION alk.ack(bigint, text, bigint, text) IS
'Acknowledge a claimed job: it is deleted. False, and nothing changes, unless the job is processing, held by worker_id '
'under claim attempt (the fencing token the claim returned; NULL skips that check) and its lease has not lapsed '
'(claim_expires_at >= now). worker_id follows the name rule (LK001). queue is optional routing for sharded deployments. '
'Example: SELECT alk.ack(job_id => 42, worker_id => ''worker-1'', attempt => 1);';

-- alk.ack_batch(bigint[],text,bigint[],text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.ack_batch(job_ids bigint[], worker_id text, attempts bigint[] DEFAULT NULL, queue text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    clock bigint := alk.now();
    wid text := alk._name_ok('worker_id', ack_batch.worker_id, true);
    this_minute bigint := clock / 60 * 60;
    n_acked bigint;
BEGIN
    IF ack_batch.attempts IS NOT NULL AND cardinality(ack_batch.attempts) <> coalesce(cardinality(ack_batch.job_ids), 0) THEN
        -- _settle raises the LK002 that names the arrays.
        PERFORM alk._settle(ack_batch.queue, ack_batch.worker_id, ack_batch.job_ids, ack_batch.attempts, NULL, NULL, NULL);
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
        RETURNING j.queue
    ), counted AS (
        INSERT INTO alk.queue_counts AS c (queue, minute, backend, acked)
        SELECT a.queue, this_minute, pg_catalog.pg_backend_pid(), count(*) FROM acked a GROUP BY a.queue
        ON CONFLICT ON CONSTRAINT queue_counts_pkey DO UPDATE SET acked = c.acked + excluded.acked
        RETURNING c.queue
    )
    SELECT count(*) INTO n_acked FROM acked;
    RETURN n_acked;
END
$$;
COMMENT ON FUNCTION alk.ack_batch(bigint[], text, bigint[], text) IS
'Acknowledge several claimed jobs in one call; returns how many were validly held (and are now deleted). '
'attempts, when given, holds each job''s fencing token in the same order. '
'Example: SELECT alk.ack_batch(ARRAY[41, 42], ''worker-1'', ARRAY[1, 1]);';

-- alk.limit_names(text,text[]): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.limit_names(role text, prefixes text[])
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    target oid := alk._role_oid('role', limit_names.role);
    prefix text;
    active boolean;
BEGIN
    FOREACH prefix IN ARRAY coalesce(prefixes, ARRAY[]::text[]) LOOP
        IF prefix IS NULL OR prefix = '' OR starts_with(prefix, 'alk:') OR octet_length(prefix) > 1024 THEN
            PERFORM alk._raise('LK002', 'prefixes must be non-empty names of at most 1024 bytes outside the reserved '
                || 'prefix ''alk:'', got ' || alk._show(prefix));
        END IF;
    END LOOP;
    DELETE FROM alk.name_limits l WHERE l.role_oid = target;
    INSERT INTO alk.name_limits (role_oid, prefix)
        SELECT DISTINCT target, p FROM unnest(prefixes) AS p;
    -- Switch the checks on with the first limit and off after the last one
    -- (sql/core.sql, alk._limits_active); CREATE OR REPLACE keeps its
    -- comment and grants.
    active := EXISTS (SELECT 1 FROM alk.name_limits);
    IF active IS DISTINCT FROM alk._limits_active() THEN
        EXECUTE pg_catalog.format('CREATE OR REPLACE FUNCTION alk._limits_active() RETURNS boolean '
            'LANGUAGE sql STABLE PARALLEL SAFE AS $body$ SELECT %s $body$', CASE WHEN active THEN 'true' ELSE 'false' END);
    END IF;
    RETURN (SELECT count(*) FROM alk.name_limits l WHERE l.role_oid = target);
END
$$;
COMMENT ON FUNCTION alk.limit_names(text, text[]) IS
'Limit role to the queues, streams, locks, outboxes and schedules whose names start with one of prefixes (replacing '
'its earlier limits); NULL or an empty array lifts them. Every function that takes such a name refuses another with '
'LK005; job operations by id (ack, retry, fail, heartbeat) treat a job of another queue as not held; queue_stats() '
'and list_schedules() show only names in reach. Applies to the session user (the login role). Returns how many '
'prefixes are in force. Example: SELECT alk.limit_names(''team_a_worker'', ARRAY[''team-a.'']);';

-- hand-written: the trigger (after its function, above).
CREATE TRIGGER queue_counts_prune AFTER INSERT ON alk.queue_counts FOR EACH ROW EXECUTE FUNCTION alk._prune_counts();

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
