-- pyalk 0007: what a worker runtime needs from the queue (docs/worker.md).
--
-- Wake-ups, sleeping exactly long enough, observability and redrive:
--   * alk.next_claim_at(queue): when alk.claim can next return a row;
--   * alk.queue_stats(queue): counts by state, lag and next due time;
--   * alk.list_jobs(queue, state, n, after_id): inspection, paged by id;
--   * alk.requeue_dead(queue, job_ids): dead jobs back to pending.
--
-- Wake-ups are the queue's own (0002): every enqueue notifies
-- alk.queue_channel(queue) at commit. This version adds what a worker does
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
     WHERE n.name IS NOT NULL AND n.name <> ''
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
