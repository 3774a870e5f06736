-- pyalk queue: the durable job queue (CONTRACT.md §1).
--
-- current definition; edit here, then add a version file (docs/migrations.md).
-- Landed as 0002_queue.sql and 0007_worker.sql (worker support); a fresh
-- install runs this file, an upgrade runs the version files, and
-- tests/migrations proves both give the same catalog.
--
-- One table holds every job in every queue. A job is pending (waiting for its
-- run_at), processing (leased to a worker until claim_expires_at) or dead
-- (kept for inspection until its retention lapses). ack and cancel delete.

CREATE TYPE alk.job AS (
    id bigint,
    queue text,
    state text,
    payload jsonb,
    priority integer,
    run_at bigint,
    attempts integer,
    max_attempts integer,
    worker_id text,
    claimed_at bigint,
    claim_expires_at bigint,
    created_at bigint,
    expires_at bigint,
    visibility_timeout_s bigint,
    backoff_base_s bigint,
    dead_letter_retention_s bigint,
    last_error text,
    died_at bigint
);
COMMENT ON TYPE alk.job IS 'A job as every queue function returns it: the resolved row, never the enqueuer''s raw options.';

CREATE TABLE alk.jobs (
    id bigint GENERATED ALWAYS AS IDENTITY,
    queue text NOT NULL,
    state text NOT NULL DEFAULT 'pending',
    payload jsonb NOT NULL,
    priority integer NOT NULL,
    run_at bigint NOT NULL,
    attempts integer NOT NULL DEFAULT 0,
    max_attempts integer NOT NULL,
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
    -- When a dead row's retention ends (alk._purge_at); NULL: kept forever.
    purge_at bigint,
    -- The key holds the queue so the table can be hash-distributed by queue;
    -- id leads it so ops by id (ack, retry, ...) are one probe of one index.
    CONSTRAINT jobs_pkey PRIMARY KEY (id, queue),
    CONSTRAINT jobs_state_known CHECK (state IN ('pending', 'processing', 'dead')),
    CONSTRAINT jobs_queue_named CHECK (queue <> '')
    -- Cross-column rules (a processing job has a lease, a dead one died_at)
    -- are the functions' to keep: CHECKs cost every insert and claim ~10 us
    -- each, and the table has no other writer. The SQL tests pin them.
);
COMMENT ON TABLE alk.jobs IS 'Every job of every queue. Private: use the alk.* functions.';

-- The claim path: due pending jobs in claim order. Partial, so processing
-- and dead rows never cost a claim anything.
CREATE INDEX jobs_claim_pending ON alk.jobs (queue, priority DESC, run_at, id) WHERE state = 'pending';
-- Lapsed leases (crashed workers) are found by their deadline.
CREATE INDEX jobs_claim_lapsed ON alk.jobs (queue, claim_expires_at) WHERE state = 'processing';
-- Expiry and retention sweeps.
CREATE INDEX jobs_expiring ON alk.jobs (queue, expires_at) WHERE expires_at IS NOT NULL AND state <> 'dead';
-- Dead rows, by the end of their retention: the sweep reads only those due.
CREATE INDEX jobs_dead ON alk.jobs (queue, purge_at) WHERE state = 'dead';

-- A queue table drains and refills all day: vacuum it early and often so dead
-- index entries from claims and acks do not pile up between runs.
ALTER TABLE alk.jobs SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 500,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02
);

-- rules shared by several functions ------------------------------------------

-- The validity predicate of every op on a claimed job (ack, retry, fail,
-- heartbeat): processing, held by this worker, under the same claim (attempt
-- is the fencing token the claim returned; NULL skips that check), lease not
-- lapsed (claim_expires_at >= now). Inlinable (see alk.now in core.sql): it
-- becomes part of each op's WHERE clause, next to the id's index probe.
CREATE FUNCTION alk._holds(job alk.jobs, worker_id text, attempt bigint, clock bigint)
RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT job.state OPERATOR(pg_catalog.=) 'processing'
       AND job.worker_id OPERATOR(pg_catalog.=) worker_id
       AND (attempt IS NULL OR job.attempts OPERATOR(pg_catalog.=) attempt)
       AND job.claim_expires_at OPERATOR(pg_catalog.>=) clock
       AND (NOT alk._limits_active() OR alk._in_scope(job.queue))
