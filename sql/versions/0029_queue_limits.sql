-- pyalk 0029: queue_limits (issue 26, points 1, 2 and 6). Flow control in the claim: alk.set_queue_limits and
-- alk.queue_limits (the tables alk.limited_queues, a row only while a limit is set, and alk.queue_rate_windows,
-- written only by rate-limited queues' claims). alk._claim probes the limits table once per claim; a queue with a
-- row is claimed under that row's lock, at most max_running valid leases and rate claims per fixed window of
-- rate_period_s seconds (alk._claim_budget, alk._rate_spend). Serial groups: alk.jobs.group_key (enqueue's
-- group_key, enqueue_batch's group_keys), at most max_running_per_group (default 1) of a group running, a full
-- group passed over by the claim (alk._group_has_room, the indexes jobs_group_running and jobs_group_pending).
-- alk.next_claim_at knows both. alk.job and alk.settle_claim_row gain group_key at the end; nothing an older
-- client reads moves, so breaking_since stays. After 0028 (job dependencies): a job waiting on its after jobs
-- is never ahead in its group (alk._group_has_room, jobs_group_pending leave it out), so both rules hold at once.

-- hand-written: the enqueue forms gain a trailing parameter, so they are dropped and created anew. Keep what an
-- administrator granted on the old signatures (0026's way), re-granted on the new ones at the end; the role
-- kinds are re-granted by alk._regrant().
SELECT pg_catalog.set_config('alk.upgrade_grants', coalesce((
    SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_array(p.proname, a.grantee::regrole::text))
      FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
     WHERE p.oid IN ('alk.enqueue(text,jsonb,bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,text,jsonb,bigint[])'::regprocedure,
                     'alk.enqueue_batch(text,jsonb[],bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,text[],jsonb,bigint[])'::regprocedure)
       AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner), '[]')::text, false);
DROP FUNCTION alk._enqueue(text,jsonb[],bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,jsonb);
DROP FUNCTION alk._enqueue_one(text,jsonb,bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,text,jsonb,bigint[]);
DROP FUNCTION alk.enqueue(text,jsonb,bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,text,jsonb,bigint[]);
DROP FUNCTION alk.enqueue_batch(text,jsonb[],bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,text[],jsonb,bigint[]);

-- hand-written: the group key, its indexes, the limits tables and the row types.
ALTER TABLE alk.jobs ADD COLUMN group_key text;
CREATE INDEX jobs_group_running ON alk.jobs (queue, group_key) WHERE state = 'processing' AND group_key IS NOT NULL;
CREATE INDEX jobs_group_pending ON alk.jobs (queue, group_key, priority DESC, run_at, id)
    WHERE state = 'pending' AND group_key IS NOT NULL AND after_left = 0;
CREATE TABLE alk.limited_queues (
    queue text NOT NULL,
    max_running bigint,
    rate bigint,
    rate_period_s bigint,
    max_running_per_group bigint,
    CONSTRAINT limited_queues_pkey PRIMARY KEY (queue)
);
COMMENT ON TABLE alk.limited_queues IS
'Per-queue claim limits (max running, rate, per-group running). Private: use alk.set_queue_limits.';
CREATE TABLE alk.queue_rate_windows (
    queue text NOT NULL,
    started_at bigint NOT NULL,
    claims bigint NOT NULL,
    CONSTRAINT queue_rate_windows_pkey PRIMARY KEY (queue)
);
COMMENT ON TABLE alk.queue_rate_windows IS
'The current rate window of each rate-limited queue: when it opened and how many claims it has had. Private.';
ALTER TYPE alk.job ADD ATTRIBUTE group_key text;
ALTER TYPE alk.settle_claim_row ADD ATTRIBUTE group_key text;
CREATE TYPE alk.queue_limit AS (
    queue text,
    max_running bigint,
    rate bigint,
    rate_period_s bigint,
    max_running_per_group bigint
);
COMMENT ON TYPE alk.queue_limit IS 'A queue''s claim limits as alk.queue_limits returns them (NULL: not set).';

-- alk._check_group_keys(text[],bigint): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._check_group_keys(group_keys text[], payloads bigint)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF cardinality(group_keys) <> payloads THEN
        PERFORM alk._raise('LK002', 'group_keys must have one entry per payload: got ' || coalesce(payloads, 0)
            || ' payloads and ' || cardinality(group_keys) || ' group_keys');
    END IF;
    PERFORM alk._name_ok('group_key', k, true) FROM unnest(group_keys) AS g(k) WHERE k IS NOT NULL;
END
$$;
COMMENT ON FUNCTION alk._check_group_keys(text[], bigint) IS
'internal: LK002 unless group_keys has one entry per payload, LK001 unless each is NULL or a valid name';

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
             WHERE j.queue = _claim.queue AND j.state = 'processing' AND j.claim_expires_at < clock
               -- Serial groups: fewer than per_group others of the group
               -- hold a lease or lapsed before it (in id order).
               AND (j.group_key IS NULL
                    OR (SELECT count(*) FROM (SELECT FROM alk.jobs k
                         WHERE k.queue = _claim.queue AND k.group_key = j.group_key AND k.state = 'processing'
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
         WHERE j.queue = lim.queue AND j.state = 'processing' AND j.claim_expires_at >= clock;
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

-- alk._enqueue(text,jsonb[],bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,jsonb,text[]): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._enqueue(
    queue text,
    payloads jsonb[],
    clock bigint,
    delay bigint,
    run_at bigint,
    priority bigint,
    max_attempts bigint,
    expires bigint,
    visibility_timeout_s bigint,
    backoff_base_s bigint,
    dead_letter_retention_s bigint,
    default_visibility_timeout_s bigint,
    default_max_attempts bigint,
    default_backoff_base_s bigint,
    headers jsonb DEFAULT NULL,
    group_keys text[] DEFAULT NULL
)
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    -- delay wins over run_at; neither means "now".
    v_run_at bigint := CASE
        WHEN delay IS NOT NULL THEN alk._sat_add(clock, delay)
        WHEN run_at IS NOT NULL THEN run_at
        ELSE clock END;
BEGIN
    -- alk._check_payloads raises; call it only when the cheap test fails.
    IF payloads IS NULL OR pg_catalog.array_position(payloads, NULL) IS NOT NULL THEN
        PERFORM alk._check_payloads(payloads);
    END IF;
    IF headers IS NOT NULL AND pg_catalog.jsonb_typeof(headers) <> 'object' THEN
        PERFORM alk._check_headers(headers);
    END IF;
    IF group_keys IS NOT NULL THEN
        PERFORM alk._check_group_keys(group_keys, cardinality(payloads));
    END IF;
    IF cardinality(payloads) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH inserted AS (
        INSERT INTO alk.jobs (queue, payload, priority, run_at, max_attempts, created_at, expires_at,
                              visibility_timeout_s, backoff_base_s, dead_letter_retention_s, headers, group_key)
        SELECT queue, p.payload, coalesce(priority, 0), v_run_at, coalesce(max_attempts, default_max_attempts),
               clock, alk._sat_add(clock, expires), coalesce(visibility_timeout_s, default_visibility_timeout_s),
               coalesce(backoff_base_s, default_backoff_base_s), dead_letter_retention_s, headers,
               group_keys[p.ord]
        FROM unnest(payloads) WITH ORDINALITY AS p(payload, ord)
        ORDER BY p.ord
        RETURNING alk.jobs.id
    )
    -- Identity values are drawn in insertion order, so id order is input order.
    SELECT inserted.id FROM inserted ORDER BY inserted.id;
    -- alk._wake's check, written out here: the hot path pays no call frame
    -- for it (the protocol in the wake-ups section above). A later statement
    -- than the insert: a fresh snapshot under READ COMMITTED. The EXISTS
    -- keeps a busy queue (no adverts) to one index probe, no lock.
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM pg_catalog.pg_notify(alk._queue_channel(_enqueue.queue), '');
    ELSIF EXISTS (SELECT FROM alk.idle_workers w WHERE w.queue = _enqueue.queue) THEN
        DELETE FROM alk.idle_workers w
         WHERE w.ctid = ANY (ARRAY(SELECT v.ctid FROM alk.idle_workers v WHERE v.queue = _enqueue.queue
                                     FOR UPDATE SKIP LOCKED));
        -- Took one: notify. Saw only adverts others hold: their holders'
        -- commits cover us; alk._wake_held waits briefly to know they commit.
        IF FOUND OR NOT alk._wake_held(_enqueue.queue) THEN
            PERFORM pg_catalog.pg_notify(alk._queue_channel(_enqueue.queue), '');
        END IF;
    END IF;
END
$$;
COMMENT ON FUNCTION alk._enqueue(text, jsonb[], bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, jsonb, text[]) IS
'internal: insert jobs with resolved stamps and wake idle workers; the batch forms and the scheduler call it';

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
                              visibility_timeout_s, backoff_base_s, dead_letter_retention_s, headers, group_key)
        VALUES (p_queue, p_payload, p_priority,
                CASE WHEN p_delay IS NOT NULL THEN alk._sat_add(p_clock, p_delay)
                     WHEN p_run_at IS NOT NULL THEN p_run_at ELSE p_clock END,
                p_max_attempts, p_clock, alk._sat_add(p_clock, p_expires),
                p_visibility_timeout_s, p_backoff_base_s, p_dead_letter_retention_s, p_headers, p_group_key)
        RETURNING alk.jobs.id INTO v_id;
    ELSE
        PERFORM alk._name_ok('dedup_key', p_dedup_key, true);
        LOOP
            -- The unique index decides: a concurrent enqueue of the same key
            -- waits for ours (or we for it) and then does nothing.
            INSERT INTO alk.jobs (queue, payload, priority, run_at, max_attempts, created_at, expires_at,
                                  visibility_timeout_s, backoff_base_s, dead_letter_retention_s, dedup_key,
                                  headers, group_key)
            VALUES (p_queue, p_payload, p_priority,
                    CASE WHEN p_delay IS NOT NULL THEN alk._sat_add(p_clock, p_delay)
                         WHEN p_run_at IS NOT NULL THEN p_run_at ELSE p_clock END,
                    p_max_attempts, p_clock, alk._sat_add(p_clock, p_expires),
                    p_visibility_timeout_s, p_backoff_base_s, p_dead_letter_retention_s, p_dedup_key, p_headers,
                    p_group_key)
            ON CONFLICT (queue, dedup_key) WHERE dedup_key IS NOT NULL AND state IN ('pending', 'processing')
            DO NOTHING
            RETURNING alk.jobs.id INTO v_id;
            EXIT WHEN v_id IS NOT NULL;
            -- Held: return the holder's id and write nothing (no wake-up
            -- either). Should the holder have gone since, insert again.
            SELECT j.id INTO v_id FROM alk.jobs j
             WHERE j.queue = p_queue AND j.dedup_key = p_dedup_key AND j.state IN ('pending', 'processing');
            IF v_id IS NOT NULL THEN
                RETURN v_id;
            END IF;
        END LOOP;
    END IF;
    -- A new job only (a dedup hit returned above, its holder unchanged).
    IF p_after IS NOT NULL THEN
        PERFORM alk._after_link(p_queue, ARRAY[v_id], p_after);
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

-- alk._get_job(text,bigint): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._get_job(queue text, job_id bigint)
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
                                     WHERE k.queue = $1 AND k.group_key = $2 AND k.state = 'pending'
                                       AND k.after_left = 0 AND k.priority > $3 AND k.run_at <= $6 LIMIT $7) h)
           -- ... and at its own, ahead of it (index-bounded: due, since it is)
           + (SELECT count(*) FROM (SELECT FROM alk.jobs k
                                     WHERE k.queue = $1 AND k.group_key = $2 AND k.state = 'pending'
                                       AND k.after_left = 0 AND k.priority = $3 AND (k.run_at, k.id) < ($4, $5)
                                     LIMIT $7) s)
           < $7
    END
      FROM (SELECT count(*) AS running
              FROM (SELECT FROM alk.jobs k
                     WHERE k.queue = $1 AND k.group_key = $2 AND k.state = 'processing' LIMIT $7) p) r
$$;
COMMENT ON FUNCTION alk._group_has_room(text, text, bigint, bigint, bigint, bigint, bigint) IS
'internal: whether a due pending job of a serial group may be claimed now (the group has room for it)';

-- alk._rate_spend(alk.limited_queues,bigint,bigint): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._rate_spend(lim alk.limited_queues, clock bigint, claimed bigint)
RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    INSERT INTO alk.queue_rate_windows AS w (queue, started_at, claims) VALUES ($1.queue, $2, $3)
    ON CONFLICT ON CONSTRAINT queue_rate_windows_pkey DO UPDATE
       SET started_at = CASE WHEN $2 <= alk._sat_add(w.started_at, $1.rate_period_s - 1) THEN w.started_at ELSE $2 END,
           claims = CASE WHEN $2 <= alk._sat_add(w.started_at, $1.rate_period_s - 1) THEN w.claims + $3 ELSE $3 END
$$;
COMMENT ON FUNCTION alk._rate_spend(alk.limited_queues, bigint, bigint) IS
'internal: count a claim''s jobs in its queue''s rate window';

-- alk._role_functions(): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._role_functions()
RETURNS TABLE (kind text, function_name text)
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT l.kind, l.function_name FROM (VALUES
        -- every kind: the clock and the schema check a client runs at connect
        ('base', 'now'), ('base', 'pinned_clock'), ('base', 'schema_info'),
        -- reader: inspection only (pyalk status, pyalk jobs, dashboards)
        ('reader', 'get_job'), ('reader', 'list_jobs'), ('reader', 'queue_stats'), ('reader', 'next_claim_at'),
        ('reader', 'outbox_get_job'), ('reader', 'read_since'), ('reader', 'get_offset'),
        ('reader', 'stream_channel'), ('reader', 'get_lock'), ('reader', 'get_schedule'),
        ('reader', 'list_schedules'), ('reader', 'cron_next'),
        -- the dashboard's and exporter's reads (0011)
        ('reader', 'browse_jobs'), ('reader', 'browse_events'), ('reader', 'stream_stats'),
        ('reader', 'stream_consumer_lag'), ('reader', 'queue_throughput'), ('reader', 'schedule_overview'),
        ('reader', 'list_locks'),
        -- the registry of running workers (0024)
        ('reader', 'workers'),
        -- a queue's completed-job retention (0026)
        ('reader', 'queue_retention'),
        -- a queue's claim limits (0029)
        ('reader', 'queue_limits'),
        -- producer: write work and events, and look at what it wrote
        ('producer', 'enqueue'), ('producer', 'enqueue_batch'), ('producer', 'outbox_enqueue'),
        ('producer', 'outbox_enqueue_batch'), ('producer', 'publish'), ('producer', 'publish_batch'),
        ('producer', 'get_job'), ('producer', 'outbox_get_job'),
        -- worker: claim and settle jobs (pyalk worker, outbox delivery),
        -- consume streams with checkpoints, hold its own locks
        ('worker', 'claim'), ('worker', 'ack'), ('worker', 'ack_batch'), ('worker', 'retry'), ('worker', 'fail'),
        ('worker', 'heartbeat'), ('worker', 'release_jobs'), ('worker', 'settle_and_claim'), ('worker', 'settle'),
        ('worker', 'snooze'),
        -- idle workers advertise themselves so enqueues wake them (docs/design.md)
        ('worker', 'wait_for_jobs'), ('worker', 'wake_fence'), ('worker', 'stop_waiting'),
        ('worker', 'next_claim_at'), ('worker', 'queue_channel'), ('worker', 'get_job'),
        -- pyalk worker checks the queue name with list_jobs(queue, n => 1) before it starts
        ('worker', 'list_jobs'),
        ('worker', 'outbox_claim'), ('worker', 'outbox_get_job'),
        ('worker', 'read_since'), ('worker', 'read_from_consumer'), ('worker', 'save_offset'),
        ('worker', 'get_offset'), ('worker', 'stream_channel'),
        ('worker', 'try_lock'), ('worker', 'renew_lock'), ('worker', 'release_lock'), ('worker', 'get_lock'),
        -- a running worker keeps its row in the registry (0024)
        ('worker', 'worker_register'), ('worker', 'worker_beat'), ('worker', 'worker_deregister'),
        -- admin: everything above (alk._kind_functions adds it) and these
        ('admin', 'cancel'), ('admin', 'sweep_expired'), ('admin', 'outbox_sweep_expired'), ('admin', 'trim_to'),
        ('admin', 'requeue_dead'), ('admin', 'pause_queue'), ('admin', 'resume_queue'),
        ('admin', 'set_queue_retention'), ('admin', 'set_queue_limits'),
        ('admin', 'schedule'), ('admin', 'unschedule'), ('admin', 'tick'), ('admin', 'scheduler_tick'),
        -- stop a worker from anywhere (0024)
        ('admin', 'request_stop'),
        -- the scheduler's leader loop holds the reserved lock alk:scheduler
        ('admin', '_try_lock'), ('admin', '_renew_lock'), ('admin', '_release_lock'),
        ('admin', 'grant_reader'), ('admin', 'grant_producer'), ('admin', 'grant_worker'), ('admin', 'grant_admin'),
        ('admin', 'revoke_all'), ('admin', 'role_grants'), ('admin', 'role_functions'),
        ('admin', 'limit_names'), ('admin', 'name_limits')
    ) AS l(kind, function_name)
$$;
COMMENT ON FUNCTION alk._role_functions() IS
'internal: the function names each role kind gets (base goes to every kind; admin also gets every other kind''s)';

-- alk.claim(text,text,bigint): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.claim(queue text, worker_id text, n bigint DEFAULT 1)
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
'n <= 0 claims nothing; a paused queue (alk.pause_queue) claims nothing. Queue limits (alk.set_queue_limits) cap '
'the claim: it returns fewer jobs, never an error. A job of a serial group (group_key) is passed over while its group '
'is full (max_running_per_group running, default 1; its due jobs in claim order). '
'Example: SELECT id, attempts, payload FROM alk.claim(''emails'', ''worker-1'', 10);';

-- alk.enqueue(text,jsonb,bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,text,jsonb,text,bigint[]): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.enqueue(
    queue text,
    payload jsonb,
    delay bigint DEFAULT NULL,
    run_at bigint DEFAULT NULL,
    priority bigint DEFAULT 0,
    max_attempts bigint DEFAULT 3,
    expires bigint DEFAULT NULL,
    visibility_timeout_s bigint DEFAULT 300,
    backoff_base_s bigint DEFAULT 5,
    dead_letter_retention_s bigint DEFAULT NULL,
    dedup_key text DEFAULT NULL,
    headers jsonb DEFAULT NULL,
    group_key text DEFAULT NULL,
    after bigint[] DEFAULT NULL
)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT alk._enqueue_one(alk._name_ok('queue', $1, false), $2, alk.now(), $3, $4, coalesce($5, 0),
                            coalesce($6, 3), $7, coalesce($8, 300), coalesce($9, 5), $10, $11, $12, $13, $14)
$$;
COMMENT ON FUNCTION alk.enqueue(text, jsonb, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, text, jsonb, text, bigint[]) IS
'Enqueue one job; returns its id. Ready time: delay (seconds from now) wins over run_at (absolute unix seconds); '
'neither means now. expires is a TTL in seconds from now. Stamps default to 300 s visibility, 3 attempts, 5 s backoff base, '
'dead rows kept forever. dedup_key: while a live (pending or processing) job of this queue holds the key, nothing is '
'written and that job''s id is returned; NULL: no dedup. headers: a JSON object that travels with the job (trace '
'context, correlation ids; get_job and claim return it), or NULL; anything else is LK002. group_key: the job''s serial '
'group: jobs of this queue with one key run at most max_running_per_group at a time (alk.set_queue_limits; default 1, '
'one after another in claim order); NULL: no group; checked as a name (LK001). '
'after: ids of jobs of this queue; the job stays pending but is not claimed until none of them exists any more '
'(acked, cancelled or purged) or is completed; ids that no longer exist count as done; an id of another queue or a '
'NULL entry is LK002. When a listed job dies the job dies too (last_error ''after job <id> died''), and '
'requeue_dead of that job brings it back, waiting again. A dedup hit ignores after. '
'Example: SELECT alk.enqueue(queue => ''emails'', payload => ''{"to": 1}'', delay => 30, dedup_key => ''welcome:1''); '
'SELECT alk.enqueue(''emails'', ''{"step": 2}'', after => ARRAY[41]);';

-- alk.enqueue_batch(text,jsonb[],bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,text[],jsonb,text[],bigint[]): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.enqueue_batch(
    queue text,
    payloads jsonb[],
    delay bigint DEFAULT NULL,
    run_at bigint DEFAULT NULL,
    priority bigint DEFAULT 0,
    max_attempts bigint DEFAULT 3,
    expires bigint DEFAULT NULL,
    visibility_timeout_s bigint DEFAULT 300,
    backoff_base_s bigint DEFAULT 5,
    dead_letter_retention_s bigint DEFAULT NULL,
    dedup_keys text[] DEFAULT NULL,
    headers jsonb DEFAULT NULL,
    group_keys text[] DEFAULT NULL,
    after bigint[] DEFAULT NULL
)
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock bigint := alk.now();
    q text := alk._name_ok('queue', enqueue_batch.queue, false);
    ids bigint[];
BEGIN
    IF dedup_keys IS NULL AND enqueue_batch.after IS NOT NULL THEN
        -- One after list for the whole batch: every job waits for all of it.
        PERFORM alk._after_check(q, enqueue_batch.after);
        ids := ARRAY(SELECT * FROM alk._enqueue(q, payloads, clock,
            delay, enqueue_batch.run_at, enqueue_batch.priority, enqueue_batch.max_attempts,
            expires, enqueue_batch.visibility_timeout_s, enqueue_batch.backoff_base_s,
            enqueue_batch.dead_letter_retention_s, 300, 3, 5, enqueue_batch.headers, enqueue_batch.group_keys));
        PERFORM alk._after_link(q, ids, enqueue_batch.after);
        RETURN QUERY SELECT * FROM unnest(ids);
        RETURN;
    END IF;
    IF dedup_keys IS NULL THEN
        RETURN QUERY SELECT * FROM alk._enqueue(q, payloads, clock,
            delay, enqueue_batch.run_at, enqueue_batch.priority, enqueue_batch.max_attempts,
            expires, enqueue_batch.visibility_timeout_s, enqueue_batch.backoff_base_s,
            enqueue_batch.dead_letter_retention_s, 300, 3, 5, enqueue_batch.headers, enqueue_batch.group_keys);
        RETURN;
    END IF;
    PERFORM alk._check_payloads(payloads);
    IF cardinality(dedup_keys) <> cardinality(payloads) THEN
        PERFORM alk._raise('LK002', 'dedup_keys must have one entry per payload: got ' || cardinality(payloads)
            || ' payloads and ' || cardinality(dedup_keys) || ' dedup_keys');
    END IF;
    IF group_keys IS NOT NULL THEN
        PERFORM alk._check_group_keys(group_keys, cardinality(payloads));
    END IF;
    -- One at a time, in input order: a key repeated within the batch is
    -- held by its first occurrence, whose id the later ones return.
    FOR i IN 1 .. cardinality(payloads) LOOP
        RETURN NEXT alk._enqueue_one(q, payloads[i], clock, delay, enqueue_batch.run_at,
            coalesce(enqueue_batch.priority, 0), coalesce(enqueue_batch.max_attempts, 3), expires,
            coalesce(enqueue_batch.visibility_timeout_s, 300), coalesce(enqueue_batch.backoff_base_s, 5),
            enqueue_batch.dead_letter_retention_s, dedup_keys[i], enqueue_batch.headers, group_keys[i],
            enqueue_batch.after);
    END LOOP;
END
$$;
COMMENT ON FUNCTION alk.enqueue_batch(text, jsonb[], bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, text[], jsonb, text[], bigint[]) IS
'Enqueue several jobs in one call with the same options; returns their ids in input order. dedup_keys, when given, '
'holds one key (or NULL) per payload, with alk.enqueue''s rule: a key held by a live job, or by an earlier payload of '
'the same batch, writes nothing and returns the holder''s id. headers, like every other option, is one value for '
'the whole batch (a JSON object or NULL, else LK002): the trace context of the call that enqueued it. group_keys, when '
'given, holds one serial group key (or NULL) per payload, as alk.enqueue''s group_key; another length is LK002. '
'after is one list for the whole batch: every job of it waits for all of them (alk.enqueue''s rule). '
'Example: SELECT * FROM alk.enqueue_batch(''emails'', ARRAY[''{"to": 1}'', ''{"to": 2}'']::jsonb[], priority => 5);';

-- alk.list_jobs(text,text,bigint,bigint): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.list_jobs(queue text, state text DEFAULT NULL, n bigint DEFAULT 100, after_id bigint DEFAULT NULL)
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
    SELECT * INTO lim FROM alk.limited_queues l WHERE l.queue = next_claim_at.queue;
    -- Due jobs, all of them in full serial groups: not claimable now, so the
    -- earliest future run_at instead (a group frees up when its running job
    -- ends, by a settle that claims again or by its lease, counted below).
    IF first_run_at <= clock AND NOT EXISTS (
        SELECT FROM alk.jobs j
         WHERE j.queue = next_claim_at.queue AND j.state = 'pending' AND j.after_left = 0 AND j.run_at <= clock
           AND (j.group_key IS NULL
                OR alk._group_has_room(j.queue, j.group_key, j.priority, j.run_at, j.id, clock,
                                       coalesce(lim.max_running_per_group, 1)))) THEN
        SELECT min(j.run_at) INTO first_run_at
          FROM alk.jobs j WHERE j.queue = next_claim_at.queue AND j.state = 'pending' AND j.after_left = 0
           AND j.run_at > clock;
    END IF;
    -- The first lease to lapse (one probe of jobs_claim_lapsed). A lease is
    -- claimable once claim_expires_at < now, i.e. from the next second on.
    SELECT min(j.claim_expires_at) INTO first_lease_end
      FROM alk.jobs j WHERE j.queue = next_claim_at.queue AND j.state = 'processing';
    next_at := least(first_run_at, alk._sat_add(first_lease_end, 1));
    IF next_at IS NULL THEN
        RETURN NULL;
    END IF;
    -- Queue limits hold the claim back further. max_running full: until the
    -- first valid lease lapses (an ack that frees a slot sooner claims again
    -- itself, or wakes nobody: NULL would mean the same wait).
    IF lim.max_running IS NOT NULL
       AND (SELECT count(*) FROM alk.jobs j WHERE j.queue = next_claim_at.queue AND j.state = 'processing'
               AND j.claim_expires_at >= clock) >= lim.max_running THEN
        SELECT alk._sat_add(min(j.claim_expires_at), 1) INTO held_until
          FROM alk.jobs j WHERE j.queue = next_claim_at.queue AND j.state = 'processing'
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

-- alk.queue_limits(text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.queue_limits(queue text)
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

-- alk.settle_and_claim(text,text,bigint,bigint[],bigint[],text[],text[],bigint[],jsonb[]): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.settle_and_claim(queue text, worker_id text, n bigint, job_ids bigint[] DEFAULT NULL,
                                     attempts bigint[] DEFAULT NULL, outcomes text[] DEFAULT NULL,
                                     errs text[] DEFAULT NULL, delays bigint[] DEFAULT NULL,
                                     results jsonb[] DEFAULT NULL)
RETURNS SETOF alk.settle_claim_row
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    -- Append runs its branches in order: every settlement is applied before
    -- the claim looks, all in the caller's one transaction.
    SELECT 'settled'::text, s.job_id, $1, s.state, NULL::jsonb, NULL::bigint, NULL::bigint, s.attempt,
           NULL::bigint, NULL::text, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint,
           NULL::bigint, NULL::bigint, NULL::text, NULL::bigint, NULL::text, NULL::bigint,
           NULL::jsonb, NULL::jsonb, NULL::bigint, NULL::text
      FROM alk._settle(alk._name_ok('queue', $1, false), $2, $4, $5, $6, $7, $8, $9) s
    UNION ALL
    SELECT 'claimed'::text, c.* FROM alk._claim(alk._name_ok('queue', $1, false), $2, $3) c
$$;
COMMENT ON FUNCTION alk.settle_and_claim(text, text, bigint, bigint[], bigint[], text[], text[], bigint[], jsonb[]) IS
'One call, one transaction: settle a batch of this queue''s claimed jobs exactly as alk.settle does (results '
'included), then claim up to '
'n as alk.claim does. Returns flat rows: first one kind = ''settled'' row per settlement in input order (id, queue, '
'attempts = the token given, state = ''acked'', ''pending'', ''dead'' or NULL when refused; other columns NULL), then '
'kind = ''claimed'' rows, whole jobs in claim order. '
'Example: SELECT kind, id, state, attempts, payload FROM alk.settle_and_claim(''emails'', ''worker-1'', 10, '
'ARRAY[41, 42], ARRAY[1, 1], ARRAY[''ack'', ''fail''], ARRAY[NULL, ''ValueError: bad address'']);';

-- hand-written: the grants kept from the old signatures, then every role kind's lists (the new functions).
DO $$
DECLARE
    g jsonb;
BEGIN
    FOR g IN SELECT * FROM pg_catalog.jsonb_array_elements(pg_catalog.current_setting('alk.upgrade_grants')::jsonb) LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s',
            (SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
              WHERE p.pronamespace = 'alk'::regnamespace AND p.proname = g ->> 0), g ->> 1);
    END LOOP;
    PERFORM pg_catalog.set_config('alk.upgrade_grants', '', false);
END
$$;
SELECT alk._regrant();

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
