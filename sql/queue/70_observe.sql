-- pyalk queue, observability (docs/contract.md#queue): alk.queue_stats,
-- alk.list_jobs and alk.browse_jobs, read functions only.
--
-- After everything that writes jobs; nothing before calls them. Landed in
-- 0007_worker.sql (queue_stats, list_jobs) and 0011_observe.sql (browse_jobs);
-- queue_stats changed by 0009, 0012, 0014, 0018, 0026 (completed jobs) and
-- 0028 (jobs waiting on their after jobs count as scheduled) and 0032
-- (parked jobs of serial groups count as ready or scheduled, by run_at).

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
    next_run_at bigint,
    paused boolean,
    estimated boolean,
    completed bigint
);
COMMENT ON TYPE alk.queue_stat IS 'One queue''s row of alk.queue_stats.';

CREATE FUNCTION alk._estimate_jobs(queue text, kind text, clock bigint)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    plan json;
BEGIN
    -- The planner's row estimate for one queue's entries of one kind: what
    -- its statistics (ANALYZE, autovacuum) and the table's current size
    -- say, read without visiting the entries. The query texts are fixed;
    -- the queue and the clock are bound as parameters.
    CASE kind
    WHEN 'ready' THEN
        EXECUTE 'EXPLAIN (FORMAT JSON) SELECT FROM alk.jobs j '
                'WHERE j.queue = $1 AND j.state = ''pending'' AND j.after_left = 0 AND j.run_at <= $2'
           INTO plan USING queue, clock;
    WHEN 'scheduled' THEN
        EXECUTE 'EXPLAIN (FORMAT JSON) SELECT FROM alk.jobs j '
                'WHERE j.queue = $1 AND j.state = ''pending'' AND j.after_left = 0 AND j.run_at > $2'
           INTO plan USING queue, clock;
    WHEN 'waiting' THEN
        EXECUTE 'EXPLAIN (FORMAT JSON) SELECT FROM alk.jobs j '
                'WHERE j.queue = $1 AND j.state = ''pending'' AND j.after_left > 0' INTO plan USING queue;
    WHEN 'parked ready' THEN
        EXECUTE 'EXPLAIN (FORMAT JSON) SELECT FROM alk.jobs j '
                'WHERE j.queue = $1 AND j.state = ''pending'' AND j.after_left = -1 AND j.run_at <= $2'
           INTO plan USING queue, clock;
    WHEN 'parked scheduled' THEN
        EXECUTE 'EXPLAIN (FORMAT JSON) SELECT FROM alk.jobs j '
                'WHERE j.queue = $1 AND j.state = ''pending'' AND j.after_left = -1 AND j.run_at > $2'
           INTO plan USING queue, clock;
    WHEN 'processing' THEN
        EXECUTE 'EXPLAIN (FORMAT JSON) SELECT FROM alk.jobs j '
                'WHERE j.queue = $1 AND j.state = ''processing''' INTO plan USING queue;
    WHEN 'lapsed' THEN
        EXECUTE 'EXPLAIN (FORMAT JSON) SELECT FROM alk.jobs j '
                'WHERE j.queue = $1 AND j.state = ''processing'' AND j.claim_expires_at < $2'
           INTO plan USING queue, clock;
    WHEN 'dead' THEN
        EXECUTE 'EXPLAIN (FORMAT JSON) SELECT FROM alk.jobs j '
                'WHERE j.queue = $1 AND j.state = ''dead''' INTO plan USING queue;
    WHEN 'completed' THEN
        EXECUTE 'EXPLAIN (FORMAT JSON) SELECT FROM alk.jobs j '
                'WHERE j.queue = $1 AND j.state = ''completed''' INTO plan USING queue;
    END CASE;
    RETURN round((plan -> 0 -> 'Plan' ->> 'Plan Rows')::numeric)::bigint;
END
$$;
COMMENT ON FUNCTION alk._estimate_jobs(text, text, bigint) IS
'internal: the planner''s estimate of how many of a queue''s jobs are ready, scheduled, waiting (on after jobs), '
'parked ready or parked scheduled (serial groups), '
'processing, lapsed, dead or completed '
'(alk.queue_stats past its exact_limit)';

CREATE FUNCTION alk.queue_stats(queue text DEFAULT NULL, exact_limit bigint DEFAULT NULL)
RETURNS SETOF alk.queue_stat
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Planned per call: a generic plan keeps every LIMIT node and CASE that a
-- NULL exact_limit folds away (exact counts: 1.10x the time of 0017's, 1.06x
-- with this), and the plan costs less than a millisecond.
SET plan_cache_mode = force_custom_plan
AS $$
#variable_conflict use_column
DECLARE
    clock bigint := alk.now();
    only_queue text := queue_stats.queue;
    -- Held one below the largest bigint: the counts read cap + 1 entries.
    cap bigint := least(queue_stats.exact_limit, 9223372036854775806);
