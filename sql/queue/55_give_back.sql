-- pyalk queue, giving a claimed job back (docs/contract.md#queue):
-- alk.release_jobs (a prefetching worker's jobs it never started, due at
-- once) and alk.snooze (a handler's job, due later), both under the claim's
-- token, the attempt refunded, idle workers woken (alk._wake).
--
-- Every statement here reads or writes live jobs only, so each says
-- slot <> 2: the planner leaves the kept slot out of its plan
-- (alk.jobs_kept, 10_table.sql; 0035).
--
-- After settle (the same validity predicate, alk._holds). Landed in
-- 0009_queue.sql (release_jobs) and 0025 (snooze); moved here from
-- 50_settle.sql in 0032, when that file outgrew 600 lines.

CREATE FUNCTION alk.release_jobs(job_ids bigint[], worker_id text, attempts bigint[], queue text DEFAULT NULL)
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
         WHERE j.slot <> 2 AND j.id = w.id AND (release_jobs.queue IS NULL OR j.queue = release_jobs.queue)
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

-- A handler that cannot run yet gives its job back for later without it
-- counting as a failure: release_jobs' refund, at a ready time of its own.
-- Pending at now + delay (saturating; NULL: 0, due at once, as an unset
-- enqueue delay), attempt refunded, attempts itself kept so the token is dead
-- for good. Idle workers are woken as for a release: the job may be due now,
-- and a worker asleep until a later next_claim_at should look again.
CREATE FUNCTION alk.snooze(job_id bigint, worker_id text, attempt bigint, delay bigint, queue text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    clock bigint := alk.now();
    wid text := alk._name_ok('worker_id', snooze.worker_id, true);
    snoozed text;
BEGIN
    UPDATE alk.jobs j
       SET state = 'pending', worker_id = NULL, claimed_at = NULL, claim_expires_at = NULL,
           run_at = alk._sat_add(clock, coalesce(snooze.delay, 0)),
           attempts_refunded = j.attempts_refunded + 1
     WHERE j.slot <> 2 AND j.id = snooze.job_id AND (snooze.queue IS NULL OR j.queue = snooze.queue)
       AND alk._holds(j, wid, snooze.attempt, clock)
    RETURNING j.queue INTO snoozed;
    IF snoozed IS NULL THEN
        RETURN false;
    END IF;
    PERFORM alk._wake(snoozed);
    RETURN true;
END
$$;
COMMENT ON FUNCTION alk.snooze(bigint, text, bigint, bigint, text) IS
'Give a claimed job back for later without spending its attempt: pending, no worker, ready at now + delay seconds '
'(saturating; any bigint, a negative one is due at once; NULL is 0), attempts_refunded + 1. The validity predicate of '
'alk.ack applies (attempt NULL skips the token check); the token stays invalid for good (the next claim issues '
'attempts + 1). False, and nothing changes, when the claim is no longer valid. '
'Example: SELECT alk.snooze(job_id => 42, worker_id => ''worker-1'', attempt => 1, delay => 60);';
