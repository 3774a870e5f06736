-- pyalk 0051: claim_walks_once. A claim walked the entries of the jobs already claimed and settled twice: the
-- loose scan that finds each pending priority, then the due scan of that priority from its start. Once a scan has
-- marked such entries dead that costs little, but under a held snapshot nothing can mark them, and every claim paid
-- for each settled entry of its slot twice (alk.next_claim_at three times). The loose scan now returns each
-- priority's first entry (priority, run_at, id) and the scans after it start there: the entries before it are ones
-- the statement cannot see. That first entry also answers alk._due_pending (is it due?) and alk.next_claim_at (the
-- earliest run_at) without another probe. One snapshot, so the same jobs, but for one a concurrent commit made
-- due ahead of that first entry after the snapshot (alk.snooze with a negative delay): it fails the bound when
-- the claim's lock re-checks it and is left to the next claim, as a row locked then would be. The rule lives in
-- sql/queue/40_claim.sql.

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
    grouped bigint[];
    keys text[];
    refused bigint[];
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
        -- each distinct pending priority in claim order (one probe each,
        -- which finds the priority's first entry); within a priority
        -- jobs_claim_pending is in run_at order, so the due scan starts at
        -- that entry and run_at <= clock is an index bound that stops at the
        -- first future row. The nested loop is pulled lazily under the LIMIT: once wanted
        -- rows are found, lower priorities are neither probed nor locked.
        -- Each locked row is split here into live (to claim) and dead (out
        -- of attempts, counted as attempts - attempts_refunded, or expired:
        -- to bury), so the claim's UPDATE is a plain one and burial, which
        -- is rare, costs a statement only when it happens.
        WITH RECURSIVE priorities(priority, run_at, id) AS (
            (SELECT j.priority, j.run_at, j.id FROM alk.jobs j
              WHERE j.slot <> 2 AND j.queue = _claim.queue AND j.state = 'pending' AND j.after_left = 0
              ORDER BY j.priority DESC, j.run_at, j.id LIMIT 1)
            UNION ALL
            SELECT f.priority, f.run_at, f.id
              FROM priorities p
             CROSS JOIN LATERAL (
                SELECT j.priority, j.run_at, j.id FROM alk.jobs j
                 WHERE j.slot <> 2 AND j.queue = _claim.queue AND j.state = 'pending' AND j.after_left = 0 AND j.priority < p.priority
                 ORDER BY j.priority DESC, j.run_at, j.id LIMIT 1) f
        ), due AS (
            SELECT d.id, d.priority, d.run_at, d.dead, d.group_key
              FROM priorities p
             CROSS JOIN LATERAL (
                SELECT j.id, j.priority, j.run_at, j.group_key,
                       (j.attempts - j.attempts_refunded >= j.max_attempts
                        OR coalesce(j.expires_at <= clock, false)) AS dead
                  FROM alk.jobs j
                 WHERE j.slot <> 2 AND j.queue = _claim.queue AND j.state = 'pending' AND j.after_left = 0
                   AND j.priority = p.priority AND j.run_at <= clock
                   -- From the entry the loose scan found on: those before it are
                   -- settled jobs this statement cannot see, which under a held
                   -- snapshot no scan may mark dead (0051). A row a concurrent
                   -- commit has since made due ahead of it (alk.snooze, negative
                   -- delay) fails the re-check of its lock: left to the next claim.
                   AND (j.run_at, j.id) >= (p.run_at, p.id)
                   -- Serial groups: a job whose group is full is passed over.
                   AND (j.group_key IS NULL
                        OR alk._group_has_room(_claim.queue, j.group_key, j.priority, j.run_at, j.id, clock, per_group))
                 ORDER BY j.priority DESC, j.run_at, j.id
                 LIMIT wanted
                   FOR UPDATE SKIP LOCKED) d
             LIMIT wanted
        ), lapsed AS (
            SELECT j.id, j.priority, j.run_at,
                   (j.attempts - j.attempts_refunded >= j.max_attempts
                    OR coalesce(j.expires_at <= clock, false)) AS dead,
                   j.group_key
              FROM alk.jobs j
             WHERE j.slot <> 2 AND j.queue = _claim.queue AND j.state = 'processing' AND j.claim_expires_at < clock
               AND (j.group_key IS NULL
                    OR alk._group_has_room_lapsed(_claim.queue, j.group_key, j.id, clock, per_group))
             ORDER BY j.priority DESC, j.run_at, j.id
             LIMIT wanted
               FOR UPDATE SKIP LOCKED
        )
        SELECT array_agg(c.id) FILTER (WHERE NOT c.dead), array_agg(c.id) FILTER (WHERE c.dead),
               array_agg(c.id) FILTER (WHERE NOT c.dead AND c.group_key IS NOT NULL),
               array_agg(c.group_key) FILTER (WHERE NOT c.dead AND c.group_key IS NOT NULL)
          INTO live, dead, grouped, keys
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

        -- Serial groups, asked again under a lock (alk._group_has_room): a
        -- queue with limits holds its claim lock already.
        IF grouped IS NOT NULL AND lim.queue IS NULL THEN
            refused := alk._group_claimable(_claim.queue, grouped, keys, clock, per_group);
            IF refused IS NOT NULL THEN
                SELECT array_agg(l.id) INTO live FROM unnest(live) AS l(id) WHERE l.id <> ALL (refused);
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

-- alk._due_pending(text,bigint): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._due_pending(queue text, clock bigint)
RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- One probe per distinct pending priority (jobs_claim_pending), as
    -- alk._claim walks them, stopping at the first with a due job: the
    -- first entry of a priority holds its earliest run_at.
    WITH RECURSIVE priorities(priority, run_at, id) AS (
        (SELECT j.priority, j.run_at, j.id FROM alk.jobs j
          WHERE j.slot <> 2 AND j.queue = $1 AND j.state = 'pending' AND j.after_left = 0
          ORDER BY j.priority DESC, j.run_at, j.id LIMIT 1)
        UNION ALL
        SELECT f.priority, f.run_at, f.id
          FROM priorities p
         CROSS JOIN LATERAL (
            SELECT j.priority, j.run_at, j.id FROM alk.jobs j
             WHERE j.slot <> 2 AND j.queue = $1 AND j.state = 'pending' AND j.after_left = 0 AND j.priority < p.priority
             ORDER BY j.priority DESC, j.run_at, j.id LIMIT 1) f
    )
    SELECT EXISTS (SELECT FROM priorities p WHERE p.run_at <= $2)
$$;
COMMENT ON FUNCTION alk._due_pending(text, bigint) IS
'internal: whether the queue has a due pending job with nothing left to wait for';

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
    claimable_now boolean;
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
    SELECT * INTO lim FROM alk.limited_queues l WHERE l.queue = next_claim_at.queue;
    -- The earliest run_at of a pending job. jobs_claim_pending is ordered by
    -- (priority DESC, run_at, id), so the minimum over all priorities is the
    -- first entry of each distinct priority: a loose index scan that costs
    -- one probe per distinct priority, not one per row. Whether a due job
    -- can be claimed now is asked of each priority from that entry on, as
    -- alk._claim scans it: due jobs all in full serial groups are not.
    WITH RECURSIVE priorities(priority, run_at, id) AS (
        (SELECT j.priority, j.run_at, j.id FROM alk.jobs j
          WHERE j.slot <> 2 AND j.queue = next_claim_at.queue AND j.state = 'pending' AND j.after_left = 0
          ORDER BY j.priority DESC, j.run_at, j.id LIMIT 1)
        UNION ALL
        SELECT f.priority, f.run_at, f.id
          FROM priorities p
         CROSS JOIN LATERAL (
            SELECT j.priority, j.run_at, j.id FROM alk.jobs j
             WHERE j.slot <> 2 AND j.queue = next_claim_at.queue AND j.state = 'pending' AND j.after_left = 0
               AND j.priority < p.priority
             ORDER BY j.priority DESC, j.run_at, j.id LIMIT 1) f
    )
    SELECT min(p.run_at),
           coalesce(bool_or(p.run_at <= clock AND EXISTS (
               SELECT FROM alk.jobs j
                WHERE j.slot <> 2 AND j.queue = next_claim_at.queue AND j.state = 'pending' AND j.after_left = 0
                  AND j.priority = p.priority AND j.run_at <= clock AND (j.run_at, j.id) >= (p.run_at, p.id)
                  AND (j.group_key IS NULL
                       OR alk._group_has_room(j.queue, j.group_key, j.priority, j.run_at, j.id, clock,
                                              coalesce(lim.max_running_per_group, 1))))), false)
      INTO first_run_at, claimable_now
      FROM priorities p;
    -- Due jobs, all of them in full serial groups: not claimable now, so the
    -- earliest future run_at instead (a group frees up when its running job
    -- ends, by a settle that claims again or by its lease, counted below).
    IF first_run_at <= clock AND NOT claimable_now THEN
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

-- The CREATE OR REPLACE of these functions dropped 0036's and 0039's settings.
DO $$
BEGIN
    IF pg_catalog.current_setting('server_version_num')::int >= 180000 THEN
        ALTER FUNCTION alk._claim(text, text, bigint) SET enable_sort = off;
        ALTER FUNCTION alk.next_claim_at(text) SET enable_sort = off;
        ALTER FUNCTION alk._due_pending(text, bigint) SET enable_sort = off;
    ELSE
        ALTER FUNCTION alk._claim(text, text, bigint) SET enable_seqscan = off;
        ALTER FUNCTION alk._claim(text, text, bigint) SET enable_bitmapscan = off;
        ALTER FUNCTION alk.next_claim_at(text) SET enable_seqscan = off;
        ALTER FUNCTION alk.next_claim_at(text) SET enable_bitmapscan = off;
        ALTER FUNCTION alk._due_pending(text, bigint) SET enable_seqscan = off;
        ALTER FUNCTION alk._due_pending(text, bigint) SET enable_bitmapscan = off;
    END IF;
END
$$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
