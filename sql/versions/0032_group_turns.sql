-- pyalk 0032: group_turns (issue 26). A claim no longer walks past the jobs of busy serial groups: a pending
-- job that is not one of its group's turns (when the group has room, the first max_running_per_group - running
-- jobs of each of its priorities by run_at; none when full) is parked, after_left = -1, out of jobs_claim_pending.
-- alk._group_turns unparks a group's turns after a job of it leaves processing or pending (a trigger on the
-- settling, burying and deleting statements); alk._group_park parks at the commit of a transaction that added
-- or returned a grouped job (a deferred trigger). An advisory lock per group orders the two (the rule and its
-- proof are in sql/queue/38_group_turns.sql). queue_stats counts parked jobs as ready or scheduled by run_at,
-- as before; jobs_after_waiting becomes jobs_waiting (after jobs and parked). The claim rule
-- (alk._group_has_room) is unchanged. Jobs already pending stay unparked until their group's next event.

-- hand-written: the waiting index holds parked jobs too, by kind; parked jobs by group for the turns.
DROP INDEX alk.jobs_after_waiting;
CREATE INDEX jobs_waiting ON alk.jobs (queue, after_left, run_at) WHERE state = 'pending' AND after_left <> 0;
CREATE INDEX jobs_group_parked ON alk.jobs (queue, group_key, priority DESC, run_at, id)
    WHERE state = 'pending' AND after_left = -1;

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

