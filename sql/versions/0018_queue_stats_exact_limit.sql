-- pyalk 0018: queue_stats_exact_limit. alk.queue_stats takes exact_limit: each count stops after exact_limit + 1
-- index entries and past it is the planner's estimate (alk._estimate_jobs), flagged by the new column estimated;
-- the ages come from a loose scan over the pending index's priorities, exact at any size. A dashboard's overview
-- of 10^6 jobs then costs milliseconds, not an exact count of every entry (about 0.13 ms per 1,000).

-- hand-written: the signature and the row type change. Keep what an administrator granted on the old
-- alk.queue_stats(text), re-granted on the new one below; the type gains its column at the end.
SELECT pg_catalog.set_config('alk.upgrade_grants', coalesce((
    SELECT pg_catalog.jsonb_agg(a.grantee::regrole::text)
      FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
     WHERE p.oid = 'alk.queue_stats(text)'::regprocedure
       AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner), '[]')::text, false);
DROP FUNCTION alk.queue_stats(text);
ALTER TYPE alk.queue_stat ADD ATTRIBUTE estimated boolean;

-- alk._estimate_jobs(text,text,bigint): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._estimate_jobs(queue text, kind text, clock bigint)
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
                'WHERE j.queue = $1 AND j.state = ''pending'' AND j.run_at <= $2' INTO plan USING queue, clock;
    WHEN 'scheduled' THEN
        EXECUTE 'EXPLAIN (FORMAT JSON) SELECT FROM alk.jobs j '
                'WHERE j.queue = $1 AND j.state = ''pending'' AND j.run_at > $2' INTO plan USING queue, clock;
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
    END CASE;
    RETURN round((plan -> 0 -> 'Plan' ->> 'Plan Rows')::numeric)::bigint;
END
$$;
COMMENT ON FUNCTION alk._estimate_jobs(text, text, bigint) IS
'internal: the planner''s estimate of how many of a queue''s jobs are ready, scheduled, processing, lapsed or dead '
'(alk.queue_stats past its exact_limit)';