BEGIN
    IF only_queue IS NOT NULL THEN
        -- Read-only, so reserved names (outbox backing queues) are accepted.
        PERFORM alk._check_name('queue', only_queue, true);
    END IF;
    IF cap < 0 THEN
        PERFORM alk._raise('LK002', 'exact_limit must be >= 0 or NULL (every count exact), got ' || cap);
    END IF;
    -- Every row is in exactly one of the five partial indexes (pending,
    -- waiting on after jobs or parked, processing, dead, completed), and each leads with
    -- the queue: the queue names come from a loose scan of the five (five
    -- probes per queue, whatever
    -- the row count), and each count is an index-only scan of one queue's
    -- entries in one of them. Nothing reads the heap but for pages the
    -- visibility map does not yet know to be all-visible.
    -- An exact count visits every entry once, so its cost is per entry
    -- (docs/dashboard.md "Performance"): with exact_limit each count stops
    -- after exact_limit + 1 entries and, past it, is the planner's estimate
    -- instead (at least exact_limit + 1, so a count above exact_limit is
    -- always an estimate, and estimated says the row holds one). The ages
    -- come from a loose scan over the pending index's priorities (per
    -- priority, its first entry at or before the clock and its first after
    -- it), so they stay exact at any size.
    RETURN QUERY
    WITH RECURSIVE names(name) AS (
        SELECT coalesce(only_queue, '')
        UNION ALL
        SELECT least(
            (SELECT j.queue FROM alk.jobs j WHERE j.state = 'pending' AND j.after_left = 0 AND j.queue > n.name
              ORDER BY j.queue LIMIT 1),
            (SELECT j.queue FROM alk.jobs j WHERE j.state = 'pending' AND j.after_left <> 0 AND j.queue > n.name
              ORDER BY j.queue LIMIT 1),
            (SELECT j.queue FROM alk.jobs j WHERE j.state = 'processing' AND j.queue > n.name
              ORDER BY j.queue LIMIT 1),
            (SELECT j.queue FROM alk.jobs j WHERE j.state = 'dead' AND j.queue > n.name ORDER BY j.queue LIMIT 1),
            (SELECT j.queue FROM alk.jobs j WHERE j.state = 'completed' AND j.queue > n.name
              ORDER BY j.queue LIMIT 1))
          FROM names n WHERE n.name IS NOT NULL AND only_queue IS NULL
    ),
    -- MATERIALIZED: inlined, each count would run once per mention below.
    capped AS MATERIALIZED (
        SELECT n.name,
               (SELECT count(*) FROM (SELECT FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'pending'
                                         AND j.after_left = 0 AND j.run_at <= clock LIMIT cap + 1) e) AS ready,
               (SELECT count(*) FROM (SELECT FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'pending'
                                         AND j.after_left = 0 AND j.run_at > clock LIMIT cap + 1) e) AS scheduled,
               (SELECT count(*) FROM (SELECT FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'pending'
                                         AND j.after_left > 0 LIMIT cap + 1) e) AS waiting,
               (SELECT count(*) FROM (SELECT FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'pending'
                                         AND j.after_left = -1 AND j.run_at <= clock LIMIT cap + 1) e) AS parked_ready,
               (SELECT count(*) FROM (SELECT FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'pending'
                                         AND j.after_left = -1 AND j.run_at > clock LIMIT cap + 1) e)
                 AS parked_scheduled,
               (SELECT count(*) FROM (SELECT FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'processing'
                                       LIMIT cap + 1) e) AS processing,
               (SELECT count(*) FROM (SELECT FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'processing'
                                         AND j.claim_expires_at < clock LIMIT cap + 1) e) AS lapsed,
               (SELECT count(*) FROM (SELECT FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'dead'
                                       LIMIT cap + 1) e) AS dead,
               (SELECT count(*) FROM (SELECT FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'completed'
                                       LIMIT cap + 1) e) AS completed
          FROM names n
         WHERE n.name IS NOT NULL AND n.name <> '' AND (NOT alk._limits_active() OR alk._in_scope(n.name))
    ),
    counted AS MATERIALIZED (
        SELECT c.name,
               CASE WHEN c.ready > cap THEN greatest(alk._estimate_jobs(c.name, 'ready', clock), cap + 1)
                    ELSE c.ready END
               -- Parked jobs (38_group_turns.sql) are pending: by run_at.
               + CASE WHEN c.parked_ready > cap
                      THEN greatest(alk._estimate_jobs(c.name, 'parked ready', clock), cap + 1)
                      ELSE c.parked_ready END AS ready,
               -- Jobs waiting on their after jobs are pending and not due: scheduled.
               CASE WHEN c.scheduled > cap THEN greatest(alk._estimate_jobs(c.name, 'scheduled', clock), cap + 1)
                    ELSE c.scheduled END
               + CASE WHEN c.waiting > cap THEN greatest(alk._estimate_jobs(c.name, 'waiting', clock), cap + 1)
                      ELSE c.waiting END
               + CASE WHEN c.parked_scheduled > cap
                      THEN greatest(alk._estimate_jobs(c.name, 'parked scheduled', clock), cap + 1)
                      ELSE c.parked_scheduled END AS scheduled,
               CASE WHEN c.processing > cap THEN greatest(alk._estimate_jobs(c.name, 'processing', clock), cap + 1)
                    ELSE c.processing END AS processing,
               CASE WHEN c.lapsed > cap THEN greatest(alk._estimate_jobs(c.name, 'lapsed', clock), cap + 1)
                    ELSE c.lapsed END AS lapsed,
               CASE WHEN c.dead > cap THEN greatest(alk._estimate_jobs(c.name, 'dead', clock), cap + 1)
                    ELSE c.dead END AS dead,
               CASE WHEN c.completed > cap THEN greatest(alk._estimate_jobs(c.name, 'completed', clock), cap + 1)
                    ELSE c.completed END AS completed,
               coalesce(greatest(c.ready, c.scheduled, c.waiting, c.parked_ready, c.parked_scheduled, c.processing,
                                 c.lapsed, c.dead, c.completed) > cap, false)
                 AS estimated
          FROM capped c
    )
    SELECT c.name, c.ready + c.scheduled, c.ready, c.scheduled, c.processing,
           -- Two estimates may disagree: never more lapsed than processing.
           least(c.lapsed, c.processing), c.dead,
           alk._sat_sub(clock, least(t.oldest_ready, w.oldest_ready)), least(t.next_run_at, w.next_run_at),
           EXISTS (SELECT FROM alk.paused_queues pq WHERE pq.queue = c.name), c.estimated, c.completed
      FROM counted c
     CROSS JOIN LATERAL (
        WITH RECURSIVE priorities(priority) AS (
            (SELECT j.priority FROM alk.jobs j WHERE j.queue = c.name AND j.state = 'pending' AND j.after_left = 0
              ORDER BY j.priority DESC LIMIT 1)
            UNION ALL
            SELECT (SELECT j.priority FROM alk.jobs j WHERE j.queue = c.name AND j.state = 'pending'
                       AND j.after_left = 0 AND j.priority < p.priority ORDER BY j.priority DESC LIMIT 1)
              FROM priorities p WHERE p.priority IS NOT NULL
        )
        SELECT min((SELECT j.run_at FROM alk.jobs j WHERE j.queue = c.name AND j.state = 'pending'
                       AND j.after_left = 0 AND j.priority = p.priority AND j.run_at <= clock ORDER BY j.run_at LIMIT 1)) AS oldest_ready,
               min((SELECT j.run_at FROM alk.jobs j WHERE j.queue = c.name AND j.state = 'pending'
                       AND j.after_left = 0 AND j.priority = p.priority AND j.run_at > clock ORDER BY j.run_at LIMIT 1)) AS next_run_at
          FROM priorities p WHERE p.priority IS NOT NULL) t
     -- Parked jobs, in jobs_waiting by run_at.
     CROSS JOIN LATERAL (
        SELECT (SELECT j.run_at FROM alk.jobs j WHERE j.queue = c.name AND j.state = 'pending' AND j.after_left = -1
                   AND j.run_at <= clock ORDER BY j.run_at LIMIT 1) AS oldest_ready,
               (SELECT j.run_at FROM alk.jobs j WHERE j.queue = c.name AND j.state = 'pending' AND j.after_left = -1
                   AND j.run_at > clock ORDER BY j.run_at LIMIT 1) AS next_run_at) w
     ORDER BY c.name;