$$;
COMMENT ON FUNCTION alk._holds(alk.jobs, text, bigint, bigint) IS 'internal: the claimed-job validity predicate (name limits included: a job outside them is never held)';

-- The retention rule: a dead row is deleted once died_at <= now - retention
-- (saturating). That holds from the instant this returns on (NULL: never),
-- so the sweep can find due rows through an index instead of testing each.
CREATE FUNCTION alk._purge_at(died_at bigint, retention bigint)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN retention IS NULL OR died_at IS NULL THEN NULL
        -- sat(now - retention) never drops below the minimum, which died_at
        -- can equal only under a pinned clock: due at once.
        WHEN died_at OPERATOR(pg_catalog.=) '-9223372036854775808'::bigint THEN '-9223372036854775808'::bigint
        -- died_at + retention past the maximum: now - retention never reaches died_at.
        WHEN retention OPERATOR(pg_catalog.>) 0
         AND died_at OPERATOR(pg_catalog.>) (9223372036854775807 OPERATOR(pg_catalog.-) retention) THEN NULL
        ELSE alk._sat_add(died_at, retention)
    END
$$;
COMMENT ON FUNCTION alk._purge_at(bigint, bigint) IS
'internal: the first instant at which a row that died at died_at is past its retention, or NULL for never';

-- wake-ups --------------------------------------------------------------------

-- A queue's channel is alk._channel('alk_q_', queue): 38 bytes whatever the
-- name, one per queue so a worker hears only its own. The payload is empty, so PostgreSQL folds the notifications of one
-- transaction into one; NOTIFY is delivered at commit, and a rolled-back
-- enqueue wakes nobody.
CREATE FUNCTION alk._queue_channel(queue text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
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
'The LISTEN channel notified when jobs are inserted into a queue: ''alk_q_'' and the first 32 hex digits of '
'sha256(queue as UTF-8), a 38-byte identifier whatever the name. One notification per queue per committed '
'transaction, with an empty payload: on wake-up, claim. '
'Example: SELECT alk.queue_channel(''emails''); then LISTEN "<that channel>";';

-- enqueue -------------------------------------------------------------------

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
    default_backoff_base_s bigint
)
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    v_priority integer := alk._check_int4('priority', coalesce(priority, 0));
    v_max_attempts integer := alk._check_int4('max_attempts', coalesce(max_attempts, default_max_attempts));
    -- delay wins over run_at; neither means "now".
    v_run_at bigint := CASE
        WHEN delay IS NOT NULL THEN alk._sat_add(clock, delay)
        WHEN run_at IS NOT NULL THEN run_at
        ELSE clock END;
    v_expires_at bigint := alk._sat_add(clock, expires);
    v_visibility_timeout_s bigint := coalesce(visibility_timeout_s, default_visibility_timeout_s);
    v_backoff_base_s bigint := coalesce(backoff_base_s, default_backoff_base_s);
    v_id bigint;
BEGIN
    PERFORM alk._check_payloads(payloads);
    IF cardinality(payloads) = 1 THEN
        -- The common case, without the array machinery.
        INSERT INTO alk.jobs (queue, payload, priority, run_at, max_attempts, created_at, expires_at,
                              visibility_timeout_s, backoff_base_s, dead_letter_retention_s)
        VALUES (queue, payloads[1], v_priority, v_run_at, v_max_attempts, clock, v_expires_at,
                v_visibility_timeout_s, v_backoff_base_s, dead_letter_retention_s)
        RETURNING alk.jobs.id INTO v_id;
        PERFORM pg_catalog.pg_notify(alk._queue_channel(queue), '');
        RETURN NEXT v_id;
        RETURN;
    END IF;
    IF cardinality(payloads) > 0 THEN
        PERFORM pg_catalog.pg_notify(alk._queue_channel(queue), '');
    END IF;
    RETURN QUERY
    WITH inserted AS (
        INSERT INTO alk.jobs (queue, payload, priority, run_at, max_attempts, created_at, expires_at,
                              visibility_timeout_s, backoff_base_s, dead_letter_retention_s)
        SELECT queue, p.payload, v_priority, v_run_at, v_max_attempts, clock, v_expires_at,
               v_visibility_timeout_s, v_backoff_base_s, dead_letter_retention_s
        FROM unnest(payloads) WITH ORDINALITY AS p(payload, ord)
        ORDER BY p.ord
        RETURNING alk.jobs.id
    )
    -- Identity values are drawn in insertion order, so id order is input order.
    SELECT inserted.id FROM inserted ORDER BY inserted.id;
