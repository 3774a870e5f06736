-- pyalk 0053: pending_priorities_due_by. 0052's alk._pending_priorities computed every pending priority's first
-- entry before its caller read one (a function's rows are all computed first), so alk._due_pending probed every
-- priority where 0051's EXISTS over the inline scan stopped at the first due one: 2.5 ms against 0.26 at 1,000
-- priorities on PostgreSQL 15. It now takes due_by: given it, the recursion ends after the first priority due by
-- then, the probes 0051 made; alk.next_claim_at passes NULL (it needs every priority). The rule lives in
-- sql/queue/40_claim.sql.

-- alk._pending_priorities(text,bigint): changed or new in the current files
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

-- alk._due_pending(text,bigint): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._due_pending(queue text, clock bigint)
RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- A priority's first entry holds its earliest run_at.
    SELECT EXISTS (SELECT FROM alk._pending_priorities($1, $2) p WHERE p.run_at <= $2)
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

-- alk._pending_priorities(text): replaced by the form above, its callers moved
DROP FUNCTION alk._pending_priorities(text);

-- The settings a CREATE OR REPLACE drops, set again, and set on the new
-- function (sql/queue/40_claim.sql: ordered scans merge, never sort).
DO $$
BEGIN
    IF pg_catalog.current_setting('server_version_num')::int >= 180000 THEN
        ALTER FUNCTION alk.next_claim_at(text) SET enable_sort = off;
        ALTER FUNCTION alk._due_pending(text, bigint) SET enable_sort = off;
        ALTER FUNCTION alk._pending_priorities(text, bigint) SET enable_sort = off;
    ELSE
        ALTER FUNCTION alk.next_claim_at(text) SET enable_seqscan = off;
        ALTER FUNCTION alk.next_claim_at(text) SET enable_bitmapscan = off;
        ALTER FUNCTION alk._due_pending(text, bigint) SET enable_seqscan = off;
        ALTER FUNCTION alk._due_pending(text, bigint) SET enable_bitmapscan = off;
        ALTER FUNCTION alk._pending_priorities(text, bigint) SET enable_seqscan = off;
        ALTER FUNCTION alk._pending_priorities(text, bigint) SET enable_bitmapscan = off;
    END IF;
END
$$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