-- alk.queue_stats(text,bigint): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.queue_stats(queue text DEFAULT NULL, exact_limit bigint DEFAULT NULL)
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
    -- Every row is in exactly one of the three partial indexes (pending,
    -- processing, dead), and each leads with the queue: the queue names come
    -- from a loose scan of the three (three index probes per queue, whatever
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
            (SELECT j.queue FROM alk.jobs j WHERE j.state = 'pending' AND j.queue > n.name ORDER BY j.queue LIMIT 1),
            (SELECT j.queue FROM alk.jobs j WHERE j.state = 'processing' AND j.queue > n.name
              ORDER BY j.queue LIMIT 1),
            (SELECT j.queue FROM alk.jobs j WHERE j.state = 'dead' AND j.queue > n.name ORDER BY j.queue LIMIT 1))
          FROM names n WHERE n.name IS NOT NULL AND only_queue IS NULL
    ),
    -- MATERIALIZED: inlined, each count would run once per mention below.
    capped AS MATERIALIZED (
        SELECT n.name,
               (SELECT count(*) FROM (SELECT FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'pending'
                                         AND j.run_at <= clock LIMIT cap + 1) e) AS ready,
               (SELECT count(*) FROM (SELECT FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'pending'
                                         AND j.run_at > clock LIMIT cap + 1) e) AS scheduled,
               (SELECT count(*) FROM (SELECT FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'processing'
                                       LIMIT cap + 1) e) AS processing,
               (SELECT count(*) FROM (SELECT FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'processing'
                                         AND j.claim_expires_at < clock LIMIT cap + 1) e) AS lapsed,
               (SELECT count(*) FROM (SELECT FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'dead'
                                       LIMIT cap + 1) e) AS dead
          FROM names n
         WHERE n.name IS NOT NULL AND n.name <> '' AND (NOT alk._limits_active() OR alk._in_scope(n.name))
    ),
    counted AS MATERIALIZED (
        SELECT c.name,
               CASE WHEN c.ready > cap THEN greatest(alk._estimate_jobs(c.name, 'ready', clock), cap + 1)
                    ELSE c.ready END AS ready,
               CASE WHEN c.scheduled > cap THEN greatest(alk._estimate_jobs(c.name, 'scheduled', clock), cap + 1)
                    ELSE c.scheduled END AS scheduled,
               CASE WHEN c.processing > cap THEN greatest(alk._estimate_jobs(c.name, 'processing', clock), cap + 1)
                    ELSE c.processing END AS processing,
               CASE WHEN c.lapsed > cap THEN greatest(alk._estimate_jobs(c.name, 'lapsed', clock), cap + 1)
                    ELSE c.lapsed END AS lapsed,
               CASE WHEN c.dead > cap THEN greatest(alk._estimate_jobs(c.name, 'dead', clock), cap + 1)
                    ELSE c.dead END AS dead,
               coalesce(greatest(c.ready, c.scheduled, c.processing, c.lapsed, c.dead) > cap, false) AS estimated
          FROM capped c
    )
    SELECT c.name, c.ready + c.scheduled, c.ready, c.scheduled, c.processing,
           -- Two estimates may disagree: never more lapsed than processing.
           least(c.lapsed, c.processing), c.dead,
           alk._sat_sub(clock, t.oldest_ready), t.next_run_at,
           EXISTS (SELECT FROM alk.paused_queues pq WHERE pq.queue = c.name), c.estimated
      FROM counted c
     CROSS JOIN LATERAL (
        WITH RECURSIVE priorities(priority) AS (
            (SELECT j.priority FROM alk.jobs j WHERE j.queue = c.name AND j.state = 'pending'
              ORDER BY j.priority DESC LIMIT 1)
            UNION ALL
            SELECT (SELECT j.priority FROM alk.jobs j WHERE j.queue = c.name AND j.state = 'pending'
                       AND j.priority < p.priority ORDER BY j.priority DESC LIMIT 1)
              FROM priorities p WHERE p.priority IS NOT NULL
        )
        SELECT min((SELECT j.run_at FROM alk.jobs j WHERE j.queue = c.name AND j.state = 'pending'
                       AND j.priority = p.priority AND j.run_at <= clock ORDER BY j.run_at LIMIT 1)) AS oldest_ready,
               min((SELECT j.run_at FROM alk.jobs j WHERE j.queue = c.name AND j.state = 'pending'
                       AND j.priority = p.priority AND j.run_at > clock ORDER BY j.run_at LIMIT 1)) AS next_run_at
          FROM priorities p WHERE p.priority IS NOT NULL) t
     ORDER BY c.name;
END
$$;
COMMENT ON FUNCTION alk.queue_stats(text, bigint) IS
'One row per queue (every queue holding a job, reserved outbox queues included; or only the given queue, even when '
'empty): pending (= ready + scheduled), ready (pending and due), scheduled (pending, run_at in the future), '
'processing (leased, lapsed included), lapsed (lease ended: claimable again), dead, oldest_ready_age_s (now minus '
'the earliest run_at of a ready job: the queue''s lag; NULL when none is ready), next_run_at (the earliest run_at '
'of a scheduled job; NULL when none), paused (alk.pause_queue) and estimated. Every count is exact unless '
'exact_limit is given: then a count stops after exact_limit + 1 index entries and, past exact_limit, is the '
'planner''s estimate (from the table''s statistics, which ANALYZE and autovacuum keep current), never below '
'exact_limit + 1, and estimated is true. The ages are exact either way. Cost: index-only scans of the partial '
'indexes, linear in the entries counted: with exact_limit at most about 5 x exact_limit per queue '
'(docs/dashboard.md has numbers). Example: SELECT * FROM alk.queue_stats(exact_limit => 10000);';

-- hand-written: the grants kept above.
DO $$
DECLARE
    g jsonb;
BEGIN
    FOR g IN SELECT * FROM pg_catalog.jsonb_array_elements(pg_catalog.current_setting('alk.upgrade_grants')::jsonb) LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION alk.queue_stats(text, bigint) TO %s', g #>> '{}');
    END LOOP;
    PERFORM pg_catalog.set_config('alk.upgrade_grants', '', false);
END
$$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