END
$$;
COMMENT ON FUNCTION alk._enqueue(text, jsonb[], bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint) IS
'internal: insert jobs with resolved stamps; every enqueue form calls it';

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
    dead_letter_retention_s bigint DEFAULT NULL
)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    job_id bigint;
BEGIN
    PERFORM alk._check_name('queue', enqueue.queue);
    SELECT e INTO job_id FROM alk._enqueue(enqueue.queue, ARRAY[payload], alk.now(),
        delay, enqueue.run_at, enqueue.priority, enqueue.max_attempts,
        expires, enqueue.visibility_timeout_s, enqueue.backoff_base_s,
        enqueue.dead_letter_retention_s, 300, 3, 5) AS e;
    RETURN job_id;
END
$$;
COMMENT ON FUNCTION alk.enqueue(text, jsonb, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint) IS
'Enqueue one job; returns its id. Ready time: delay (seconds from now) wins over run_at (absolute unix seconds); '
'neither means now. expires is a TTL in seconds from now. Stamps default to 300 s visibility, 3 attempts, 5 s backoff base, '
'dead rows kept forever. Example: SELECT alk.enqueue(queue => ''emails'', payload => ''{"to": 1}'', delay => 30);';

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
    dead_letter_retention_s bigint DEFAULT NULL
)
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM alk._check_name('queue', enqueue_batch.queue);
    RETURN QUERY SELECT * FROM alk._enqueue(enqueue_batch.queue, payloads, alk.now(),
        delay, enqueue_batch.run_at, enqueue_batch.priority, enqueue_batch.max_attempts,
        expires, enqueue_batch.visibility_timeout_s, enqueue_batch.backoff_base_s,
        enqueue_batch.dead_letter_retention_s, 300, 3, 5);
END
$$;
COMMENT ON FUNCTION alk.enqueue_batch(text, jsonb[], bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint) IS
'Enqueue several jobs in one call with the same options; returns their ids in input order. '
'Example: SELECT * FROM alk.enqueue_batch(''emails'', ARRAY[''{"to": 1}'', ''{"to": 2}'']::jsonb[], priority => 5);';

-- claim ---------------------------------------------------------------------

-- The claim rule, once: alk.claim and the outbox's claim call it with a
-- validated queue name (plain or reserved).
CREATE FUNCTION alk._claim(queue text, worker_id text, n bigint)
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
    wanted bigint := n;
    picked bigint[];
    claimed bigint;
    buried bigint;
