-- pyalk 0035: live_slots_pruned (issue 25). Since 0031 every lookup of a job through alk.jobs visited all three
-- partitions (two rotating slots and jobs_kept): server side, claim 1 + ack went from 215 to 278 us. Live
-- (pending, processing) jobs are never in jobs_kept, so every statement of the claim, settle, give-back, cancel,
-- serial-group and keyed-enqueue paths now says slot <> 2, which the planner prunes at plan time: no lock,
-- probe or executor setup of jobs_kept on the hot path. jobs_kept gets a CHECK that it holds only dead and
-- completed rows, so the pruning rests on a rule rather than on every writer's care.

-- alk._claim(text,text,bigint): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._claim(queue text, worker_id text, n bigint)
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
    lim alk.limited_queues;
    per_group bigint := 1;
    granted bigint;
BEGIN
    -- An extent: n <= 0 (or NULL) claims nothing.
    IF wanted IS NULL OR wanted <= 0 THEN
        RETURN;
    END IF;
    -- Queue limits: one probe of a table that holds only limited queues. A
    -- row found is locked, the queue's claim lock (alk._claim_budget), and
    -- the claim takes at most what the limits leave. No row: no lock.
    SELECT * INTO lim FROM alk.limited_queues l WHERE l.queue = _claim.queue FOR NO KEY UPDATE;
    IF lim.queue IS NOT NULL THEN
        wanted := alk._claim_budget(lim, clock, wanted);
        per_group := coalesce(lim.max_running_per_group, 1);
        IF wanted <= 0 THEN
            RETURN;
        END IF;
    END IF;
    granted := wanted;
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
              WHERE j.slot <> 2 AND j.queue = _claim.queue AND j.state = 'pending' AND j.after_left = 0
              ORDER BY j.priority DESC LIMIT 1)
            UNION ALL
            SELECT (SELECT j.priority FROM alk.jobs j
                     WHERE j.slot <> 2 AND j.queue = _claim.queue AND j.state = 'pending' AND j.after_left = 0 AND j.priority < p.priority
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
                 WHERE j.slot <> 2 AND j.queue = _claim.queue AND j.state = 'pending' AND j.after_left = 0
                   AND j.priority = p.priority AND j.run_at <= clock
                   -- Serial groups: a job whose group is full is passed over.
                   AND (j.group_key IS NULL
                        OR alk._group_has_room(_claim.queue, j.group_key, j.priority, j.run_at, j.id, clock, per_group))
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
             WHERE j.slot <> 2 AND j.queue = _claim.queue AND j.state = 'processing' AND j.claim_expires_at < clock
               -- Serial groups: fewer than per_group others of the group
               -- hold a lease or lapsed before it (in id order).
               AND (j.group_key IS NULL
                    OR (SELECT count(*) FROM (SELECT FROM alk.jobs k
                         WHERE k.slot <> 2 AND k.queue = _claim.queue AND k.group_key = j.group_key AND k.state = 'processing'
                           AND k.id <> j.id AND (k.claim_expires_at >= clock OR k.id < j.id)
                         LIMIT per_group) o) < per_group)
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
                 WHERE j.slot <> 2 AND j.id = ANY (dead) AND j.queue = _claim.queue
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
                       attempts = j.attempts + 1, under_max_running = lim.max_running IS NOT NULL
                 WHERE j.slot <> 2 AND j.id = ANY (live) AND j.queue = _claim.queue
                RETURNING j.*
            )
            SELECT c.id, c.queue, c.state, c.payload, c.priority, c.run_at, c.attempts, c.max_attempts, c.worker_id,
                   c.claimed_at, c.claim_expires_at, c.created_at, c.expires_at, c.visibility_timeout_s,
                   c.backoff_base_s, c.dead_letter_retention_s, c.last_error, c.died_at, c.dedup_key,
                   c.attempts_refunded, c.headers, c.result, c.completed_at, c.group_key
              FROM moved c
             ORDER BY c.priority DESC, c.run_at, c.id;
            GET DIAGNOSTICS claimed = ROW_COUNT;
            wanted := wanted - claimed;
        END IF;
        -- Only burying leaves room to look again; otherwise the queue is empty
        -- of claimable rows (or we have enough).
        EXIT WHEN dead IS NULL OR wanted <= 0;
    END LOOP;
    -- granted - wanted jobs were claimed: count them in the rate window.
    IF lim.rate IS NOT NULL AND granted > wanted THEN
        PERFORM alk._rate_spend(lim, clock, granted - wanted);
    END IF;
END
$$;
COMMENT ON FUNCTION alk._claim(text, text, bigint) IS 'internal: the claim rule for an already validated queue name';

-- alk._claim_budget(alk.limited_queues,bigint,bigint): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._claim_budget(lim alk.limited_queues, clock bigint, wanted bigint)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    budget bigint := wanted;
    running bigint;
    win alk.queue_rate_windows;
BEGIN
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM alk._raise('LK002', 'a claim of a queue with limits (alk.set_queue_limits) must run under READ '
            || 'COMMITTED isolation, got ' || pg_catalog.current_setting('transaction_isolation'));
    END IF;
    IF lim.max_running IS NOT NULL THEN
        SELECT count(*) INTO running FROM alk.jobs j
         WHERE j.slot <> 2 AND j.queue = lim.queue AND j.state = 'processing' AND j.claim_expires_at >= clock;
        budget := least(budget, lim.max_running - running);
    END IF;
    IF lim.rate IS NOT NULL THEN
        SELECT * INTO win FROM alk.queue_rate_windows w WHERE w.queue = lim.queue;
        -- The window in force holds clock (or is ahead of a clock set back);
        -- without one, a claim now opens a new window with the whole rate.
        IF win.started_at IS NOT NULL AND clock <= alk._sat_add(win.started_at, lim.rate_period_s - 1) THEN
            budget := least(budget, lim.rate - win.claims);
        ELSE
            budget := least(budget, lim.rate);
        END IF;
    END IF;
    RETURN greatest(budget, 0);
END
$$;
COMMENT ON FUNCTION alk._claim_budget(alk.limited_queues, bigint, bigint) IS
'internal: how many jobs a claim of a limited queue may take now (the caller holds the queue''s claim lock)';

-- alk._complete(text,text,bigint,bigint[],bigint[],text[],jsonb[]): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._complete(queue text, wid text, clock bigint, job_ids bigint[], attempts bigint[],
                              outcomes text[], results jsonb[])
