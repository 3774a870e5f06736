-- pyalk 0019: alk.ack and alk.ack_batch apply the all-ack rule and its count in one statement of their own (no per-input result rows, no second function layer); alk._holds' state test no longer proves jobs_claim_lapsed's predicate, so ops by id probe jobs_pkey; alk._limits_active is STABLE (limit_names writes it so), so plans that fold it depend on it and a new name limit reaches a session's cached ack; alk._name_ok is STABLE and inlines.

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
        RETURNING c.queue, c.xmax = 0 AS opened
    ), pruned AS (
        DELETE FROM alk.queue_counts c
         -- A one-time filter: unless a minute was opened, no scan of any kind.
         WHERE EXISTS (SELECT FROM counted n WHERE n.opened)
           AND c.ctid = ANY (ARRAY(
               SELECT o.ctid FROM counted n
                CROSS JOIN LATERAL (
                   SELECT o.ctid FROM alk.queue_counts o
                    WHERE o.queue = n.queue AND o.minute < alk._sat_sub(this_minute, 86400)
                    ORDER BY o.minute LIMIT 1000
                      FOR UPDATE SKIP LOCKED) o
                WHERE n.opened))
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
        RETURNING c.queue, c.xmax = 0 AS opened
    ), pruned AS (
        DELETE FROM alk.queue_counts c
         -- A one-time filter: unless a minute was opened, no scan of any kind.
         WHERE EXISTS (SELECT FROM counted n WHERE n.opened)
           AND c.ctid = ANY (ARRAY(
               SELECT o.ctid FROM counted n
                CROSS JOIN LATERAL (
                   SELECT o.ctid FROM alk.queue_counts o
                    WHERE o.queue = n.queue AND o.minute < alk._sat_sub(this_minute, 86400)
                    ORDER BY o.minute LIMIT 1000
                      FOR UPDATE SKIP LOCKED) o
                WHERE n.opened))
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

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