BEGIN
    PERFORM alk._check_name('worker_id', _claim.worker_id, true);
    -- An extent: n <= 0 (or NULL) claims nothing.
    IF wanted IS NULL OR wanted <= 0 THEN
        RETURN;
    END IF;
    LOOP
        -- Lock the first due rows in claim order from both sources: pending
        -- rows whose run_at has come, and processing rows whose lease lapsed.
        WITH due AS (
            SELECT j.id, j.priority, j.run_at FROM alk.jobs j
             WHERE j.queue = _claim.queue AND j.state = 'pending' AND j.run_at <= clock
             ORDER BY j.priority DESC, j.run_at, j.id
             LIMIT wanted
               FOR UPDATE SKIP LOCKED
        ), lapsed AS (
            SELECT j.id, j.priority, j.run_at FROM alk.jobs j
             WHERE j.queue = _claim.queue AND j.state = 'processing' AND j.claim_expires_at < clock
             ORDER BY j.priority DESC, j.run_at, j.id
             LIMIT wanted
               FOR UPDATE SKIP LOCKED
        )
        SELECT array_agg(c.id ORDER BY c.priority DESC, c.run_at, c.id) INTO picked
          FROM (SELECT * FROM due UNION ALL SELECT * FROM lapsed
                ORDER BY priority DESC, run_at, id LIMIT wanted) c;
        EXIT WHEN picked IS NULL;

        -- One update claims the live rows and buries the due rows that can
        -- no longer run (out of attempts, or expired).
        RETURN QUERY
        WITH moved AS (
            UPDATE alk.jobs j
               SET state = CASE WHEN j.attempts >= j.max_attempts OR j.expires_at <= clock
                                THEN 'dead' ELSE 'processing' END,
                   died_at = CASE WHEN j.attempts >= j.max_attempts OR j.expires_at <= clock THEN clock END,
                   purge_at = CASE WHEN j.attempts >= j.max_attempts OR j.expires_at <= clock
                                   THEN alk._purge_at(clock, j.dead_letter_retention_s) END,
                   last_error = CASE WHEN j.attempts >= j.max_attempts THEN 'max attempts exceeded'
                                     WHEN j.expires_at <= clock THEN 'expired' END,
                   worker_id = CASE WHEN j.attempts >= j.max_attempts OR j.expires_at <= clock
                                    THEN j.worker_id ELSE _claim.worker_id END,
                   claimed_at = CASE WHEN j.attempts >= j.max_attempts OR j.expires_at <= clock
                                     THEN j.claimed_at ELSE clock END,
                   claim_expires_at = CASE WHEN j.attempts >= j.max_attempts OR j.expires_at <= clock
                                           THEN j.claim_expires_at
                                           ELSE alk._sat_add(clock, j.visibility_timeout_s) END,
                   attempts = CASE WHEN j.attempts >= j.max_attempts OR j.expires_at <= clock
                                   THEN j.attempts ELSE j.attempts + 1 END
             WHERE j.id = ANY (picked) AND j.queue = _claim.queue
            RETURNING j.*
        )
        SELECT c.id, c.queue, c.state, c.payload, c.priority, c.run_at, c.attempts, c.max_attempts,
               c.worker_id, c.claimed_at, c.claim_expires_at, c.created_at, c.expires_at,
               c.visibility_timeout_s, c.backoff_base_s, c.dead_letter_retention_s, c.last_error, c.died_at
          FROM moved c
         WHERE c.state = 'processing'
         ORDER BY c.priority DESC, c.run_at, c.id;
        GET DIAGNOSTICS claimed = ROW_COUNT;
        buried := cardinality(picked) - claimed;

        wanted := wanted - claimed;
        -- Only burying leaves room to look again; otherwise the queue is empty
        -- of claimable rows (or we have enough).
        EXIT WHEN buried = 0 OR wanted <= 0;
    END LOOP;
END
$$;
COMMENT ON FUNCTION alk._claim(text, text, bigint) IS 'internal: the claim rule for an already validated queue name';

CREATE FUNCTION alk.claim(queue text, worker_id text, n bigint DEFAULT 1)
RETURNS SETOF alk.job
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY SELECT * FROM alk._claim(alk._check_name('queue', queue), worker_id, n);
END
$$;
COMMENT ON FUNCTION alk.claim(text, text, bigint) IS
'Claim up to n due jobs for worker_id, in order priority DESC, run_at, id. Each claimed job is processing, '
'leased until now + visibility_timeout_s, with attempts + 1 (the fencing token for ack/retry/fail/heartbeat). '
'Due jobs out of attempts or past expiry become dead instead. n <= 0 claims nothing. '
'Example: SELECT id, attempts, payload FROM alk.claim(''emails'', ''worker-1'', 10);';

-- operations on a claimed job -----------------------------------------------