RETURNS bigint[]
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
-- The batch meets its rows in a hash join, as in alk._settle.
SET enable_nestloop = off
-- One generic plan: planned per call (a custom plan, which the plan cache
-- kept choosing), 500 single acks cost 385-510 ms against 43-60 ms, server
-- side.
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    completed bigint[];
    awaited bigint[];
BEGIN
    WITH first AS (
        SELECT DISTINCT ON (i.id) i.id, i.attempt, i.outcome, i.result
          FROM unnest(_complete.job_ids, _complete.attempts, _complete.outcomes, _complete.results)
               WITH ORDINALITY AS i(id, attempt, outcome, result, ord)
         ORDER BY i.id, i.ord
    ), kept AS (
        -- Worker, claim and lease stay, as on a dead row: who ran it, when.
        UPDATE alk.jobs j
           SET state = 'completed', completed_at = _complete.clock, result = f.result,
               purge_at = alk._purge_at(_complete.clock, s.completed_s)
          FROM first f, alk.queue_settings s
         WHERE j.slot <> 2 AND coalesce(f.outcome, 'ack') = 'ack' AND j.id = ANY (_complete.job_ids) AND j.id = f.id
           AND (_complete.queue IS NULL OR j.queue = _complete.queue) AND s.queue = j.queue
           AND alk._holds(j, _complete.wid, f.attempt, _complete.clock)
        RETURNING j.id, j.queue, j.awaited
    ), counted AS (
        INSERT INTO alk.queue_counts AS c (queue, minute, backend, acked)
        SELECT k.queue, _complete.clock / 60 * 60, pg_catalog.pg_backend_pid(), count(*) FROM kept k GROUP BY k.queue
        ON CONFLICT ON CONSTRAINT queue_counts_pkey DO UPDATE SET acked = c.acked + excluded.acked
        RETURNING c.queue
    )
    SELECT array_agg(k.id), array_agg(k.id) FILTER (WHERE k.awaited) INTO completed, awaited FROM kept k;
    -- A completed job is done for the jobs enqueued after it (35_after.sql).
    IF awaited IS NOT NULL THEN
        PERFORM alk._after_sync(awaited);
    END IF;
    RETURN completed;
END
$$;
COMMENT ON FUNCTION alk._complete(text, text, bigint, bigint[], bigint[], text[], jsonb[]) IS
'internal: acks of held jobs whose queue keeps completed jobs: completed with their results, counted; the ids';

-- alk._due_pending(text,bigint): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._due_pending(queue text, clock bigint)
RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- One probe per distinct pending priority (jobs_claim_pending), as
    -- alk.next_claim_at walks them, stopping at the first with a due job.
    WITH RECURSIVE priorities(priority) AS (
        (SELECT j.priority FROM alk.jobs j
          WHERE j.slot <> 2 AND j.queue = $1 AND j.state = 'pending' AND j.after_left = 0
          ORDER BY j.priority DESC LIMIT 1)
        UNION ALL
        SELECT (SELECT j.priority FROM alk.jobs j
                 WHERE j.slot <> 2 AND j.queue = $1 AND j.state = 'pending' AND j.after_left = 0 AND j.priority < p.priority
                 ORDER BY j.priority DESC LIMIT 1)
          FROM priorities p WHERE p.priority IS NOT NULL
    )
    -- LATERAL with LIMIT 1: one index probe per priority. As an EXISTS the
    -- planner made it a hash semi-join over every pending job of the queue
    -- (42 ms at 2 x 10^5 pending, measured).
    SELECT EXISTS (SELECT FROM priorities p
                    CROSS JOIN LATERAL (SELECT FROM alk.jobs j
                                         WHERE j.slot <> 2 AND j.queue = $1 AND j.state = 'pending' AND j.after_left = 0
                                           AND j.priority = p.priority AND j.run_at <= $2 LIMIT 1) d
                    WHERE p.priority IS NOT NULL)
$$;
COMMENT ON FUNCTION alk._due_pending(text, bigint) IS
'internal: whether the queue has a due pending job with nothing left to wait for';

