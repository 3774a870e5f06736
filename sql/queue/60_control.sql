-- pyalk queue, control outside a claim (docs/contract.md#queue): jobs by id
-- (cancel, get_job), the expiry and retention sweep, redrive of dead jobs
-- (requeue_dead), pause and resume, completed-job retention, queue limits.
--
-- After the worker's path (enqueue, claim, settle): these are an application's
-- or an operator's, and reuse its rules (alk._wake, alk._purge_at). Landed in
-- 0002_queue.sql (by id, sweep) and 0007_worker.sql (requeue_dead); 0009 added
-- pause and resume, 0026 completed jobs and their retention, 0027 the cancel
-- notice to a processing job's holder, 0028 dependencies (35_after.sql): a
-- cancelled or purged job releases, an expired one buries, a requeued one
-- revives the jobs enqueued after it; 0029 queue limits; 0030 the cancel
-- notice to a waiting producer; 0032 a cancelled processing job's freed
-- max_running slot wakes idle workers.

-- operations by id --------------------------------------------------------

CREATE FUNCTION alk.cancel(queue text, job_id bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    was text;
    holder text;
    awaited boolean;
    cancelled_group text;
    limited boolean;
BEGIN
    PERFORM alk._check_name('queue', cancel.queue);
    -- Live jobs only: the planner leaves the kept slot out (docs/design.md).
    DELETE FROM alk.jobs j
     WHERE j.slot <> 2 AND j.queue = cancel.queue AND j.id = job_id AND j.state IN ('pending', 'processing')
    RETURNING j.state, j.worker_id, j.awaited, j.group_key, j.under_max_running
         INTO was, holder, awaited, cancelled_group, limited;
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
    -- A processing job held a max_running slot: idle workers may claim now.
    IF was = 'processing' AND limited THEN
        PERFORM alk._wake_freed(ARRAY[cancel.queue]);
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

CREATE FUNCTION alk._get_job(queue text, job_id bigint)
RETURNS SETOF alk.job
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
ROWS 1
AS $$
    SELECT j.id, j.queue, j.state, j.payload, j.priority, j.run_at, j.attempts, j.max_attempts, j.worker_id,
           j.claimed_at, j.claim_expires_at, j.created_at, j.expires_at, j.visibility_timeout_s,
           j.backoff_base_s, j.dead_letter_retention_s, j.last_error, j.died_at, j.dedup_key,
           j.attempts_refunded, j.headers, j.result, j.completed_at, j.group_key
      FROM alk.jobs j WHERE j.queue = $1 AND j.id = $2
$$;
COMMENT ON FUNCTION alk._get_job(text, bigint) IS 'internal: get_job for an already validated queue name';

-- A set of at most one row rather than a composite: a missing job is zero
-- rows in SELECT * FROM form (pgx's ErrNoRows, an empty rows array in Node)
-- and NULL as a scalar subquery, never a row of NULL fields.
CREATE FUNCTION alk.get_job(queue text, job_id bigint)
RETURNS SETOF alk.job
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
ROWS 1
AS $$
    SELECT * FROM alk._get_job(alk._name_ok('queue', $1, false), $2)
$$;
COMMENT ON FUNCTION alk.get_job(text, bigint) IS
'The whole job row in any state, dead and completed included (a completed job with its result and completed_at); '
'no row when there is no such job (NULL as a scalar subquery). '
'Example: SELECT * FROM alk.get_job(''emails'', 42); SELECT (SELECT alk.get_job(''emails'', 42)) IS NULL;';

CREATE FUNCTION alk._sweep_expired(queue text)
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
'Bury expired waiting jobs (and expired jobs whose lease lapsed) as dead with ''expired'', delete dead jobs whose '
'died_at <= now - dead_letter_retention_s and completed jobs whose completed_at <= now - the retention they were '
'completed under (both saturating). Returns how many rows it changed. Example: SELECT alk.sweep_expired(''emails'');';

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

-- completed-job retention ---------------------------------------------------

CREATE FUNCTION alk.set_queue_retention(queue text, completed_s bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    q text := alk._name_ok('queue', set_queue_retention.queue, false);
    previous bigint;
BEGIN
    IF completed_s IS NULL OR completed_s < 0 THEN
        PERFORM alk._raise('LK002', 'completed_s must be >= 0 (0: acked jobs are deleted), got '
            || coalesce(completed_s::text, 'NULL'));
    END IF;
    SELECT s.completed_s INTO previous FROM alk.queue_settings s WHERE s.queue = q FOR UPDATE;
    -- 0 is the default: no row, so acks of queues without retention probe
    -- an empty table.
    IF completed_s = 0 THEN
        DELETE FROM alk.queue_settings s WHERE s.queue = q;
    ELSE
        INSERT INTO alk.queue_settings AS s (queue, completed_s) VALUES (q, completed_s)
        ON CONFLICT ON CONSTRAINT queue_settings_pkey DO UPDATE SET completed_s = excluded.completed_s;
    END IF;
    RETURN coalesce(previous, 0) <> completed_s;
END
$$;
COMMENT ON FUNCTION alk.set_queue_retention(text, bigint) IS
'Keep this queue''s acked jobs as state completed, with their result (alk.ack''s result), for completed_s seconds: '
'alk.sweep_expired deletes one once completed_at <= now - completed_s (saturating). 0, the default: acks delete, as '
'without a setting; negative or NULL: LK002. Applies to acks from now on; jobs completed earlier keep the retention '
'they were completed under. True when the setting changed. '
'Example: SELECT alk.set_queue_retention(''emails'', 86400);';

CREATE FUNCTION alk.queue_retention(queue text)
RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- Checked before the read: an empty table would never test it.
    q text := alk._name_ok('queue', queue_retention.queue, false);
BEGIN
    RETURN coalesce((SELECT s.completed_s FROM alk.queue_settings s WHERE s.queue = q), 0);
END
$$;
COMMENT ON FUNCTION alk.queue_retention(text) IS
'Seconds this queue keeps acked jobs as completed (alk.set_queue_retention); 0 when they are deleted at ack. '
'Example: SELECT alk.queue_retention(''emails'');';

-- queue limits ----------------------------------------------------------------

-- The whole set at once: every limit the call leaves NULL is lifted. No
-- limit left: no row, so the queue's claims take no claim lock.
CREATE FUNCTION alk.set_queue_limits(queue text, max_running bigint DEFAULT NULL, rate bigint DEFAULT NULL,
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
        -- Jobs claimed before max_running was set hold slots now: their
        -- settles wake idle workers too (alk.jobs.under_max_running).
        IF max_running IS NOT NULL AND previous.max_running IS NULL THEN
            UPDATE alk.jobs j SET under_max_running = true
             WHERE j.queue = q AND j.state = 'processing' AND NOT j.under_max_running;
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

CREATE TYPE alk.queue_limit AS (
    queue text,
    max_running bigint,
    rate bigint,
    rate_period_s bigint,
    max_running_per_group bigint
);
COMMENT ON TYPE alk.queue_limit IS 'A queue''s claim limits as alk.queue_limits returns them (NULL: not set).';

CREATE FUNCTION alk.queue_limits(queue text)
RETURNS SETOF alk.queue_limit
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
ROWS 1
AS $$
    -- Always one row: a queue without limits has all of them NULL.
    SELECT q.name, l.max_running, l.rate, l.rate_period_s, l.max_running_per_group
      FROM (SELECT alk._name_ok('queue', $1, false) AS name) q
      LEFT JOIN alk.limited_queues l ON l.queue = q.name
$$;
COMMENT ON FUNCTION alk.queue_limits(text) IS
'A queue''s claim limits (alk.set_queue_limits): one row, queue, max_running, rate, rate_period_s, '
'max_running_per_group, each NULL when not set (max_running_per_group NULL: 1). '
'Example: SELECT * FROM alk.queue_limits(''emails'');';

-- pause and resume ------------------------------------------------------------

CREATE FUNCTION alk.pause_queue(queue text)
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

CREATE FUNCTION alk.resume_queue(queue text)
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
