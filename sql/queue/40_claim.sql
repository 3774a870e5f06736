-- pyalk queue, the claim (docs/contract.md#queue): the claim rule
-- (alk._claim, alk.claim) and alk.next_claim_at, which must agree with it on
-- what is claimable, so the two sit side by side.
--
-- Before settle, whose alk.settle_and_claim calls alk._claim. Landed in
-- 0002_queue.sql (claim) and 0007_worker.sql (next_claim_at); changed by 0009,
-- 0016, 0026 (alk.job's new columns) and 0028 (after: a waiting job is not in
-- jobs_claim_pending, whose predicate every pending read below repeats).

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
    wid text := alk._name_ok('worker_id', worker_id, true);
    wanted bigint := n;
    live bigint[];
    dead bigint[];
    claimed bigint;
    awaited bigint[];
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
        -- Each locked row is split here into live (to claim) and dead (out
        -- of attempts, counted as attempts - attempts_refunded, or expired:
        -- to bury), so the claim's UPDATE is a plain one and burial, which
        -- is rare, costs a statement only when it happens.
        WITH RECURSIVE priorities(priority) AS (
            (SELECT j.priority FROM alk.jobs j
              WHERE j.queue = _claim.queue AND j.state = 'pending' AND j.after_left = 0
              ORDER BY j.priority DESC LIMIT 1)
            UNION ALL
            SELECT (SELECT j.priority FROM alk.jobs j
                     WHERE j.queue = _claim.queue AND j.state = 'pending' AND j.after_left = 0 AND j.priority < p.priority
                     ORDER BY j.priority DESC LIMIT 1)
              FROM priorities p WHERE p.priority IS NOT NULL
        ), due AS (
            SELECT d.id, d.priority, d.run_at, d.dead
              FROM priorities p
             CROSS JOIN LATERAL (
                SELECT j.id, j.priority, j.run_at,
                       (j.attempts - j.attempts_refunded >= j.max_attempts
                        OR coalesce(j.expires_at <= clock, false)) AS dead
                  FROM alk.jobs j
                 WHERE j.queue = _claim.queue AND j.state = 'pending' AND j.after_left = 0
                   AND j.priority = p.priority AND j.run_at <= clock
                 ORDER BY j.priority DESC, j.run_at, j.id
                 LIMIT wanted
                   FOR UPDATE SKIP LOCKED) d
             WHERE p.priority IS NOT NULL
             LIMIT wanted
        ), lapsed AS (
            SELECT j.id, j.priority, j.run_at,
                   (j.attempts - j.attempts_refunded >= j.max_attempts
                    OR coalesce(j.expires_at <= clock, false)) AS dead
              FROM alk.jobs j
             WHERE j.queue = _claim.queue AND j.state = 'processing' AND j.claim_expires_at < clock
             ORDER BY j.priority DESC, j.run_at, j.id
             LIMIT wanted
               FOR UPDATE SKIP LOCKED
        )
        SELECT array_agg(c.id) FILTER (WHERE NOT c.dead), array_agg(c.id) FILTER (WHERE c.dead)
          INTO live, dead
          FROM (SELECT * FROM due UNION ALL SELECT * FROM lapsed
                ORDER BY priority DESC, run_at, id LIMIT wanted) c
         -- A paused queue claims nothing: one primary-key probe of a tiny
         -- table, a one-time filter that runs before any row is locked (in
         -- this statement rather than its own: one statement less per claim).
         WHERE NOT EXISTS (SELECT FROM alk.paused_queues p WHERE p.queue = _claim.queue);

        IF dead IS NOT NULL THEN
            WITH buried AS (
                UPDATE alk.jobs j
                   SET state = 'dead', died_at = clock,
                       purge_at = alk._purge_at(clock, j.dead_letter_retention_s),
                       last_error = CASE WHEN j.attempts - j.attempts_refunded >= j.max_attempts
                                         THEN 'max attempts exceeded' ELSE 'expired' END
                 WHERE j.id = ANY (dead) AND j.queue = _claim.queue
                RETURNING j.id, j.awaited
            )
            SELECT array_agg(b.id) FILTER (WHERE b.awaited) INTO awaited FROM buried b;
            -- Jobs enqueued after these die with them (35_after.sql).
            IF awaited IS NOT NULL THEN
                PERFORM alk._after_sync(awaited);
            END IF;
        END IF;

        IF live IS NOT NULL THEN
            -- attempts only grows: it is the fencing token.
            RETURN QUERY
            WITH moved AS (
                UPDATE alk.jobs j
                   SET state = 'processing', worker_id = wid, claimed_at = clock,
                       claim_expires_at = alk._sat_add(clock, j.visibility_timeout_s),
                       attempts = j.attempts + 1
                 WHERE j.id = ANY (live) AND j.queue = _claim.queue
                RETURNING j.*
            )
            SELECT c.id, c.queue, c.state, c.payload, c.priority, c.run_at, c.attempts, c.max_attempts, c.worker_id,
                   c.claimed_at, c.claim_expires_at, c.created_at, c.expires_at, c.visibility_timeout_s,
                   c.backoff_base_s, c.dead_letter_retention_s, c.last_error, c.died_at, c.dedup_key,
                   c.attempts_refunded, c.headers, c.result, c.completed_at
              FROM moved c
             ORDER BY c.priority DESC, c.run_at, c.id;
            GET DIAGNOSTICS claimed = ROW_COUNT;
            wanted := wanted - claimed;
        END IF;
        -- Only burying leaves room to look again; otherwise the queue is empty
        -- of claimable rows (or we have enough).
        EXIT WHEN dead IS NULL OR wanted <= 0;
    END LOOP;
END
$$;
COMMENT ON FUNCTION alk._claim(text, text, bigint) IS 'internal: the claim rule for an already validated queue name';

CREATE FUNCTION alk.claim(queue text, worker_id text, n bigint DEFAULT 1)
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
          WHERE j.queue = next_claim_at.queue AND j.state = 'pending' AND j.after_left = 0
          ORDER BY j.priority DESC LIMIT 1)
        UNION ALL
        SELECT (SELECT j.priority FROM alk.jobs j
                 WHERE j.queue = next_claim_at.queue AND j.state = 'pending' AND j.after_left = 0 AND j.priority < p.priority
                 ORDER BY j.priority DESC LIMIT 1)
          FROM priorities p WHERE p.priority IS NOT NULL
    )
    SELECT min((SELECT j.run_at FROM alk.jobs j
                 WHERE j.queue = next_claim_at.queue AND j.state = 'pending' AND j.after_left = 0 AND j.priority = p.priority
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
