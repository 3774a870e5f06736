-- pyalk queue, the claim (docs/contract.md#queue): the claim rule
-- (alk._claim, alk.claim), its limits (alk._group_has_room, alk._claim_budget,
-- alk._rate_spend) and alk.next_claim_at, which must agree with it on what is
-- claimable, so they sit side by side.
--
-- Every statement here reads or writes live jobs only, so each says
-- slot <> 2: the planner leaves the kept slot out of its plan
-- (alk.jobs_kept, 10_table.sql; 0035).
--
-- Before settle, whose alk.settle_and_claim calls alk._claim. Landed in
-- 0002_queue.sql (claim) and 0007_worker.sql (next_claim_at); changed by 0009,
-- 0016, 0026 (alk.job's new columns), 0028 (after: a waiting job is not in
-- jobs_claim_pending, whose predicate every pending read below repeats),
-- 0029 (queue limits, serial groups), 0032 (a freed max_running slot
-- wakes idle workers: alk._wake_freed) and 0046 (a serial group's claim
-- lock: alk._group_claimable).

-- limits --------------------------------------------------------------------

-- The serial-group rule for a due pending job of a group: its group has room
-- when the group's processing jobs (any lease: a lapsed one is claimed again
-- before its group moves on) plus the group's due pending jobs ahead of it in
-- claim order are fewer than per_group. With per_group = 1 only the group's
-- first due job is claimable, and only while none of the group runs. It
-- reads the claim's snapshot, which is not enough when claims run at once:
-- a job of the group can become visible ahead of one a concurrent claim
-- holds uncommitted (ids are drawn at insert but committed in any order;
-- requeue_dead puts a dead job back, and a job done waiting for its after
-- jobs joins the claim order), and the second claim then takes it. So the claim asks again, under a lock, with a fresher read: the
-- queue's claim lock where the queue has a limits row (alk._claim_budget),
-- else the group's (alk._group_claimable).
-- Each count stops at per_group entries; CASE runs the second only if needed.
-- A job still waiting on its after jobs (35_after.sql) is not ahead: it is
-- not claimable, and counting it would let it hold its group back, even
-- against the very job it waits for (both rules hold: a job is claimable only
-- when its after jobs are done and its group has room).
CREATE FUNCTION alk._group_has_room(queue text, group_key text, priority bigint, run_at bigint, id bigint,
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

-- The same rule for a grouped job whose lease lapsed: it is claimed again
-- while fewer than per_group others of its group hold a valid lease or
-- lapsed before it (in id order). Pending jobs of the group wait for it.
CREATE FUNCTION alk._group_has_room_lapsed(queue text, group_key text, id bigint, clock bigint, per_group bigint)
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

-- A claim of a queue without a limits row has no claim lock of its own, so
-- of the grouped jobs it locked (ids; their group keys in keys) it keeps
-- only those whose group it can lock and that still have room by a read
-- taken after the lock. The group's claim lock (first key 1634495331,
-- 'alkc'; the second alk._group_lock's) is held to commit, and only tried:
-- a claim that finds it held passes the group over (another claim of the
-- group is open, so it is busy or about to be), so claims never wait for
-- each other nor deadlock. Returns the ids it refuses; the caller leaves
-- them pending (locked until it commits). Under REPEATABLE READ the read
-- would not be fresh: LK002, as for a queue with limits. Jobs without a
-- group never get here.
CREATE FUNCTION alk._group_claimable(queue text, ids bigint[], keys text[], clock bigint, per_group bigint)
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

-- How many of wanted a claim of a queue with a limits row may take now. The
-- caller holds the queue's claim lock (its limits row, locked by alk._claim),
-- so claims of the queue run one at a time to their commit, each counting
-- what the last committed: every statement here reads a fresh snapshot under
-- READ COMMITTED (a repeatable-read snapshot would count from before the
-- lock, so it is refused). Lapsed leases do not count as running.
CREATE FUNCTION alk._claim_budget(lim alk.limited_queues, clock bigint, wanted bigint)
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

-- Count claims against the rate window (under the claim lock): into the
-- window in force, or into a new one opened now.
CREATE FUNCTION alk._rate_spend(lim alk.limited_queues, clock bigint, claimed bigint)
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

-- The first entry (priority, run_at, id) of each claimable pending priority,
-- in claim order: a loose scan of jobs_claim_pending, one probe per distinct
-- priority; given due_by, it stops after the first due by then. The callers
-- below read it; alk._claim has the scan inline, where its statement pulls
-- it lazily (a function's rows all come before the first is read).
CREATE FUNCTION alk._pending_priorities(queue text, due_by bigint)
RETURNS TABLE (priority bigint, run_at bigint, id bigint)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- PL/pgSQL for its plan cache: a SQL function's statement is planned
    -- at every call before PostgreSQL 18 (0.3 ms, five times the scan).
    RETURN QUERY
    WITH RECURSIVE priorities(priority, run_at, id) AS (
        (SELECT j.priority, j.run_at, j.id FROM alk.jobs j
          WHERE j.slot <> 2 AND j.queue = _pending_priorities.queue AND j.state = 'pending' AND j.after_left = 0
          ORDER BY j.priority DESC, j.run_at, j.id LIMIT 1)
        UNION ALL
        SELECT f.priority, f.run_at, f.id
          FROM priorities p
         CROSS JOIN LATERAL (
            SELECT j.priority, j.run_at, j.id FROM alk.jobs j
             WHERE j.slot <> 2 AND j.queue = _pending_priorities.queue AND j.state = 'pending' AND j.after_left = 0
               AND j.priority < p.priority
             ORDER BY j.priority DESC, j.run_at, j.id LIMIT 1) f
         WHERE _pending_priorities.due_by IS NULL OR p.run_at > _pending_priorities.due_by
    )
    SELECT p.priority, p.run_at, p.id FROM priorities p;
END
$$;
COMMENT ON FUNCTION alk._pending_priorities(text, bigint) IS
'internal: each pending priority''s first entry (priority, run_at, id) in claim order; due_by: up to the first due';

-- A settle that frees a max_running slot (ack, ack_batch, settle, retry,
-- fail, settle_and_claim, cancel of a processing job): the queue's idle
-- workers sleep until alk.next_claim_at, which said full, so the settle
-- wakes them through the wake protocol (alk._wake, 20_wake.sql: only a
-- visible idle advert costs a NOTIFY) when a due job waits for the slot.
-- Release and snooze wake through alk._wake already. Callers call it only
-- for jobs claimed under max_running (alk.jobs.under_max_running, which
-- their settling statement returns: alk.ack and cancel pay nothing more
-- for other jobs) or after a probe of alk.limited_queues folded into a
-- statement they run anyway (the batch forms, whose settled rows are gone
-- by then, and acks kept as completed); they call it in a statement after
-- the settlement (a fresh snapshot, as alk._wake needs: an
-- advert committed before it is seen; one committed after finds the settle
-- in the worker's fence). queues NULL: every queue with max_running (a
-- settle that did not name its queue). The slot is counted again here:
-- settle_and_claim calls this after its own claim, which may have refilled
-- it. A due job of a full serial group still wakes them (they claim nothing
-- and sleep again).
CREATE FUNCTION alk._due_pending(queue text, clock bigint)
RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- A priority's first entry holds its earliest run_at.
    SELECT EXISTS (SELECT FROM alk._pending_priorities($1, $2) p WHERE p.run_at <= $2)
$$;
COMMENT ON FUNCTION alk._due_pending(text, bigint) IS
'internal: whether the queue has a due pending job with nothing left to wait for';

-- caller: the worker whose settle_and_claim settles, whose claim came
-- next in the same call; its own advert wakes nobody (0041, then 0043 here:
-- a worker under max_running, advertised between its short claims, woke
-- itself after each one).
CREATE FUNCTION alk._wake_freed(queues text[], caller text DEFAULT NULL)
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
    IF NOT EXISTS (SELECT FROM alk.idle_workers w WHERE (queues IS NULL OR w.queue = ANY (queues))
                                                    AND w.worker_id IS DISTINCT FROM caller) THEN
        RETURN false;
    END IF;
    FOR q IN
        SELECT l.queue FROM alk.limited_queues l
         WHERE l.max_running IS NOT NULL AND (queues IS NULL OR l.queue = ANY (queues))
           -- Someone sleeps, a slot is free, and a due job waits for it.
           AND EXISTS (SELECT FROM alk.idle_workers w WHERE w.queue = l.queue AND w.worker_id IS DISTINCT FROM caller)
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
COMMENT ON FUNCTION alk._wake_freed(text[], text) IS
'internal: after a settle of jobs of these queues (NULL: any), wake the idle workers of each that has max_running, '
'a free slot and a due job, unless the only idle one is caller (settle_and_claim''s worker); true when one was woken';

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
'n <= 0 claims nothing; a paused queue (alk.pause_queue) claims nothing. Queue limits (alk.set_queue_limits) cap '
'the claim: it returns fewer jobs, never an error. A job of a serial group (group_key) is passed over while its group '
'is full (max_running_per_group running, default 1; its due jobs in claim order). '
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
    -- The earliest run_at of a pending job: the least of each priority's
    -- first entry. Whether a due job can be claimed now is asked of each
    -- priority from that entry on, as alk._claim scans it: due jobs all in
    -- full serial groups are not.
    SELECT min(p.run_at),
           coalesce(bool_or(p.run_at <= clock AND EXISTS (
               SELECT FROM alk.jobs j
                WHERE j.slot <> 2 AND j.queue = next_claim_at.queue AND j.state = 'pending' AND j.after_left = 0
                  AND j.priority = p.priority AND j.run_at <= clock AND (j.run_at, j.id) >= (p.run_at, p.id)
                  AND (j.group_key IS NULL
                       OR alk._group_has_room(j.queue, j.group_key, j.priority, j.run_at, j.id, clock,
                                              coalesce(lim.max_running_per_group, 1))))), false)
      INTO first_run_at, claimable_now
      FROM alk._pending_priorities(next_claim_at.queue, NULL) p;
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

-- Ordered scans merge, never sort (docs/design.md; 0036, 0039). These
-- functions read each slot's index in claim order and merge them. A queue's
-- statistics are wrong most of the time (taken while a slot was empty,
-- drained or full of processing rows), and the planner then sorted the
-- whole Append of the slots: 78 ms against 0.3 ms a claim at 10^5 pending.
-- PostgreSQL 18 skips a disabled path whenever it has another, so sorts are
-- off there. Before 18 a disabled path only costs 10^10 more, and every
-- claim plan sorts somewhere (the lapsed leases): sorts off made claim +
-- ack 3 s. There the sequential and bitmap scans that made the sort cheap
-- (an all but empty slot's rows come unordered) are off instead: every
-- table read has an index, and the slots merge (claim 1 + ack 0.80 against
-- 24.8 ms at 50,000 pending on 15). A CREATE OR REPLACE of these functions
-- drops these settings: a version that replaces one sets them again.
DO $$
BEGIN
    IF pg_catalog.current_setting('server_version_num')::int >= 180000 THEN
        ALTER FUNCTION alk._claim(text, text, bigint) SET enable_sort = off;
        ALTER FUNCTION alk.next_claim_at(text) SET enable_sort = off;
        ALTER FUNCTION alk._due_pending(text, bigint) SET enable_sort = off;
        ALTER FUNCTION alk._pending_priorities(text, bigint) SET enable_sort = off;
        ALTER FUNCTION alk._group_turn_ids(text, text, bigint) SET enable_sort = off;
    ELSE
        ALTER FUNCTION alk._claim(text, text, bigint) SET enable_seqscan = off;
        ALTER FUNCTION alk._claim(text, text, bigint) SET enable_bitmapscan = off;
        ALTER FUNCTION alk.next_claim_at(text) SET enable_seqscan = off;
        ALTER FUNCTION alk.next_claim_at(text) SET enable_bitmapscan = off;
        ALTER FUNCTION alk._due_pending(text, bigint) SET enable_seqscan = off;
        ALTER FUNCTION alk._due_pending(text, bigint) SET enable_bitmapscan = off;
        ALTER FUNCTION alk._pending_priorities(text, bigint) SET enable_seqscan = off;
        ALTER FUNCTION alk._pending_priorities(text, bigint) SET enable_bitmapscan = off;
        ALTER FUNCTION alk._group_turn_ids(text, text, bigint) SET enable_seqscan = off;
        ALTER FUNCTION alk._group_turn_ids(text, text, bigint) SET enable_bitmapscan = off;
    END IF;
END
$$;