-- alk._enqueue_one(text,jsonb,bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,text,jsonb,text,bigint[]): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._enqueue_one(
    p_queue text,
    p_payload jsonb,
    p_clock bigint,
    p_delay bigint,
    p_run_at bigint,
    p_priority bigint,
    p_max_attempts bigint,
    p_expires bigint,
    p_visibility_timeout_s bigint,
    p_backoff_base_s bigint,
    p_dead_letter_retention_s bigint,
    p_dedup_key text,
    p_headers jsonb DEFAULT NULL,
    p_group_key text DEFAULT NULL,
    -- alk.enqueue's after (35_after.sql); NULL: waits for nothing.
    p_after bigint[] DEFAULT NULL
)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
BEGIN
    IF p_payload IS NULL THEN
        PERFORM alk._check_payloads(ARRAY[p_payload]);
    END IF;
    IF p_headers IS NOT NULL AND pg_catalog.jsonb_typeof(p_headers) <> 'object' THEN
        PERFORM alk._check_headers(p_headers);
    END IF;
    IF p_group_key IS NOT NULL THEN
        PERFORM alk._name_ok('group_key', p_group_key, true);
    END IF;
    IF p_after IS NOT NULL THEN
        PERFORM alk._after_check(p_queue, p_after);
    END IF;
    IF p_dedup_key IS NULL THEN
        INSERT INTO alk.jobs (queue, payload, priority, run_at, max_attempts, created_at, expires_at,
                              visibility_timeout_s, backoff_base_s, dead_letter_retention_s, headers, group_key,
                              slot)
        VALUES (p_queue, p_payload, p_priority,
                CASE WHEN p_delay IS NOT NULL THEN alk._sat_add(p_clock, p_delay)
                     WHEN p_run_at IS NOT NULL THEN p_run_at ELSE p_clock END,
                p_max_attempts, p_clock, alk._sat_add(p_clock, p_expires),
                p_visibility_timeout_s, p_backoff_base_s, p_dead_letter_retention_s, p_headers, p_group_key,
                (SELECT s.current_slot FROM alk.job_slots s))
        RETURNING alk.jobs.id INTO v_id;
    ELSE
        PERFORM alk._name_ok('dedup_key', p_dedup_key, true);
        -- No rotation while this transaction lasts, so the key's live holder
        -- is in the slot we insert into (see jobs_dedup).
        PERFORM pg_catalog.pg_advisory_xact_lock_shared(alk._rotation_lock());
        LOOP
            -- The unique index decides: a concurrent enqueue of the same key
            -- waits for ours (or we for it) and then does nothing.
            INSERT INTO alk.jobs (queue, payload, priority, run_at, max_attempts, created_at, expires_at,
                                  visibility_timeout_s, backoff_base_s, dead_letter_retention_s, dedup_key,
                                  headers, group_key, slot)
            VALUES (p_queue, p_payload, p_priority,
                    CASE WHEN p_delay IS NOT NULL THEN alk._sat_add(p_clock, p_delay)
                         WHEN p_run_at IS NOT NULL THEN p_run_at ELSE p_clock END,
                    p_max_attempts, p_clock, alk._sat_add(p_clock, p_expires),
                    p_visibility_timeout_s, p_backoff_base_s, p_dead_letter_retention_s, p_dedup_key, p_headers,
                    p_group_key, (SELECT s.current_slot FROM alk.job_slots s))
            ON CONFLICT (queue, dedup_key, slot) WHERE dedup_key IS NOT NULL AND state IN ('pending', 'processing')
            DO NOTHING
            RETURNING alk.jobs.id INTO v_id;
            EXIT WHEN v_id IS NOT NULL;
            -- Held: return the holder's id and write nothing (no wake-up
            -- either). Should the holder have gone since, insert again.
            SELECT j.id INTO v_id FROM alk.jobs j
             WHERE j.slot <> 2 AND j.queue = p_queue AND j.dedup_key = p_dedup_key AND j.state IN ('pending', 'processing');
            IF v_id IS NOT NULL THEN
                RETURN v_id;
            END IF;
        END LOOP;
    END IF;
    -- A new job only (a dedup hit returned above, its holder unchanged).
    IF p_after IS NOT NULL THEN
        PERFORM alk._after_link(p_queue, ARRAY[v_id], p_after);
    END IF;
    -- Its serial group is parked at commit (38_group_turns.sql).
    IF p_group_key IS NOT NULL THEN
        INSERT INTO alk.group_arrivals (queue, group_key) VALUES (p_queue, p_group_key);
    END IF;
    -- alk._wake's check, written out here: the hot path pays no call frame
    -- for it (the protocol in the wake-ups section above). A later statement
    -- than the insert: a fresh snapshot under READ COMMITTED. The EXISTS
    -- keeps a busy queue (no adverts) to one index probe, no lock.
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM pg_catalog.pg_notify(alk._queue_channel(p_queue), '');
    ELSIF EXISTS (SELECT FROM alk.idle_workers w WHERE w.queue = p_queue) THEN
        DELETE FROM alk.idle_workers w
         WHERE w.ctid = ANY (ARRAY(SELECT v.ctid FROM alk.idle_workers v WHERE v.queue = p_queue
                                     FOR UPDATE SKIP LOCKED));
        -- Took one: notify. Saw only adverts others hold: their holders'
        -- commits cover us; alk._wake_held waits briefly to know they commit.
        IF FOUND OR NOT alk._wake_held(p_queue) THEN
            PERFORM pg_catalog.pg_notify(alk._queue_channel(p_queue), '');
        END IF;
    END IF;
    RETURN v_id;
END
$$;
COMMENT ON FUNCTION alk._enqueue_one(text, jsonb, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, text, jsonb, text, bigint[]) IS
'internal: insert one job with resolved stamps (or return the live holder of its dedup key) and wake idle workers';

-- alk._group_has_room(text,text,bigint,bigint,bigint,bigint,bigint): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._group_has_room(queue text, group_key text, priority bigint, run_at bigint, id bigint,
                                    clock bigint, per_group bigint)
RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN r.running >= $7 THEN false
        ELSE r.running
           -- due jobs of the group at a higher priority ...
           + (SELECT count(*) FROM (SELECT FROM alk.jobs k
                                     WHERE k.slot <> 2 AND k.queue = $1 AND k.group_key = $2 AND k.state = 'pending'
                                       AND k.after_left = 0 AND k.priority > $3 AND k.run_at <= $6 LIMIT $7) h)
           -- ... and at its own, ahead of it (index-bounded: due, since it is)
           + (SELECT count(*) FROM (SELECT FROM alk.jobs k
                                     WHERE k.slot <> 2 AND k.queue = $1 AND k.group_key = $2 AND k.state = 'pending'
                                       AND k.after_left = 0 AND k.priority = $3 AND (k.run_at, k.id) < ($4, $5)
                                     LIMIT $7) s)
           < $7
    END
      FROM (SELECT count(*) AS running
              FROM (SELECT FROM alk.jobs k
                     WHERE k.slot <> 2 AND k.queue = $1 AND k.group_key = $2 AND k.state = 'processing' LIMIT $7) p) r
$$;
COMMENT ON FUNCTION alk._group_has_room(text, text, bigint, bigint, bigint, bigint, bigint) IS
'internal: whether a due pending job of a serial group may be claimed now (the group has room for it)';