END
$$;
COMMENT ON FUNCTION alk.queue_stats(text, bigint) IS
'One row per queue (every queue holding a job, reserved outbox queues included; or only the given queue, even when '
'empty): pending (= ready + scheduled), ready (pending and due), scheduled (pending, run_at in the future, or '
'waiting on its after jobs: alk.enqueue), '
'processing (leased, lapsed included), lapsed (lease ended: claimable again), dead, oldest_ready_age_s (now minus '
'the earliest run_at of a ready job: the queue''s lag; NULL when none is ready), next_run_at (the earliest run_at '
'of a scheduled job not waiting on after jobs; NULL when none), paused (alk.pause_queue), estimated, and '
'completed (acked jobs kept by '
'alk.set_queue_retention; last, as it came last). Every count is exact unless '
'exact_limit is given: then a count stops after exact_limit + 1 index entries and, past exact_limit, is the '
'planner''s estimate (from the table''s statistics, which ANALYZE and autovacuum keep current), never below '
'exact_limit + 1, and estimated is true. The ages are exact either way. Cost: index-only scans of the partial '
'indexes, linear in the entries counted: with exact_limit at most about 8 x exact_limit per queue '
'(docs/dashboard.md has numbers). Example: SELECT * FROM alk.queue_stats(exact_limit => 10000);';