-- alk._group_heal(text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._group_heal(queue text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM alk._group_turns(_group_heal.queue, array_agg(g.group_key))
       FROM (WITH RECURSIVE keys(group_key) AS (
                 (SELECT j.group_key FROM alk.jobs j
                   WHERE j.queue = _group_heal.queue AND j.state = 'pending' AND j.after_left = -1
                   ORDER BY j.group_key LIMIT 1)
                 UNION ALL
                 SELECT (SELECT j.group_key FROM alk.jobs j
                          WHERE j.queue = _group_heal.queue AND j.state = 'pending' AND j.after_left = -1
                            AND j.group_key > k.group_key ORDER BY j.group_key LIMIT 1)
                   FROM keys k WHERE k.group_key IS NOT NULL)
             SELECT k.group_key FROM keys k WHERE k.group_key IS NOT NULL) g
     HAVING count(*) > 0;
END
$$;
COMMENT ON FUNCTION alk._group_heal(text) IS 'internal: unpark the turns of every serial group of a queue with a parked job';

-- alk._group_left(): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._group_left()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM alk._group_turns(OLD.queue, ARRAY[OLD.group_key]);
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION alk._group_left() IS
'internal: trigger: unpark the turns of the group of a job that left processing or pending';

-- alk._group_lock(text,text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._group_lock(queue text, group_key text)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.hashtext($1 || E'\x1f' || $2)
$$;
COMMENT ON FUNCTION alk._group_lock(text, text) IS
'internal: the second key of a serial group''s advisory lock (the first is 1634495335, ''alkg'')';

-- alk._group_park(): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._group_park()
RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    room bigint;
    turns bigint[] := '{}';
    park bigint[];
    unpark bigint[];
BEGIN
    -- Above READ COMMITTED the reads below would not be fresh: park nothing.
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed'
       -- Parked already (by this commit's call for an earlier row) or gone.
       OR NOT EXISTS (SELECT FROM alk.jobs j WHERE j.id = NEW.id AND j.queue = NEW.queue
                                               AND j.state = 'pending' AND j.after_left = 0)
       OR NOT pg_catalog.pg_try_advisory_xact_lock(1634495335, alk._group_lock(NEW.queue, NEW.group_key)) THEN
        RETURN NULL;
    END IF;
    room := alk._group_room(NEW.queue, NEW.group_key);
    IF room > 0 THEN
        -- No parked job and no more pending ones than the room: all are
        -- turns (a group's first job, the usual case). Else compute them.
        IF NOT EXISTS (SELECT FROM alk.jobs j WHERE j.queue = NEW.queue AND j.group_key = NEW.group_key
                                                AND j.state = 'pending' AND j.after_left = -1)
           AND (SELECT count(*) FROM (SELECT FROM alk.jobs j
                                       WHERE j.queue = NEW.queue AND j.group_key = NEW.group_key
                                         AND j.state = 'pending' AND j.after_left = 0 LIMIT room + 1) c) <= room THEN
            RETURN NULL;
        END IF;
        turns := alk._group_turn_ids(NEW.queue, NEW.group_key, room);
        SELECT array_agg(t.id) INTO unpark
          FROM (SELECT k.id FROM alk.jobs k
                 WHERE k.id = ANY (turns) AND k.queue = NEW.queue AND k.state = 'pending' AND k.after_left = -1
                   FOR NO KEY UPDATE SKIP LOCKED) t;
        IF unpark IS NOT NULL THEN
            UPDATE alk.jobs j SET after_left = 0 WHERE j.id = ANY (unpark) AND j.queue = NEW.queue;
        END IF;
    END IF;
    SELECT array_agg(t.id) INTO park
      FROM (SELECT k.id FROM alk.jobs k
             WHERE k.queue = NEW.queue AND k.group_key = NEW.group_key AND k.state = 'pending' AND k.after_left = 0
               AND k.id <> ALL (turns)
               FOR NO KEY UPDATE SKIP LOCKED) t;
    IF park IS NOT NULL THEN
        UPDATE alk.jobs j SET after_left = -1 WHERE j.id = ANY (park) AND j.queue = NEW.queue;
    END IF;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION alk._group_park() IS
'internal: trigger, at commit: park the pending jobs of the new job''s serial group that are not its turns';

-- alk._group_room(text,text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._group_room(queue text, group_key text)
RETURNS bigint
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT s.share - (SELECT count(*) FROM (SELECT FROM alk.jobs k
                                             WHERE k.queue = $1 AND k.group_key = $2 AND k.state = 'processing'
                                             LIMIT s.share) r)
      FROM (SELECT coalesce((SELECT l.max_running_per_group FROM alk.limited_queues l WHERE l.queue = $1), 1)
                   AS share) s
$$;
COMMENT ON FUNCTION alk._group_room(text, text) IS
'internal: how many more jobs of a serial group may run now (max_running_per_group, default 1, less its processing)';

-- alk._group_turn_ids(text,text,bigint): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._group_turn_ids(queue text, group_key text, room bigint)
RETURNS bigint[]
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    WITH RECURSIVE unparked(priority) AS (
        (SELECT j.priority FROM alk.jobs j
          WHERE j.queue = $1 AND j.group_key = $2 AND j.state = 'pending' AND j.after_left = 0
          ORDER BY j.priority DESC LIMIT 1)
        UNION ALL
        SELECT (SELECT j.priority FROM alk.jobs j
                 WHERE j.queue = $1 AND j.group_key = $2 AND j.state = 'pending' AND j.after_left = 0
                   AND j.priority < u.priority ORDER BY j.priority DESC LIMIT 1)
          FROM unparked u WHERE u.priority IS NOT NULL
    ), parked(priority) AS (
        (SELECT j.priority FROM alk.jobs j
          WHERE j.queue = $1 AND j.group_key = $2 AND j.state = 'pending' AND j.after_left = -1
          ORDER BY j.priority DESC LIMIT 1)
        UNION ALL
        SELECT (SELECT j.priority FROM alk.jobs j
                 WHERE j.queue = $1 AND j.group_key = $2 AND j.state = 'pending' AND j.after_left = -1
                   AND j.priority < p.priority ORDER BY j.priority DESC LIMIT 1)
          FROM parked p WHERE p.priority IS NOT NULL
    ), levels AS (
        SELECT u.priority FROM unparked u WHERE u.priority IS NOT NULL
        UNION
        SELECT p.priority FROM parked p WHERE p.priority IS NOT NULL
    )
    SELECT coalesce(array_agg(t.id), '{}')
      FROM levels l
     CROSS JOIN LATERAL (
        SELECT c.id FROM (
            (SELECT j.id, j.run_at FROM alk.jobs j
              WHERE j.queue = $1 AND j.group_key = $2 AND j.state = 'pending' AND j.after_left = 0
                AND j.priority = l.priority ORDER BY j.run_at, j.id LIMIT $3)
            UNION ALL
            (SELECT j.id, j.run_at FROM alk.jobs j
              WHERE j.queue = $1 AND j.group_key = $2 AND j.state = 'pending' AND j.after_left = -1
                AND j.priority = l.priority ORDER BY j.run_at, j.id LIMIT $3)) c
         ORDER BY c.run_at, c.id LIMIT $3) t
$$;
COMMENT ON FUNCTION alk._group_turn_ids(text, text, bigint) IS
'internal: a serial group''s turns for a room of `room` jobs: per priority, the first `room` pending jobs by run_at, id';

-- alk._group_turns(text,text[]): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._group_turns(queue text, group_keys text[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
-- One plan per statement: a custom plan of a statement on the partitioned
-- table costs more to plan than to run.
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    g text;
    room bigint;
    turns bigint[];
    ids bigint[];
BEGIN
    FOR g IN SELECT DISTINCT k FROM unnest(group_keys) AS u(k) WHERE k IS NOT NULL ORDER BY k LOOP
        PERFORM pg_catalog.pg_advisory_xact_lock_shared(1634495335, alk._group_lock(_group_turns.queue, g));
        CONTINUE WHEN NOT EXISTS (SELECT FROM alk.jobs j WHERE j.queue = _group_turns.queue AND j.group_key = g
                                                          AND j.state = 'pending' AND j.after_left = -1);
        room := alk._group_room(_group_turns.queue, g);
        CONTINUE WHEN room <= 0;
        -- SKIP LOCKED: a parked row is locked only by another settle
        -- unparking it, a cancel or a sweep; none needs us to wait.
        turns := alk._group_turn_ids(_group_turns.queue, g, room);
        SELECT array_agg(t.id) INTO ids
          FROM (SELECT k.id FROM alk.jobs k
                 WHERE k.id = ANY (turns)
                   AND k.queue = _group_turns.queue AND k.state = 'pending' AND k.after_left = -1
                   FOR NO KEY UPDATE SKIP LOCKED) t;
        IF ids IS NOT NULL THEN
            UPDATE alk.jobs j SET after_left = 0 WHERE j.id = ANY (ids) AND j.queue = _group_turns.queue;
        END IF;
    END LOOP;
END
$$;
COMMENT ON FUNCTION alk._group_turns(text, text[]) IS
'internal: unpark the turns of these serial groups (after a job of theirs left processing, or a turn left pending)';

-- alk._sweep_expired(text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._sweep_expired(queue text)
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

-- alk.rotate_jobs(bigint): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.rotate_jobs(min_jobs bigint DEFAULT 10000)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- More live rows than this and the rotation waits for the backlog to
    -- drain: moving them holds every claim, ack and enqueue of the slot
    -- (about 2 ms per 1,000 rows, measured).
    max_live constant bigint := 20000;
    -- The longest a rotation waits for its lock, and so holds up the claims
    -- and acks queued behind it.
    max_wait_s constant double precision := 0.1;
    previous_timeout text;
    since bigint;
    last_id bigint;
    cur bigint;
    nxt bigint;
    live bigint;
BEGIN
    IF min_jobs IS NULL OR min_jobs < 0 THEN
        PERFORM alk._raise('LK002', 'min_jobs must be >= 0, got ' || coalesce(min_jobs::text, 'NULL'));
    END IF;
    -- Never queue behind anybody: a waiting ACCESS EXCLUSIVE request would
    -- stall every claim and ack behind it. Whoever holds a lock, we go.
    IF NOT pg_catalog.pg_try_advisory_xact_lock(alk._rotation_lock()) THEN
        RETURN 'locked';
    END IF;
    SELECT s.current_slot, s.rotated_at_id INTO cur, since FROM alk.job_slots s;
    last_id := coalesce(pg_catalog.pg_sequence_last_value('alk.jobs_id_seq'), 0);
    IF last_id - since < min_jobs THEN
        RETURN 'not due';
    END IF;
    nxt := 1 - cur;
    -- Every statement on alk.jobs locks every slot it may touch until its
    -- transaction ends, and under load some claim or ack always holds the
    -- slot. Wait for it, briefly (the statements that queue behind our
    -- request wait as long), and only behind transactions under a second
    -- old (claims, acks): behind an old one (an enqueue in a long
    -- transaction, a pg_dump) we would stall everybody for nothing.
    BEGIN
        EXECUTE pg_catalog.format('LOCK TABLE alk.jobs_%s IN ACCESS EXCLUSIVE MODE NOWAIT', cur);
    EXCEPTION WHEN lock_not_available THEN
        IF EXISTS (SELECT FROM pg_catalog.pg_locks l JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
                    WHERE l.locktype = 'relation' AND l.database = a.datid AND l.granted
                      AND l.relation = pg_catalog.format('alk.jobs_%s', cur)::regclass
                      AND a.xact_start < pg_catalog.clock_timestamp() - interval '1 second') THEN
            RETURN 'locked';
        END IF;
        previous_timeout := pg_catalog.current_setting('lock_timeout');
        PERFORM pg_catalog.set_config('lock_timeout', (max_wait_s * 1000)::int::text, true);
        BEGIN
            EXECUTE pg_catalog.format('LOCK TABLE alk.jobs_%s IN ACCESS EXCLUSIVE MODE', cur);
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_catalog.set_config('lock_timeout', previous_timeout, true);
            RETURN 'locked';
        END;
        PERFORM pg_catalog.set_config('lock_timeout', previous_timeout, true);
    END;
    EXECUTE pg_catalog.format(
        'SELECT count(*) FROM (SELECT FROM alk.jobs_%s j WHERE j.state IN (''pending'', ''processing'') LIMIT %s) l',
        cur, max_live + 1) INTO live;
    IF live > max_live THEN
        RETURN 'too many live jobs';
    END IF;
    -- Through the parent, so the row moves whole (id, attempts, lease and
    -- all: every token stays valid). Whoever waited for our lock takes its
    -- snapshot after it, and finds the rows where they went. A moved row is
    -- deleted from its slot and inserted into the other: alk.rotating tells
    -- the serial groups' triggers (38_group_turns.sql) that nothing settled.
    PERFORM pg_catalog.set_config('alk.rotating', 'on', true);
    EXECUTE pg_catalog.format(
        'UPDATE alk.jobs SET slot = CASE WHEN state IN (''pending'', ''processing'') THEN %s ELSE 2 END WHERE slot = %s',
        nxt, cur);
    PERFORM pg_catalog.set_config('alk.rotating', '', true);
    EXECUTE pg_catalog.format('TRUNCATE alk.jobs_%s', cur);
    UPDATE alk.job_slots s
       SET current_slot = nxt, rotated_at_id = last_id, rotated_at = alk.now(), rotations = s.rotations + 1;
    RETURN 'rotated';
END
$$;
COMMENT ON FUNCTION alk.rotate_jobs(bigint) IS
'Rotate the job storage once the current slot has taken min_jobs jobs (ids) since the last rotation: its pending '
'and processing jobs move to the other slot, its dead and completed jobs to the kept slot, and it is emptied with '
'TRUNCATE, which gives the space back even while a snapshot holds VACUUM back. Waits at most 100 ms for its lock, '
'and only behind transactions under a second old: returns '
'''rotated'', ''not due'', ''locked'' (a transaction that touched the jobs is open, or a rotation runs: try again) '
'or ''too many live jobs'' (over 20,000 pending and processing: waits for the backlog to drain). Workers call it; '
'without workers, call it every second or so (pg_cron). '
'Example: SELECT alk.rotate_jobs();';

-- alk.set_queue_limits(text,bigint,bigint,bigint,bigint): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.set_queue_limits(queue text, max_running bigint DEFAULT NULL, rate bigint DEFAULT NULL,
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

-- constraints differ: write the ALTER (or CREATE) by hand
--   current only: ('alk.jobs', 'jobs_group_arrived', 'TRIGGER DEFERRABLE INITIALLY DEFERRED')
--   current only: ('alk.jobs', 'jobs_group_returned', 'TRIGGER DEFERRABLE INITIALLY DEFERRED')
--   current only: ('alk.jobs_0', 'jobs_group_arrived', 'TRIGGER DEFERRABLE INITIALLY DEFERRED')
--   current only: ('alk.jobs_0', 'jobs_group_returned', 'TRIGGER DEFERRABLE INITIALLY DEFERRED')
--   current only: ('alk.jobs_1', 'jobs_group_arrived', 'TRIGGER DEFERRABLE INITIALLY DEFERRED')
--   current only: ('alk.jobs_1', 'jobs_group_returned', 'TRIGGER DEFERRABLE INITIALLY DEFERRED')
--   current only: ('alk.jobs_kept', 'jobs_group_arrived', 'TRIGGER DEFERRABLE INITIALLY DEFERRED')
--   current only: ('alk.jobs_kept', 'jobs_group_returned', 'TRIGGER DEFERRABLE INITIALLY DEFERRED')

-- triggers differ: write the ALTER (or CREATE) by hand
--   current only: ('alk.jobs', 'jobs_group_arrived', "CREATE CONSTRAINT TRIGGER jobs_group_arrived AFTER INSERT ON alk.jobs DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (((new.group_key IS NOT NULL) AND (new.state = 'pending'::text) AND (new.after_left = 0) AND (current_setting('alk.rotating'::text, true) IS DISTINCT FROM 'on'::text))) EXECUTE FUNCTION alk._group_park()")
--   current only: ('alk.jobs', 'jobs_group_gone', "CREATE TRIGGER jobs_group_gone AFTER DELETE ON alk.jobs FOR EACH ROW WHEN (((old.group_key IS NOT NULL) AND (old.state = ANY (ARRAY['pending'::text, 'processing'::text])) AND (current_setting('alk.rotating'::text, true) IS DISTINCT FROM 'on'::text))) EXECUTE FUNCTION alk._group_left()")
--   current only: ('alk.jobs', 'jobs_group_left', "CREATE TRIGGER jobs_group_left AFTER UPDATE OF run_at, attempts_refunded, died_at, completed_at ON alk.jobs FOR EACH ROW WHEN (((old.group_key IS NOT NULL) AND (old.state = ANY (ARRAY['pending'::text, 'processing'::text])) AND (new.state <> old.state))) EXECUTE FUNCTION alk._group_left()")
--   current only: ('alk.jobs', 'jobs_group_returned', "CREATE CONSTRAINT TRIGGER jobs_group_returned AFTER UPDATE OF run_at, after_left ON alk.jobs DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (((new.group_key IS NOT NULL) AND (new.state = 'pending'::text) AND (new.after_left = 0) AND (old.after_left <> '-1'::integer))) EXECUTE FUNCTION alk._group_park()")
--   current only: ('alk.jobs_0', 'jobs_group_arrived', "CREATE CONSTRAINT TRIGGER jobs_group_arrived AFTER INSERT ON alk.jobs_0 DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (((new.group_key IS NOT NULL) AND (new.state = 'pending'::text) AND (new.after_left = 0) AND (current_setting('alk.rotating'::text, true) IS DISTINCT FROM 'on'::text))) EXECUTE FUNCTION alk._group_park()")
--   current only: ('alk.jobs_0', 'jobs_group_gone', "CREATE TRIGGER jobs_group_gone AFTER DELETE ON alk.jobs_0 FOR EACH ROW WHEN (((old.group_key IS NOT NULL) AND (old.state = ANY (ARRAY['pending'::text, 'processing'::text])) AND (current_setting('alk.rotating'::text, true) IS DISTINCT FROM 'on'::text))) EXECUTE FUNCTION alk._group_left()")
--   current only: ('alk.jobs_0', 'jobs_group_left', "CREATE TRIGGER jobs_group_left AFTER UPDATE OF run_at, attempts_refunded, died_at, completed_at ON alk.jobs_0 FOR EACH ROW WHEN (((old.group_key IS NOT NULL) AND (old.state = ANY (ARRAY['pending'::text, 'processing'::text])) AND (new.state <> old.state))) EXECUTE FUNCTION alk._group_left()")
--   current only: ('alk.jobs_0', 'jobs_group_returned', "CREATE CONSTRAINT TRIGGER jobs_group_returned AFTER UPDATE OF run_at, after_left ON alk.jobs_0 DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (((new.group_key IS NOT NULL) AND (new.state = 'pending'::text) AND (new.after_left = 0) AND (old.after_left <> '-1'::integer))) EXECUTE FUNCTION alk._group_park()")
--   current only: ('alk.jobs_1', 'jobs_group_arrived', "CREATE CONSTRAINT TRIGGER jobs_group_arrived AFTER INSERT ON alk.jobs_1 DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (((new.group_key IS NOT NULL) AND (new.state = 'pending'::text) AND (new.after_left = 0) AND (current_setting('alk.rotating'::text, true) IS DISTINCT FROM 'on'::text))) EXECUTE FUNCTION alk._group_park()")
--   current only: ('alk.jobs_1', 'jobs_group_gone', "CREATE TRIGGER jobs_group_gone AFTER DELETE ON alk.jobs_1 FOR EACH ROW WHEN (((old.group_key IS NOT NULL) AND (old.state = ANY (ARRAY['pending'::text, 'processing'::text])) AND (current_setting('alk.rotating'::text, true) IS DISTINCT FROM 'on'::text))) EXECUTE FUNCTION alk._group_left()")
--   current only: ('alk.jobs_1', 'jobs_group_left', "CREATE TRIGGER jobs_group_left AFTER UPDATE OF run_at, attempts_refunded, died_at, completed_at ON alk.jobs_1 FOR EACH ROW WHEN (((old.group_key IS NOT NULL) AND (old.state = ANY (ARRAY['pending'::text, 'processing'::text])) AND (new.state <> old.state))) EXECUTE FUNCTION alk._group_left()")
--   current only: ('alk.jobs_1', 'jobs_group_returned', "CREATE CONSTRAINT TRIGGER jobs_group_returned AFTER UPDATE OF run_at, after_left ON alk.jobs_1 DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (((new.group_key IS NOT NULL) AND (new.state = 'pending'::text) AND (new.after_left = 0) AND (old.after_left <> '-1'::integer))) EXECUTE FUNCTION alk._group_park()")
--   current only: ('alk.jobs_kept', 'jobs_group_arrived', "CREATE CONSTRAINT TRIGGER jobs_group_arrived AFTER INSERT ON alk.jobs_kept DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (((new.group_key IS NOT NULL) AND (new.state = 'pending'::text) AND (new.after_left = 0) AND (current_setting('alk.rotating'::text, true) IS DISTINCT FROM 'on'::text))) EXECUTE FUNCTION alk._group_park()")
--   current only: ('alk.jobs_kept', 'jobs_group_gone', "CREATE TRIGGER jobs_group_gone AFTER DELETE ON alk.jobs_kept FOR EACH ROW WHEN (((old.group_key IS NOT NULL) AND (old.state = ANY (ARRAY['pending'::text, 'processing'::text])) AND (current_setting('alk.rotating'::text, true) IS DISTINCT FROM 'on'::text))) EXECUTE FUNCTION alk._group_left()")
--   current only: ('alk.jobs_kept', 'jobs_group_left', "CREATE TRIGGER jobs_group_left AFTER UPDATE OF run_at, attempts_refunded, died_at, completed_at ON alk.jobs_kept FOR EACH ROW WHEN (((old.group_key IS NOT NULL) AND (old.state = ANY (ARRAY['pending'::text, 'processing'::text])) AND (new.state <> old.state))) EXECUTE FUNCTION alk._group_left()")
--   current only: ('alk.jobs_kept', 'jobs_group_returned', "CREATE CONSTRAINT TRIGGER jobs_group_returned AFTER UPDATE OF run_at, after_left ON alk.jobs_kept DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (((new.group_key IS NOT NULL) AND (new.state = 'pending'::text) AND (new.after_left = 0) AND (old.after_left <> '-1'::integer))) EXECUTE FUNCTION alk._group_park()")

-- hand-written: the triggers (as sql/queue/38_group_turns.sql has them).
-- Triggers rather than a call in each of the dozen statements that settle,
-- bury, cancel or purge a job. WHEN keeps jobs without a group free of them
-- (one test of a column per deleted row); the UPDATE one fires only on the
-- columns a job leaving processing or pending sets and the claim does not
-- (retry and snooze set run_at, release attempts_refunded, a burial died_at,
-- a completion completed_at). A rotation's moved rows (alk.rotate_jobs sets
-- alk.rotating) are deleted and inserted, not settled.
CREATE TRIGGER jobs_group_left AFTER UPDATE OF run_at, attempts_refunded, died_at, completed_at ON alk.jobs
    FOR EACH ROW WHEN (OLD.group_key IS NOT NULL AND OLD.state IN ('pending', 'processing') AND NEW.state <> OLD.state)
    EXECUTE FUNCTION alk._group_left();
COMMENT ON TRIGGER jobs_group_left ON alk.jobs IS
'Unparks the turns of the serial group of a job that left processing or pending (alk._group_turns).';
CREATE TRIGGER jobs_group_gone AFTER DELETE ON alk.jobs
    FOR EACH ROW WHEN (OLD.group_key IS NOT NULL AND OLD.state IN ('pending', 'processing')
                       AND pg_catalog.current_setting('alk.rotating', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION alk._group_left();
COMMENT ON TRIGGER jobs_group_gone ON alk.jobs IS
'Unparks the turns of the serial group of a processing or pending job deleted (acked, cancelled) (alk._group_turns).';

-- Deferred to the commit, so the group's lock is held from the fresh read
-- to the commit only, not for the life of the transaction that enqueued
-- (a settle of the group waits for that lock). WHEN keeps jobs without a
-- group free of the trigger; a rotation's moved rows (alk.rotate_jobs sets
-- alk.rotating) are neither new nor changed.
CREATE CONSTRAINT TRIGGER jobs_group_arrived AFTER INSERT ON alk.jobs
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (NEW.group_key IS NOT NULL AND NEW.state = 'pending' AND NEW.after_left = 0
          AND pg_catalog.current_setting('alk.rotating', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION alk._group_park();
COMMENT ON TRIGGER jobs_group_arrived ON alk.jobs IS
'At commit, parks the new grouped job and its group''s pending jobs that are not the group''s turns (alk._group_park).';

-- A job pending again (a retry's or snooze's run_at, requeue_dead) or done
-- waiting for its after jobs. Neither the claim nor an ack sets these
-- columns, so their hot path pays nothing; an unpark (-1 to 0) is a turn.
CREATE CONSTRAINT TRIGGER jobs_group_returned AFTER UPDATE OF run_at, after_left ON alk.jobs
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (NEW.group_key IS NOT NULL AND NEW.state = 'pending' AND NEW.after_left = 0 AND OLD.after_left <> -1)
    EXECUTE FUNCTION alk._group_park();
COMMENT ON TRIGGER jobs_group_returned ON alk.jobs IS
'At commit, parks a grouped job that became pending again, or claimable after its after jobs, unless it is one of '
'its group''s turns (alk._group_park).';

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