CREATE FUNCTION alk.ack(job_id bigint, worker_id text, attempt bigint DEFAULT NULL, queue text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM alk.jobs j
     WHERE j.id = job_id AND (ack.queue IS NULL OR j.queue = ack.queue)
       AND alk._holds(j, ack.worker_id, attempt, alk.now());
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION alk.ack(bigint, text, bigint, text) IS
'Acknowledge a claimed job: it is deleted. False, and nothing changes, unless the job is processing, held by worker_id '
'under claim attempt (the fencing token the claim returned; NULL skips that check) and its lease has not lapsed '
'(claim_expires_at >= now). queue is optional routing for sharded deployments. '
'Example: SELECT alk.ack(job_id => 42, worker_id => ''worker-1'', attempt => 1);';

CREATE FUNCTION alk.ack_batch(job_ids bigint[], worker_id text, attempts bigint[] DEFAULT NULL, queue text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock bigint := alk.now();
    acked bigint;
BEGIN
    IF attempts IS NOT NULL AND cardinality(attempts) <> cardinality(job_ids) THEN
        PERFORM alk._raise('LK002', 'attempts must have one entry per job id: got ' || cardinality(job_ids)
            || ' job_ids and ' || cardinality(attempts) || ' attempts');
    END IF;
    DELETE FROM alk.jobs j
     USING unnest(ack_batch.job_ids, ack_batch.attempts) AS w(id, attempt)
     WHERE j.id = w.id AND (ack_batch.queue IS NULL OR j.queue = ack_batch.queue)
       AND alk._holds(j, ack_batch.worker_id, w.attempt, clock);
    GET DIAGNOSTICS acked = ROW_COUNT;
    RETURN acked;
END
$$;
COMMENT ON FUNCTION alk.ack_batch(bigint[], text, bigint[], text) IS
'Acknowledge several claimed jobs in one call; returns how many were validly held (and are now deleted). '
'attempts, when given, holds each job''s fencing token in the same order. '
'Example: SELECT alk.ack_batch(ARRAY[41, 42], ''worker-1'', ARRAY[1, 1]);';

CREATE FUNCTION alk.retry(job_id bigint, worker_id text, attempt bigint DEFAULT NULL, err text DEFAULT NULL,
                          delay bigint DEFAULT NULL, queue text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock bigint := alk.now();
BEGIN
    UPDATE alk.jobs j
       SET state = CASE WHEN j.attempts >= j.max_attempts THEN 'dead' ELSE 'pending' END,
           -- delay NULL: the row's backoff curve, base * 2^(attempts - 1).
           run_at = CASE WHEN j.attempts >= j.max_attempts THEN j.run_at
                         ELSE alk._sat_add(clock, coalesce(delay, alk._sat_mul_pow2(j.backoff_base_s, j.attempts - 1)))
                    END,
           worker_id = CASE WHEN j.attempts >= j.max_attempts THEN j.worker_id END,
           claimed_at = CASE WHEN j.attempts >= j.max_attempts THEN j.claimed_at END,
           claim_expires_at = CASE WHEN j.attempts >= j.max_attempts THEN j.claim_expires_at END,
           last_error = CASE WHEN j.attempts >= j.max_attempts THEN coalesce(err, 'max attempts exceeded') END,
           died_at = CASE WHEN j.attempts >= j.max_attempts THEN clock END,
           purge_at = CASE WHEN j.attempts >= j.max_attempts THEN alk._purge_at(clock, j.dead_letter_retention_s) END
     WHERE j.id = job_id AND (retry.queue IS NULL OR j.queue = retry.queue)
       AND alk._holds(j, retry.worker_id, attempt, clock);
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION alk.retry(bigint, text, bigint, text, bigint, text) IS
'Give a claimed job back for another attempt: pending again, no worker, ready at now + delay, or now + '
'backoff_base_s * 2^(attempts - 1) when delay is NULL. With attempts exhausted it becomes dead with last_error = err '
'(or ''max attempts exceeded''). False, and nothing changes, when the claim is no longer valid (see alk.ack). '
'Example: SELECT alk.retry(job_id => 42, worker_id => ''worker-1'', attempt => 1, err => ''smtp timeout'');';

CREATE FUNCTION alk.fail(job_id bigint, worker_id text, attempt bigint DEFAULT NULL, err text DEFAULT NULL,
                         queue text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock bigint := alk.now();
BEGIN
    UPDATE alk.jobs j
       SET state = 'dead', last_error = coalesce(err, 'failed'), died_at = clock,
           purge_at = alk._purge_at(clock, j.dead_letter_retention_s)
     WHERE j.id = job_id AND (fail.queue IS NULL OR j.queue = fail.queue)
       AND alk._holds(j, fail.worker_id, attempt, clock);
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION alk.fail(bigint, text, bigint, text, text) IS
'Fail a claimed job for good: dead with last_error = err (or ''failed''). False, and nothing changes, when the claim '
'is no longer valid (see alk.ack). Example: SELECT alk.fail(42, ''worker-1'', 1, ''bad address'');';

CREATE FUNCTION alk.heartbeat(job_id bigint, worker_id text, attempt bigint DEFAULT NULL, extend bigint DEFAULT NULL,
                              queue text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock bigint := alk.now();
BEGIN
    UPDATE alk.jobs j
       SET claim_expires_at = alk._sat_add(clock, coalesce(extend, j.visibility_timeout_s))
     WHERE j.id = job_id AND (heartbeat.queue IS NULL OR j.queue = heartbeat.queue)
       AND alk._holds(j, heartbeat.worker_id, attempt, clock);
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION alk.heartbeat(bigint, text, bigint, bigint, text) IS
'Extend a claimed job''s lease to now + extend seconds (the row''s visibility_timeout_s when NULL). True when the '
'claim was valid at call time; a negative extend leaves a lapsed lease that voids the claim on the next op. '
'Example: SELECT alk.heartbeat(42, ''worker-1'', 1, 600);';

-- operations by id --------------------------------------------------------

CREATE FUNCTION alk.cancel(queue text, job_id bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM alk._check_name('queue', cancel.queue);
    DELETE FROM alk.jobs j WHERE j.queue = cancel.queue AND j.id = job_id AND j.state <> 'dead';
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION alk.cancel(text, bigint) IS
'Delete a pending or processing job whatever its lease; true if a row went. Dead jobs stay for inspection. '
'Example: SELECT alk.cancel(''emails'', 42);';

CREATE FUNCTION alk._get_job(queue text, job_id bigint)
RETURNS alk.job
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    found_job alk.job;
BEGIN
    SELECT j.id, j.queue, j.state, j.payload, j.priority, j.run_at, j.attempts, j.max_attempts,
           j.worker_id, j.claimed_at, j.claim_expires_at, j.created_at, j.expires_at,
           j.visibility_timeout_s, j.backoff_base_s, j.dead_letter_retention_s, j.last_error, j.died_at
      INTO found_job
      FROM alk.jobs j WHERE j.queue = _get_job.queue AND j.id = job_id;
    RETURN found_job;
END
$$;
COMMENT ON FUNCTION alk._get_job(text, bigint) IS 'internal: get_job for an already validated queue name';

CREATE FUNCTION alk.get_job(queue text, job_id bigint)
RETURNS alk.job
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN alk._get_job(alk._check_name('queue', queue), job_id);
END
$$;
COMMENT ON FUNCTION alk.get_job(text, bigint) IS
'The whole job row in any state, dead included, or NULL. Example: SELECT * FROM alk.get_job(''emails'', 42);';

CREATE FUNCTION alk._sweep_expired(queue text)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock bigint := alk.now();
    expired bigint;
    purged bigint;
BEGIN
    -- Waiting rows past expiry, and processing rows past expiry whose lease
    -- lapsed; a row with a valid lease is left to its owner.
    UPDATE alk.jobs j
       SET state = 'dead', last_error = 'expired', died_at = clock,
           purge_at = alk._purge_at(clock, j.dead_letter_retention_s)
     WHERE j.queue = _sweep_expired.queue
       AND j.expires_at IS NOT NULL AND j.expires_at <= clock
       AND (j.state = 'pending' OR (j.state = 'processing' AND j.claim_expires_at < clock));
    GET DIAGNOSTICS expired = ROW_COUNT;
    -- Dead rows past their retention.
    DELETE FROM alk.jobs j
     WHERE j.queue = _sweep_expired.queue
       AND j.state = 'dead'
       AND j.purge_at <= clock;
    GET DIAGNOSTICS purged = ROW_COUNT;
    RETURN expired + purged;
END
$$;
COMMENT ON FUNCTION alk._sweep_expired(text) IS 'internal: sweep_expired for an already validated queue name';

CREATE FUNCTION alk.sweep_expired(queue text)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN alk._sweep_expired(alk._check_name('queue', queue));
END
$$;
COMMENT ON FUNCTION alk.sweep_expired(text) IS
'Bury expired waiting jobs (and expired jobs whose lease lapsed) as dead with ''expired'', and delete dead jobs whose '
'died_at <= now - dead_letter_retention_s. Returns how many rows it changed. Example: SELECT alk.sweep_expired(''emails'');';

-- what a worker needs: observability and redrive (0007, docs/worker.md) ------
--
-- Wake-ups, sleeping exactly long enough, observability and redrive:
--   * alk.next_claim_at(queue): when alk.claim can next return a row;
--   * alk.queue_stats(queue): counts by state, lag and next due time;
--   * alk.list_jobs(queue, state, n, after_id): inspection, paged by id;
--   * alk.requeue_dead(queue, job_ids): dead jobs back to pending.
--
-- Wake-ups are the queue's own (above): every enqueue notifies
-- alk.queue_channel(queue) at commit. These add what a worker does
-- with them: when to claim next, stats, inspection and redrive.

-- next_claim_at -------------------------------------------------------------

CREATE FUNCTION alk.next_claim_at(queue text)
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
'no pending or processing job. A worker sleeps until then (or until a NOTIFY on alk.queue_channel). '
'Due jobs that claim will bury (out of attempts, expired) count as claimable. '
'Example: SELECT alk.next_claim_at(''emails'') - alk.now() AS seconds_to_wait;';

-- queue_stats ---------------------------------------------------------------

CREATE TYPE alk.queue_stat AS (
    queue text,
    pending bigint,
    ready bigint,
    scheduled bigint,
    processing bigint,
    lapsed bigint,
    dead bigint,
    oldest_ready_age_s bigint,
    next_run_at bigint
);
COMMENT ON TYPE alk.queue_stat IS 'One queue''s row of alk.queue_stats.';

CREATE FUNCTION alk.queue_stats(queue text DEFAULT NULL)
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
           alk._sat_sub(clock, p.oldest_ready), p.next_run_at
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
     WHERE n.name IS NOT NULL AND n.name <> '' AND (NOT alk._limits_active() OR alk._in_scope(n.name))
     ORDER BY n.name;
END
$$;
COMMENT ON FUNCTION alk.queue_stats(text) IS
'One row per queue (every queue holding a job, reserved outbox queues included; or only the given queue, even when '
'empty): pending (= ready + scheduled), ready (pending and due), scheduled (pending, run_at in the future), '
'processing (leased, lapsed included), lapsed (lease ended: claimable again), dead, oldest_ready_age_s (now minus '
'the earliest run_at of a ready job: the queue''s lag; NULL when none is ready) and next_run_at (the earliest run_at '
'of a scheduled job; NULL when none). Cost: index-only scans of the partial indexes, linear in the rows counted '
'(docs/worker.md has numbers). Example: SELECT * FROM alk.queue_stats();';

-- list_jobs -----------------------------------------------------------------

CREATE FUNCTION alk.list_jobs(queue text, state text DEFAULT NULL, n bigint DEFAULT 100, after_id bigint DEFAULT NULL)
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
    SELECT j.id, j.queue, j.state, j.payload, j.priority, j.run_at, j.attempts, j.max_attempts,
           j.worker_id, j.claimed_at, j.claim_expires_at, j.created_at, j.expires_at,
           j.visibility_timeout_s, j.backoff_base_s, j.dead_letter_retention_s, j.last_error, j.died_at
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

-- requeue_dead --------------------------------------------------------------

CREATE FUNCTION alk.requeue_dead(queue text, job_ids bigint[] DEFAULT NULL)
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
    -- A fresh life: pending and due now, no attempts used, no worker, no
    -- error. The stamps and priority stay. An expiring job keeps its TTL,
    -- counted again from now (else an expired job would die again at once).
    -- Two statements rather than "job_ids IS NULL OR ...", so each keeps its
    -- index (jobs_dead for a whole queue, jobs_pkey for given ids) in a
    -- generic plan.
    IF job_ids IS NULL THEN
        UPDATE alk.jobs j
           SET state = 'pending', run_at = clock, attempts = 0,
               worker_id = NULL, claimed_at = NULL, claim_expires_at = NULL,
               last_error = NULL, died_at = NULL, purge_at = NULL,
               expires_at = alk._sat_add(clock, alk._sat_sub(j.expires_at, j.created_at))
         WHERE j.queue = requeue_dead.queue AND j.state = 'dead';
    ELSE
        UPDATE alk.jobs j
           SET state = 'pending', run_at = clock, attempts = 0,
               worker_id = NULL, claimed_at = NULL, claim_expires_at = NULL,
               last_error = NULL, died_at = NULL, purge_at = NULL,
               expires_at = alk._sat_add(clock, alk._sat_sub(j.expires_at, j.created_at))
         WHERE j.queue = requeue_dead.queue AND j.state = 'dead' AND j.id = ANY (job_ids);
    END IF;
    GET DIAGNOSTICS moved = ROW_COUNT;
    IF moved > 0 THEN
        PERFORM pg_catalog.pg_notify(alk._queue_channel(requeue_dead.queue), '');
    END IF;
    RETURN moved;
END
$$;
COMMENT ON FUNCTION alk.requeue_dead(text, bigint[]) IS
'Send dead jobs back to pending, due now, with attempts reset to 0, no worker and no last_error; every dead job of '
'the queue when job_ids is NULL, else those of job_ids that are dead in this queue (others are ignored). An '
'expiring job gets its TTL again from now. Returns how many moved; listeners of alk.queue_channel are notified. '
'Example: SELECT alk.requeue_dead(''emails''); SELECT alk.requeue_dead(''emails'', ARRAY[41, 42]);';

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