-- list_jobs -----------------------------------------------------------------

CREATE FUNCTION alk.list_jobs(queue text, state text DEFAULT NULL, n bigint DEFAULT 100, after_id bigint DEFAULT NULL)
RETURNS SETOF alk.job
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
BEGIN
    PERFORM alk._check_name('queue', list_jobs.queue);
    IF state IS NOT NULL AND state NOT IN ('pending', 'processing', 'dead', 'completed') THEN
        PERFORM alk._raise('LK002', 'state must be pending, processing, dead, completed or NULL, got '
            || alk._show(state));
    END IF;
    -- An extent: n <= 0 (or NULL) lists nothing, never "all rows".
    IF n IS NULL OR n <= 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT j.id, j.queue, j.state, j.payload, j.priority, j.run_at, j.attempts, j.max_attempts, j.worker_id,
           j.claimed_at, j.claim_expires_at, j.created_at, j.expires_at, j.visibility_timeout_s,
           j.backoff_base_s, j.dead_letter_retention_s, j.last_error, j.died_at, j.dedup_key,
           j.attempts_refunded, j.headers, j.result, j.completed_at, j.group_key
      FROM alk.jobs j
     WHERE j.queue = list_jobs.queue
       AND (state IS NULL OR j.state = state)
       AND j.id > coalesce(after_id, -9223372036854775808)
     ORDER BY j.id
     LIMIT n;
END
$$;
COMMENT ON FUNCTION alk.list_jobs(text, text, bigint, bigint) IS
'Up to n jobs of a queue in id order, optionally only one state (pending, processing, dead or completed), after the id '
'after_id (keyset paging: pass the last id you saw). Whole rows, as alk.get_job returns them. n <= 0 lists nothing. '
'Example: SELECT id, attempts, last_error, died_at FROM alk.list_jobs(''emails'', state => ''dead'', n => 20);';

-- browse_jobs ---------------------------------------------------------------

CREATE TYPE alk.job_brief AS (
    id bigint,
    queue text,
    state text,
    priority bigint,
    run_at bigint,
    attempts bigint,
    max_attempts bigint,
    worker_id text,
    claimed_at bigint,
    claim_expires_at bigint,
    created_at bigint,
    expires_at bigint,
    last_error text,
    died_at bigint,
    payload_preview text,
    payload_bytes bigint
);
COMMENT ON TYPE alk.job_brief IS
'A job as a listing shows it: the alk.job columns but the payload, which is cut to payload_preview (its JSON text) '
'with payload_bytes its full size; last_error is cut to the same length.';

