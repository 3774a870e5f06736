-- pyalk 0046: group_claim_lock. Two claims could run two jobs of one serial group at once: alk._group_has_room
-- read the claim's snapshot, and a job of the group can become visible ahead of one a concurrent claim holds
-- uncommitted (ids are drawn at insert and committed in any order; requeue_dead puts a dead job back, and a job
-- done waiting for its after jobs joins the claim order).
-- The second claim saw that job first, nothing of the group running, and took it. A claim of a queue without a
-- limits row now takes each claimed group's claim lock (advisory, tried, held to commit) and asks again with a
-- read taken after it (alk._group_claimable); a queue with limits has its claim lock already. The lapsed-lease
-- rule moves into alk._group_has_room_lapsed so both reads share it. The rule lives in sql/queue/40_claim.sql.

-- alk._group_claimable(text,bigint[],text[],bigint,bigint): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._group_claimable(queue text, ids bigint[], keys text[], clock bigint, per_group bigint)
RETURNS bigint[]
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_variable
DECLARE
    g text;
    busy text[] := '{}';
    refused bigint[];
BEGIN
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM alk._raise('LK002', 'a claim that takes a job of a serial group (group_key) must run under READ '
            || 'COMMITTED isolation, got ' || pg_catalog.current_setting('transaction_isolation'));
    END IF;
    FOR g IN SELECT DISTINCT k.key FROM unnest(keys) AS k(key) LOOP
        IF NOT pg_catalog.pg_try_advisory_xact_lock(1634495331, alk._group_lock(queue, g)) THEN
            busy := busy || g;
        END IF;
    END LOOP;
    -- A statement after the locks: a snapshot that sees every claim of
    -- these groups committed before them.
    SELECT array_agg(j.id) INTO refused FROM alk.jobs j
     WHERE j.slot <> 2 AND j.id = ANY (ids) AND j.queue = queue
       AND (j.group_key = ANY (busy)
            OR NOT CASE WHEN j.state = 'pending'
                        THEN alk._group_has_room(queue, j.group_key, j.priority, j.run_at, j.id, clock, per_group)
                        ELSE alk._group_has_room_lapsed(queue, j.group_key, j.id, clock, per_group) END);
    RETURN refused;
END
$$;
COMMENT ON FUNCTION alk._group_claimable(text, bigint[], text[], bigint, bigint) IS
'internal: of the grouped jobs a claim without the queue''s claim lock locked, those it must leave: the group''s claim '
'lock (advisory, held to commit) is held by another claim, or a fresh read finds the group full';

-- alk._group_has_room_lapsed(text,text,bigint,bigint,bigint): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._group_has_room_lapsed(queue text, group_key text, id bigint, clock bigint, per_group bigint)
RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT (SELECT count(*) FROM (SELECT FROM alk.jobs k
                                   WHERE k.slot <> 2 AND k.queue = $1 AND k.group_key = $2 AND k.state = 'processing'
                                     AND k.id <> $3 AND (k.claim_expires_at >= $4 OR k.id < $3)
                                   LIMIT $5) o) < $5
$$;
COMMENT ON FUNCTION alk._group_has_room_lapsed(text, text, bigint, bigint, bigint) IS
'internal: whether a serial group''s processing job whose lease lapsed may be claimed again now';

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
            SELECT d.id, d.priority, d.run_at, d.dead, d.group_key
              FROM priorities p
             CROSS JOIN LATERAL (
                SELECT j.id, j.priority, j.run_at, j.group_key,
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

-- Its lock key serves the group's claim lock too.
COMMENT ON FUNCTION alk._group_lock(text, text) IS
'internal: the second key of a serial group''s advisory locks (the first is 1634495335, ''alkg'', for its turns, '
'1634495331, ''alkc'', for its claims)';

-- The CREATE OR REPLACE of alk._claim dropped 0036's and 0039's settings.
DO $$
BEGIN
    IF pg_catalog.current_setting('server_version_num')::int >= 180000 THEN
        ALTER FUNCTION alk._claim(text, text, bigint) SET enable_sort = off;
    ELSE
        ALTER FUNCTION alk._claim(text, text, bigint) SET enable_seqscan = off;
        ALTER FUNCTION alk._claim(text, text, bigint) SET enable_bitmapscan = off;
    END IF;
END
$$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