-- alk._group_heal(text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._group_heal(queue text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM alk._group_turns(array_agg(_group_heal.queue), array_agg(g.group_key))
       FROM (WITH RECURSIVE keys(group_key) AS (
                 (SELECT j.group_key FROM alk.jobs j
                   WHERE j.slot <> 2 AND j.queue = _group_heal.queue AND j.state = 'pending' AND j.after_left = -1
                   ORDER BY j.group_key LIMIT 1)
                 UNION ALL
                 SELECT (SELECT j.group_key FROM alk.jobs j
                          WHERE j.slot <> 2 AND j.queue = _group_heal.queue AND j.state = 'pending' AND j.after_left = -1
                            AND j.group_key > k.group_key ORDER BY j.group_key LIMIT 1)
                   FROM keys k WHERE k.group_key IS NOT NULL)
             SELECT k.group_key FROM keys k WHERE k.group_key IS NOT NULL) g
     HAVING count(*) > 0;
END
$$;
COMMENT ON FUNCTION alk._group_heal(text) IS 'internal: unpark the turns of every serial group of a queue with a parked job';

-- alk._group_park(text,text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._group_park(queue text, group_key text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_variable
DECLARE
    room bigint;
    turns bigint[] := '{}';
    park bigint[];
    unpark bigint[];
BEGIN
    -- Above READ COMMITTED the reads below would not be fresh: park nothing.
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed'
       OR NOT pg_catalog.pg_try_advisory_xact_lock(1634495335, alk._group_lock(queue, group_key)) THEN
        RETURN;
    END IF;
    room := alk._group_room(queue, group_key);
    IF room > 0 THEN
        -- No parked job and no more pending ones than the room: all are
        -- turns (a group's first job, the usual case). Else compute them.
        IF NOT EXISTS (SELECT FROM alk.jobs j WHERE j.slot <> 2 AND j.queue = queue AND j.group_key = group_key
                                                AND j.state = 'pending' AND j.after_left = -1)
           AND (SELECT count(*) FROM (SELECT FROM alk.jobs j
                                       WHERE j.slot <> 2 AND j.queue = queue AND j.group_key = group_key
                                         AND j.state = 'pending' AND j.after_left = 0 LIMIT room + 1) c) <= room THEN
            RETURN;
        END IF;
        turns := alk._group_turn_ids(queue, group_key, room);
        SELECT array_agg(t.id) INTO unpark
          FROM (SELECT k.id FROM alk.jobs k
                 WHERE k.slot <> 2 AND k.id = ANY (turns) AND k.queue = queue AND k.state = 'pending' AND k.after_left = -1
                   FOR NO KEY UPDATE SKIP LOCKED) t;
        IF unpark IS NOT NULL THEN
            UPDATE alk.jobs j SET after_left = 0 WHERE j.slot <> 2 AND j.id = ANY (unpark) AND j.queue = queue;
        END IF;
    END IF;
    SELECT array_agg(t.id) INTO park
      FROM (SELECT k.id FROM alk.jobs k
             WHERE k.slot <> 2 AND k.queue = queue AND k.group_key = group_key AND k.state = 'pending' AND k.after_left = 0
               AND k.id <> ALL (turns)
               FOR NO KEY UPDATE SKIP LOCKED) t;
    IF park IS NOT NULL THEN
        UPDATE alk.jobs j SET after_left = -1 WHERE j.slot <> 2 AND j.id = ANY (park) AND j.queue = queue;
    END IF;
END
$$;
COMMENT ON FUNCTION alk._group_park(text, text) IS
'internal: park the pending jobs of a serial group that are not its turns, unpark those that are (at commit)';

-- alk._group_room(text,text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._group_room(queue text, group_key text)
RETURNS bigint
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT s.share - (SELECT count(*) FROM (SELECT FROM alk.jobs k
                                             WHERE k.slot <> 2 AND k.queue = $1 AND k.group_key = $2 AND k.state = 'processing'
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
          WHERE j.slot <> 2 AND j.queue = $1 AND j.group_key = $2 AND j.state = 'pending' AND j.after_left = 0
          ORDER BY j.priority DESC LIMIT 1)
        UNION ALL
        SELECT (SELECT j.priority FROM alk.jobs j
                 WHERE j.slot <> 2 AND j.queue = $1 AND j.group_key = $2 AND j.state = 'pending' AND j.after_left = 0
                   AND j.priority < u.priority ORDER BY j.priority DESC LIMIT 1)
          FROM unparked u WHERE u.priority IS NOT NULL
    ), parked(priority) AS (
        (SELECT j.priority FROM alk.jobs j
          WHERE j.slot <> 2 AND j.queue = $1 AND j.group_key = $2 AND j.state = 'pending' AND j.after_left = -1
          ORDER BY j.priority DESC LIMIT 1)
        UNION ALL
        SELECT (SELECT j.priority FROM alk.jobs j
                 WHERE j.slot <> 2 AND j.queue = $1 AND j.group_key = $2 AND j.state = 'pending' AND j.after_left = -1
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
              WHERE j.slot <> 2 AND j.queue = $1 AND j.group_key = $2 AND j.state = 'pending' AND j.after_left = 0
                AND j.priority = l.priority ORDER BY j.run_at, j.id LIMIT $3)
            UNION ALL
            (SELECT j.id, j.run_at FROM alk.jobs j
              WHERE j.slot <> 2 AND j.queue = $1 AND j.group_key = $2 AND j.state = 'pending' AND j.after_left = -1
                AND j.priority = l.priority ORDER BY j.run_at, j.id LIMIT $3)) c
         ORDER BY c.run_at, c.id LIMIT $3) t
$$;
COMMENT ON FUNCTION alk._group_turn_ids(text, text, bigint) IS
'internal: a serial group''s turns for a room of `room` jobs: per priority, the first `room` pending jobs by run_at, id';

-- alk._group_turns(text[],text[]): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._group_turns(queues text[], group_keys text[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
-- One plan per statement: a custom plan of a statement on the partitioned
-- table costs more to plan than to run.
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    q text;
    g text;
    room bigint;
    turns bigint[];
    ids bigint[];
BEGIN
    FOR q, g IN SELECT DISTINCT u.q, u.k FROM unnest(queues, group_keys) AS u(q, k)
                 WHERE u.k IS NOT NULL ORDER BY u.q, u.k LOOP
        PERFORM pg_catalog.pg_advisory_xact_lock_shared(1634495335, alk._group_lock(q, g));
        CONTINUE WHEN NOT EXISTS (SELECT FROM alk.jobs j WHERE j.slot <> 2 AND j.queue = q AND j.group_key = g
                                                          AND j.state = 'pending' AND j.after_left = -1);
        room := alk._group_room(q, g);
        CONTINUE WHEN room <= 0;
        turns := alk._group_turn_ids(q, g, room);
        -- SKIP LOCKED: a parked row is locked only by another settle
        -- unparking it, a cancel or a sweep; none needs us to wait.
        SELECT array_agg(t.id) INTO ids
          FROM (SELECT k.id FROM alk.jobs k
                 WHERE k.slot <> 2 AND k.id = ANY (turns) AND k.queue = q AND k.state = 'pending' AND k.after_left = -1
                   FOR NO KEY UPDATE SKIP LOCKED) t;
        IF ids IS NOT NULL THEN
            UPDATE alk.jobs j SET after_left = 0 WHERE j.slot <> 2 AND j.id = ANY (ids) AND j.queue = q;
        END IF;
    END LOOP;
END
$$;
COMMENT ON FUNCTION alk._group_turns(text[], text[]) IS
'internal: unpark the turns of these serial groups, (queue, group key) pairs (after a job of theirs left processing, '
'or a turn left pending)';

-- alk._settle(text,text,bigint[],bigint[],text[],text[],bigint[],jsonb[],boolean): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._settle(queue text, worker_id text, job_ids bigint[], attempts bigint[], outcomes text[],
                            errs text[], delays bigint[], results jsonb[] DEFAULT NULL, wake boolean DEFAULT true)
RETURNS TABLE (job_id bigint, attempt bigint, state text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
-- No nested loop between the batch and its rows: planned on a table never
-- analyzed, a plan (generic or custom) joined them that way, the whole
-- id = ANY (job_ids) list once per input row, quadratic in the batch (57-86
-- against 6-9 ms for 500 acks until autovacuum came). The rows come from
-- jobs_pkey by id = ANY (job_ids) and meet the batch in a hash join.
SET enable_nestloop = off
AS $$
#variable_conflict use_column
DECLARE
    clock bigint := alk.now();
    wid text := alk._name_ok('worker_id', _settle.worker_id, true);
    k bigint := coalesce(cardinality(_settle.job_ids), 0);
    bad bigint;
    all_ack boolean := true;
    this_minute bigint := clock / 60 * 60;
    me integer := pg_catalog.pg_backend_pid();
    completed bigint[];
    grouped boolean;
    group_queues text[];
    group_keys text[];
    waited_on boolean;
    limited boolean;
BEGIN
    IF (_settle.attempts IS NOT NULL AND cardinality(_settle.attempts) <> k)
       OR (_settle.outcomes IS NOT NULL AND cardinality(_settle.outcomes) <> k)
       OR (_settle.errs IS NOT NULL AND cardinality(_settle.errs) <> k)
       OR (_settle.delays IS NOT NULL AND cardinality(_settle.delays) <> k)
       OR (_settle.results IS NOT NULL AND cardinality(_settle.results) <> k) THEN
        PERFORM alk._raise('LK002', 'attempts, outcomes, errs, delays and results must each be NULL or have one '
            || 'entry per job id: got ' || k || ' job_ids, ' || coalesce(cardinality(_settle.attempts)::text, 'NULL')
            || ' attempts, ' || coalesce(cardinality(_settle.outcomes)::text, 'NULL') || ' outcomes, '
            || coalesce(cardinality(_settle.errs)::text, 'NULL') || ' errs, '
            || coalesce(cardinality(_settle.delays)::text, 'NULL') || ' delays and '
            || coalesce(cardinality(_settle.results)::text, 'NULL') || ' results');
    END IF;
    -- NULL outcomes (all ack, a batching worker's usual call): nothing to
    -- check, and no statement spent on it. Outcomes that are all 'ack' take
    -- the same all-ack statement below (an ack ignores its err and delay):
    -- measured at 250 jobs, 14 against 5 us per job, server side.
    IF _settle.outcomes IS NOT NULL THEN
        SELECT min(o.ord) FILTER (WHERE o.outcome IS NULL OR o.outcome NOT IN ('ack', 'retry', 'fail')),
               coalesce(bool_and(o.outcome = 'ack'), true)
          INTO bad, all_ack
          FROM unnest(_settle.outcomes) WITH ORDINALITY AS o(outcome, ord);
    END IF;
    IF bad IS NOT NULL THEN
        PERFORM alk._raise('LK002', 'outcome ' || bad || ' must be ''ack'', ''retry'' or ''fail'', got '
            || alk._show(_settle.outcomes[bad]));
    END IF;
    IF k = 0 THEN
        RETURN;
    END IF;
    -- Serial groups (38_group_turns.sql): the groups of the jobs to settle,
    -- read before the statements below delete them (a job's group never
    -- changes), given their next turns after. A queue running no grouped
    -- job pays one probe of the empty end of jobs_group_running.
    grouped := CASE WHEN _settle.queue IS NULL
        THEN EXISTS (SELECT FROM alk.jobs j WHERE j.slot <> 2 AND j.state = 'processing' AND j.group_key IS NOT NULL)
        ELSE EXISTS (SELECT FROM alk.jobs j WHERE j.slot <> 2 AND j.queue = _settle.queue AND j.state = 'processing'
                                              AND j.group_key IS NOT NULL) END;
    IF grouped THEN
        SELECT array_agg(j.queue), array_agg(j.group_key) INTO group_queues, group_keys
          FROM alk.jobs j
         WHERE j.slot <> 2 AND j.id = ANY (_settle.job_ids) AND (_settle.queue IS NULL OR j.queue = _settle.queue)
           AND j.state = 'processing' AND j.group_key IS NOT NULL;
    END IF;
    -- Acks on queues that keep completed jobs, first; the statements below
    -- then delete the acked jobs they left.
    IF EXISTS (SELECT FROM alk.queue_settings s WHERE _settle.queue IS NULL OR s.queue = _settle.queue) THEN
        completed := alk._complete(_settle.queue, wid, clock, _settle.job_ids, _settle.attempts, _settle.outcomes,
                                   _settle.results);
    END IF;
    IF all_ack THEN
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
             WHERE j.slot <> 2 AND j.id = ANY (_settle.job_ids) AND j.id = f.id AND (_settle.queue IS NULL OR j.queue = _settle.queue)
               AND alk._holds(j, wid, f.attempt, clock)
            RETURNING j.id, j.queue
        ), counted AS (
            INSERT INTO alk.queue_counts AS c (queue, minute, backend, acked)
            SELECT a.queue, this_minute, me, count(*) FROM acked a GROUP BY a.queue
            ON CONFLICT ON CONSTRAINT queue_counts_pkey DO UPDATE SET acked = c.acked + excluded.acked
            RETURNING c.queue
        )
        SELECT i.id, i.attempt, CASE WHEN a.id IS NOT NULL OR f.id = ANY (completed) THEN 'acked' END
          FROM input i
          LEFT JOIN first f ON f.ord = i.ord
          LEFT JOIN acked a ON a.id = f.id
         ORDER BY i.ord;
    ELSE
        RETURN QUERY
        WITH input AS (
            SELECT i.id, i.attempt, coalesce(i.outcome, 'ack') AS outcome, i.err, i.delay, i.ord
              FROM unnest(_settle.job_ids, _settle.attempts, _settle.outcomes, _settle.errs, _settle.delays)
                   WITH ORDINALITY AS i(id, attempt, outcome, err, delay, ord)
        ), first AS (
            SELECT DISTINCT ON (i.id) i.* FROM input i ORDER BY i.id, i.ord
        ), acked AS (
            DELETE FROM alk.jobs j USING first f
             WHERE j.slot <> 2 AND f.outcome = 'ack' AND j.id = ANY (_settle.job_ids) AND j.id = f.id AND (_settle.queue IS NULL OR j.queue = _settle.queue)
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
             WHERE j.slot <> 2 AND f.outcome <> 'ack' AND j.id = ANY (_settle.job_ids) AND j.id = f.id AND (_settle.queue IS NULL OR j.queue = _settle.queue)
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
        SELECT i.id, i.attempt, coalesce(d.state, CASE WHEN f.id = ANY (completed) THEN 'acked' END)
          FROM input i
          LEFT JOIN first f ON f.ord = i.ord
          LEFT JOIN done d ON d.id = f.id
         ORDER BY i.ord;
    END IF;
    -- In a later statement than the settlement (RETURN QUERY keeps no
    -- awaited flag or queue), one statement probes two tables, empty unless
    -- their feature is used: alk.job_after (acked or dead: the jobs enqueued
    -- after them are released or buried, 35_after.sql) and
    -- alk.limited_queues (a freed max_running slot wakes idle workers,
    -- alk._wake_freed; not when settle_and_claim claims next: it asks after
    -- its claim).
    SELECT EXISTS (SELECT FROM alk.job_after e WHERE e.after_id = ANY (_settle.job_ids)),
           _settle.wake AND EXISTS (SELECT FROM alk.limited_queues l
                                     WHERE l.max_running IS NOT NULL
                                       AND (_settle.queue IS NULL OR l.queue = _settle.queue))
      INTO waited_on, limited;
    IF waited_on THEN
        PERFORM alk._after_sync(_settle.job_ids);
    END IF;
    IF group_queues IS NOT NULL THEN
        PERFORM alk._group_turns(group_queues, group_keys);
    END IF;
    IF limited THEN
        PERFORM alk._wake_freed(CASE WHEN _settle.queue IS NOT NULL THEN ARRAY[_settle.queue] END);
    END IF;
END
$$;
COMMENT ON FUNCTION alk._settle(text, text, bigint[], bigint[], text[], text[], bigint[], jsonb[], boolean) IS
'internal: the settlement rule (ack, retry, fail) for a batch, counted per queue for alk.queue_throughput; '
'queue NULL: any queue; results: the acks'' results, kept on queues that keep completed jobs; wake: whether a freed '
'max_running slot wakes idle workers now (false: the caller claims first and asks after)';

-- alk._wake_freed(text[]): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._wake_freed(queues text[])
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock bigint := alk.now();
    q text;
    woke boolean := false;
BEGIN
    -- Nobody sleeps (a busy system): nothing to wake, one probe. A statement
    -- of its own: inside the one below the planner ran the costlier tests
    -- first.
    IF NOT EXISTS (SELECT FROM alk.idle_workers w WHERE queues IS NULL OR w.queue = ANY (queues)) THEN
        RETURN false;
    END IF;
    FOR q IN
        SELECT l.queue FROM alk.limited_queues l
         WHERE l.max_running IS NOT NULL AND (queues IS NULL OR l.queue = ANY (queues))
           -- Someone sleeps, a slot is free, and a due job waits for it.
           AND EXISTS (SELECT FROM alk.idle_workers w WHERE w.queue = l.queue)
           AND (SELECT count(*) FROM (SELECT FROM alk.jobs j
                                       WHERE j.slot <> 2 AND j.queue = l.queue AND j.state = 'processing'
                                         AND j.claim_expires_at >= clock LIMIT l.max_running) r) < l.max_running
           AND alk._due_pending(l.queue, clock)
    LOOP
        PERFORM alk._wake(q);
        woke := true;
    END LOOP;
    RETURN woke;
END
$$;
COMMENT ON FUNCTION alk._wake_freed(text[]) IS
'internal: after a settle of jobs of these queues (NULL: any), wake the idle workers of each that has max_running, '
'a free slot and a due job; true when one was woken';

-- alk.ack(bigint,text,bigint,text,jsonb): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.ack(job_id bigint, worker_id text, attempt bigint DEFAULT NULL, queue text DEFAULT NULL,
                        result jsonb DEFAULT NULL)
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
    awaited boolean;
    acked_queue text;
    acked_group text;
    limited text[];
    any_limited boolean;
BEGIN
    IF EXISTS (SELECT FROM alk.queue_settings s WHERE ack.queue IS NULL OR s.queue = ack.queue) THEN
        -- Kept as completed, its slot is free too: the limits probe rides
        -- in the same statement (ack.queue NULL: any queue with max_running).
        SELECT alk._complete(ack.queue, wid, clock, ARRAY[ack.job_id], ARRAY[ack.attempt], NULL, ARRAY[ack.result])
               IS NOT NULL,
               EXISTS (SELECT FROM alk.limited_queues l
                        WHERE l.max_running IS NOT NULL AND (ack.queue IS NULL OR l.queue = ack.queue))
          INTO done, any_limited;
        IF done THEN
            IF any_limited THEN
                PERFORM alk._wake_freed(CASE WHEN ack.queue IS NOT NULL THEN ARRAY[ack.queue] END);
            END IF;
            RETURN true;
        END IF;
    END IF;
    WITH acked AS (
        DELETE FROM alk.jobs j
         WHERE j.slot <> 2 AND j.id = ack.job_id AND (ack.queue IS NULL OR j.queue = ack.queue)
           AND alk._holds(j, wid, ack.attempt, clock)
        RETURNING j.queue, j.awaited, j.group_key, j.under_max_running
    ), counted AS (
        INSERT INTO alk.queue_counts AS c (queue, minute, backend, acked)
        SELECT a.queue, this_minute, pg_catalog.pg_backend_pid(), 1 FROM acked a
        ON CONFLICT ON CONSTRAINT queue_counts_pkey DO UPDATE SET acked = c.acked + excluded.acked
        RETURNING c.queue
    )
    -- The job's queue when it was claimed under max_running (its row says
    -- so: no probe of alk.limited_queues for the others).
    SELECT true, a.awaited, a.queue, a.group_key, CASE WHEN a.under_max_running THEN ARRAY[a.queue] END
      INTO done, awaited, acked_queue, acked_group, limited FROM counted, acked a;
    -- Jobs enqueued after this one may run now (35_after.sql).
    IF awaited THEN
        PERFORM alk._after_sync(ARRAY[ack.job_id]);
    END IF;
    -- Its serial group's next turn (38_group_turns.sql).
    IF acked_group IS NOT NULL THEN
        PERFORM alk._group_turns(ARRAY[acked_queue], ARRAY[acked_group]);
    END IF;
    -- Its max_running slot is free: idle workers of the queue may claim.
    IF limited IS NOT NULL THEN
        PERFORM alk._wake_freed(limited);
    END IF;
    RETURN done IS NOT NULL;
END
$$;
COMMENT ON FUNCTION alk.ack(bigint, text, bigint, text, jsonb) IS
'Acknowledge a claimed job: it is deleted, or, when its queue keeps completed jobs (alk.set_queue_retention), kept '
'as completed with completed_at = now and result (any JSON value; NULL: none) until its retention ends. False, and '
'nothing changes, unless the job is processing, held by worker_id under claim attempt (the fencing token the claim '
'returned; NULL skips that check) and its lease has not lapsed (claim_expires_at >= now). worker_id follows the name '
'rule (LK001). queue is optional routing for sharded deployments. '
'Example: SELECT alk.ack(job_id => 42, worker_id => ''worker-1'', attempt => 1, result => ''{"sent": true}'');';

-- alk.ack_batch(bigint[],text,bigint[],text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.ack_batch(job_ids bigint[], worker_id text, attempts bigint[] DEFAULT NULL, queue text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- No nested loop, as alk._settle (the same statement shape).
SET enable_nestloop = off
AS $$
#variable_conflict use_column
DECLARE
    clock bigint := alk.now();
    wid text := alk._name_ok('worker_id', ack_batch.worker_id, true);
    this_minute bigint := clock / 60 * 60;
    n_acked bigint;
    n_kept bigint := 0;
    awaited bigint[];
    group_queues text[];
    group_keys text[];
    limited text[];
BEGIN
    IF ack_batch.attempts IS NOT NULL AND cardinality(ack_batch.attempts) <> coalesce(cardinality(ack_batch.job_ids), 0) THEN
        -- _settle raises the LK002 that names the arrays.
        PERFORM alk._settle(ack_batch.queue, ack_batch.worker_id, ack_batch.job_ids, ack_batch.attempts, NULL, NULL, NULL);
    END IF;
    IF EXISTS (SELECT FROM alk.queue_settings s WHERE ack_batch.queue IS NULL OR s.queue = ack_batch.queue) THEN
        n_kept := coalesce(cardinality(alk._complete(ack_batch.queue, wid, clock, ack_batch.job_ids,
                                                      ack_batch.attempts, NULL, NULL)), 0);
    END IF;
    WITH first AS (
        SELECT DISTINCT ON (i.id) i.id, i.attempt
          FROM unnest(ack_batch.job_ids, ack_batch.attempts) WITH ORDINALITY AS i(id, attempt, ord)
         ORDER BY i.id, i.ord
    ), acked AS (
        -- id = ANY (job_ids): jobs_pkey probes, as in _settle.
        DELETE FROM alk.jobs j USING first f
         WHERE j.slot <> 2 AND j.id = ANY (ack_batch.job_ids) AND j.id = f.id
           AND (ack_batch.queue IS NULL OR j.queue = ack_batch.queue)
           AND alk._holds(j, wid, f.attempt, clock)
        RETURNING j.id, j.queue, j.awaited, j.group_key, j.under_max_running
    ), counted AS (
        INSERT INTO alk.queue_counts AS c (queue, minute, backend, acked)
        SELECT a.queue, this_minute, pg_catalog.pg_backend_pid(), count(*) FROM acked a GROUP BY a.queue
        ON CONFLICT ON CONSTRAINT queue_counts_pkey DO UPDATE SET acked = c.acked + excluded.acked
        RETURNING c.queue
    )
    -- The queues whose max_running slots these acks freed: the deleted
    -- jobs' rows say so; for jobs kept as completed (gone from acked), a
    -- probe of alk.limited_queues (ack_batch.queue's, or any when NULL).
    SELECT count(*), array_agg(a.id) FILTER (WHERE a.awaited),
           array_agg(a.queue) FILTER (WHERE a.group_key IS NOT NULL),
           array_agg(a.group_key) FILTER (WHERE a.group_key IS NOT NULL),
           array_agg(DISTINCT a.queue) FILTER (WHERE a.under_max_running)
      INTO n_acked, awaited, group_queues, group_keys, limited FROM acked a;
    IF n_kept > 0 THEN
        limited := limited || ARRAY(SELECT l.queue FROM alk.limited_queues l
                                     WHERE l.max_running IS NOT NULL
                                       AND (ack_batch.queue IS NULL OR l.queue = ack_batch.queue));
    END IF;
    -- Jobs enqueued after these may run now (35_after.sql).
    IF awaited IS NOT NULL THEN
        PERFORM alk._after_sync(awaited);
    END IF;
    -- Their serial groups' next turns (38_group_turns.sql).
    IF group_queues IS NOT NULL THEN
        PERFORM alk._group_turns(group_queues, group_keys);
    END IF;
    IF cardinality(limited) > 0 THEN
        PERFORM alk._wake_freed(limited);
    END IF;
    RETURN n_acked + n_kept;
END
$$;
COMMENT ON FUNCTION alk.ack_batch(bigint[], text, bigint[], text) IS
'Acknowledge several claimed jobs in one call; returns how many were validly held (and are now deleted, or kept as '
'completed without a result when their queue keeps completed jobs). '
'attempts, when given, holds each job''s fencing token in the same order. '
'Example: SELECT alk.ack_batch(ARRAY[41, 42], ''worker-1'', ARRAY[1, 1]);';

-- alk.cancel(text,bigint): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.cancel(queue text, job_id bigint)
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

-- alk.heartbeat(bigint,text,bigint,bigint,text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.heartbeat(job_id bigint, worker_id text, attempt bigint DEFAULT NULL, extend bigint DEFAULT NULL,
                              queue text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock bigint := alk.now();
    wid text := alk._name_ok('worker_id', heartbeat.worker_id, true);
BEGIN
    UPDATE alk.jobs j
       SET claim_expires_at = alk._sat_add(clock, coalesce(extend, j.visibility_timeout_s))
     WHERE j.slot <> 2 AND j.id = job_id AND (heartbeat.queue IS NULL OR j.queue = heartbeat.queue)
       AND alk._holds(j, wid, attempt, clock);
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION alk.heartbeat(bigint, text, bigint, bigint, text) IS
'Extend a claimed job''s lease to now + extend seconds (the row''s visibility_timeout_s when NULL). True when the '
'claim was valid at call time; a negative extend leaves a lapsed lease that voids the claim on the next op. '
'Example: SELECT alk.heartbeat(42, ''worker-1'', 1, 600);';

-- alk.next_claim_at(text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.next_claim_at(queue text)
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
    lim alk.limited_queues;
    held_until bigint;
    win alk.queue_rate_windows;
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
          WHERE j.slot <> 2 AND j.queue = next_claim_at.queue AND j.state = 'pending' AND j.after_left = 0
          ORDER BY j.priority DESC LIMIT 1)
        UNION ALL
        SELECT (SELECT j.priority FROM alk.jobs j
                 WHERE j.slot <> 2 AND j.queue = next_claim_at.queue AND j.state = 'pending' AND j.after_left = 0 AND j.priority < p.priority
                 ORDER BY j.priority DESC LIMIT 1)
          FROM priorities p WHERE p.priority IS NOT NULL
    )
    SELECT min((SELECT j.run_at FROM alk.jobs j
                 WHERE j.slot <> 2 AND j.queue = next_claim_at.queue AND j.state = 'pending' AND j.after_left = 0 AND j.priority = p.priority
                 ORDER BY j.priority DESC, j.run_at LIMIT 1))
      INTO first_run_at
      FROM priorities p WHERE p.priority IS NOT NULL;
    SELECT * INTO lim FROM alk.limited_queues l WHERE l.queue = next_claim_at.queue;
    -- Due jobs, all of them in full serial groups: not claimable now, so the
    -- earliest future run_at instead (a group frees up when its running job
    -- ends, by a settle that claims again or by its lease, counted below).
    IF first_run_at <= clock AND NOT EXISTS (
        SELECT FROM alk.jobs j
         WHERE j.slot <> 2 AND j.queue = next_claim_at.queue AND j.state = 'pending' AND j.after_left = 0 AND j.run_at <= clock
           AND (j.group_key IS NULL
                OR alk._group_has_room(j.queue, j.group_key, j.priority, j.run_at, j.id, clock,
                                       coalesce(lim.max_running_per_group, 1)))) THEN
        SELECT min(j.run_at) INTO first_run_at
          FROM alk.jobs j WHERE j.slot <> 2 AND j.queue = next_claim_at.queue AND j.state = 'pending' AND j.after_left = 0
           AND j.run_at > clock;
    END IF;
    -- The first lease to lapse (one probe of jobs_claim_lapsed). A lease is
    -- claimable once claim_expires_at < now, i.e. from the next second on.
    SELECT min(j.claim_expires_at) INTO first_lease_end
      FROM alk.jobs j WHERE j.slot <> 2 AND j.queue = next_claim_at.queue AND j.state = 'processing';
    next_at := least(first_run_at, alk._sat_add(first_lease_end, 1));
    IF next_at IS NULL THEN
        RETURN NULL;
    END IF;
    -- Queue limits hold the claim back further. max_running full: until the
    -- first valid lease lapses, or a settle that frees a slot sooner wakes
    -- the idle workers (alk._wake_freed).
    IF lim.max_running IS NOT NULL
       AND (SELECT count(*) FROM alk.jobs j WHERE j.slot <> 2 AND j.queue = next_claim_at.queue AND j.state = 'processing'
               AND j.claim_expires_at >= clock) >= lim.max_running THEN
        SELECT alk._sat_add(min(j.claim_expires_at), 1) INTO held_until
          FROM alk.jobs j WHERE j.slot <> 2 AND j.queue = next_claim_at.queue AND j.state = 'processing'
           AND j.claim_expires_at >= clock;
        next_at := greatest(next_at, held_until);
    END IF;
    -- The rate window in force is spent: until it ends (NULL when it would
    -- end past the clock's range: never).
    IF lim.rate IS NOT NULL THEN
        SELECT * INTO win FROM alk.queue_rate_windows w WHERE w.queue = next_claim_at.queue;
        IF win.started_at IS NOT NULL AND clock <= alk._sat_add(win.started_at, lim.rate_period_s - 1)
           AND win.claims >= lim.rate THEN
            IF win.started_at > 9223372036854775807 - lim.rate_period_s THEN
                RETURN NULL;
            END IF;
            next_at := greatest(next_at, win.started_at + lim.rate_period_s);
        END IF;
    END IF;
    RETURN greatest(next_at, clock);
END
$$;
COMMENT ON FUNCTION alk.next_claim_at(text) IS
'When alk.claim on this queue can next return a job: now when one is due (or a lease has lapsed), else the earliest '
'run_at of a pending job or the second after the earliest lease ends, whichever comes first; NULL when the queue has '
'no pending or processing job, or is paused. A worker sleeps until then (or until a NOTIFY on alk.queue_channel). '
'Due jobs that claim will bury (out of attempts, expired) count as claimable; due jobs of full serial groups do not. '
'Queue limits push it later: max_running full, to the second after the first valid lease ends; the rate window '
'spent, to the window''s end (NULL when that is past the clock''s range). '
'Example: SELECT alk.next_claim_at(''emails'') - alk.now() AS seconds_to_wait;';

-- alk.release_jobs(bigint[],text,bigint[],text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.release_jobs(job_ids bigint[], worker_id text, attempts bigint[], queue text DEFAULT NULL)
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

-- alk.snooze(bigint,text,bigint,bigint,text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.snooze(job_id bigint, worker_id text, attempt bigint, delay bigint, queue text DEFAULT NULL)
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

-- Live jobs are never kept (10_table.sql). NOT VALID: validating would scan the whole kept slot under an
-- exclusive lock, holding every worker for the length of the upgrade; rotations (0031-0034) have only ever moved
-- dead and completed rows there, and every row written from now on is checked.
ALTER TABLE alk.jobs_kept ADD CONSTRAINT jobs_kept_settled CHECK (state IN ('dead', 'completed')) NOT VALID;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