-- One page of one state in claim order. The key (priority DESC, run_at, id)
-- mixes directions, which a row comparison cannot express, so the page after
-- a key is two index ranges: the rest of the key's priority, then the lower
-- priorities. Both walk jobs_claim_pending in order for pending rows; the
-- other states have no index in that order and are sorted (bounded by the
-- queue's rows in that state).
CREATE FUNCTION alk._browse_jobs(queue text, state text, n bigint, after_priority bigint, after_run_at bigint,
                                 after_id bigint, preview_chars bigint)
RETURNS SETOF alk.job_brief
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT b.* FROM (
        (SELECT j.id, j.queue, j.state, j.priority::bigint, j.run_at, j.attempts::bigint, j.max_attempts::bigint,
                j.worker_id, j.claimed_at, j.claim_expires_at, j.created_at, j.expires_at,
                pg_catalog.left(j.last_error, preview_chars::integer), j.died_at,
                pg_catalog.left(j.payload::text, preview_chars::integer),
                pg_catalog.octet_length(j.payload::text)::bigint
           FROM alk.jobs j
          WHERE j.queue = _browse_jobs.queue AND j.state = _browse_jobs.state
            AND _browse_jobs.after_priority IS NULL
          ORDER BY j.priority DESC, j.run_at, j.id
          LIMIT _browse_jobs.n)
        UNION ALL
        (SELECT j.id, j.queue, j.state, j.priority::bigint, j.run_at, j.attempts::bigint, j.max_attempts::bigint,
                j.worker_id, j.claimed_at, j.claim_expires_at, j.created_at, j.expires_at,
                pg_catalog.left(j.last_error, preview_chars::integer), j.died_at,
                pg_catalog.left(j.payload::text, preview_chars::integer),
                pg_catalog.octet_length(j.payload::text)::bigint
           FROM alk.jobs j
          WHERE j.queue = _browse_jobs.queue AND j.state = _browse_jobs.state
            AND j.priority = _browse_jobs.after_priority AND (j.run_at, j.id) > (_browse_jobs.after_run_at, _browse_jobs.after_id)
          ORDER BY j.priority DESC, j.run_at, j.id
          LIMIT _browse_jobs.n)
        UNION ALL
        (SELECT j.id, j.queue, j.state, j.priority::bigint, j.run_at, j.attempts::bigint, j.max_attempts::bigint,
                j.worker_id, j.claimed_at, j.claim_expires_at, j.created_at, j.expires_at,
                pg_catalog.left(j.last_error, preview_chars::integer), j.died_at,
                pg_catalog.left(j.payload::text, preview_chars::integer),
                pg_catalog.octet_length(j.payload::text)::bigint
           FROM alk.jobs j
          WHERE j.queue = _browse_jobs.queue AND j.state = _browse_jobs.state
            AND j.priority < _browse_jobs.after_priority
          ORDER BY j.priority DESC, j.run_at, j.id
          LIMIT _browse_jobs.n)
    ) b
    ORDER BY b.priority DESC, b.run_at, b.id
    LIMIT _browse_jobs.n
$$;
COMMENT ON FUNCTION alk._browse_jobs(text, text, bigint, bigint, bigint, bigint, bigint) IS
'internal: one keyset page of one state of a queue in claim order';

CREATE FUNCTION alk.browse_jobs(queue text, state text DEFAULT 'pending', n bigint DEFAULT 50,
                                after_priority bigint DEFAULT NULL, after_run_at bigint DEFAULT NULL,
                                after_id bigint DEFAULT NULL, preview_chars bigint DEFAULT 200)
RETURNS SETOF alk.job_brief
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
BEGIN
    -- Read-only, so reserved names (outbox backing queues) are accepted.
    PERFORM alk._check_name('queue', browse_jobs.queue, true);
    IF state IS NULL OR state NOT IN ('pending', 'processing', 'dead', 'completed') THEN
        PERFORM alk._raise('LK002', 'state must be pending, processing, dead or completed, got '
            || alk._show(state));
    END IF;
    IF (after_priority IS NULL) <> (after_run_at IS NULL) OR (after_priority IS NULL) <> (after_id IS NULL) THEN
        PERFORM alk._raise('LK002', 'after_priority, after_run_at and after_id go together (the last row''s key), '
            || 'got ' || coalesce(after_priority::text, 'NULL') || ', ' || coalesce(after_run_at::text, 'NULL')
            || ', ' || coalesce(after_id::text, 'NULL'));
    END IF;
    IF preview_chars IS NULL OR preview_chars < 0 OR preview_chars > 1000000 THEN
        PERFORM alk._raise('LK002', 'preview_chars must be 0 to 1000000, got ' || coalesce(preview_chars::text, 'NULL'));
    END IF;
    -- An extent: n <= 0 (or NULL) lists nothing, never "all rows".
    IF n IS NULL OR n <= 0 THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM alk._browse_jobs(browse_jobs.queue, state, n, after_priority, after_run_at, after_id,
                                               preview_chars);
END
$$;
COMMENT ON FUNCTION alk.browse_jobs(text, text, bigint, bigint, bigint, bigint, bigint) IS
'Up to n jobs of one state (pending, processing, dead or completed) of a queue, in claim order (priority DESC, run_at, id), '
'after the key (after_priority, after_run_at, after_id) of the last row you saw: keyset paging, no OFFSET. Payloads '
'and last_error come cut to preview_chars characters, with payload_bytes the full size (alk.get_job has the whole '
'row). Pending rows are read from the claim index in order; the other states are sorted. n <= 0 lists '
'nothing. Example: SELECT id, priority, run_at, payload_preview FROM alk.browse_jobs(''emails'', ''pending'', 20); '
'then the next page: SELECT * FROM alk.browse_jobs(''emails'', ''pending'', 20, after_priority => 0, '
'after_run_at => 1700000000, after_id => 41);';
