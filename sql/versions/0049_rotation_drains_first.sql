-- pyalk 0049: rotation_drains_first (issue 25). A rotation moved the old slot's live jobs as soon as it switched
-- slots: a burst of 100,000 moved about 30,000 rows in two calls, 145 ms under the slot's lock with every claim and
-- settle waiting, though the claims would have taken those jobs (the oldest) within a second. Now, when min_jobs is
-- not 0, the live jobs are left to the claims for drain_s (2) seconds of alk.now() after the switch, and only what is
-- left then moves; the calls in between answer 'moving' and take no lock. Unless a snapshot holds dead rows back
-- (alk._horizon_held: a transaction in this database over a second old with a snapshot or an xid, a standby's or a
-- replication slot's): then every claim walks all of the old slot's settled entries, and moving at once stays
-- cheaper, as before. alk._rotate_jobs takes drain_s. The rule lives in sql/queue/15_rotation.sql.

-- alk._horizon_held(): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._horizon_held()
RETURNS boolean
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT EXISTS (SELECT FROM pg_catalog.pg_stat_activity a
                    WHERE a.pid <> pg_catalog.pg_backend_pid()
                      AND ((a.datname = pg_catalog.current_database() AND a.backend_type <> 'autovacuum worker'
                            AND (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL)
                            AND a.xact_start < pg_catalog.clock_timestamp() - interval '1 second')
                           OR (a.backend_type = 'walsender' AND a.backend_xmin IS NOT NULL)))
        OR EXISTS (SELECT FROM pg_catalog.pg_replication_slots r WHERE r.xmin IS NOT NULL)
$$;
COMMENT ON FUNCTION alk._horizon_held() IS
'internal: whether a snapshot holds dead rows back: a transaction in this database over a second old with a snapshot '
'or an xid, a standby''s or a replication slot''s';

-- alk._rotate_jobs(bigint,bigint,bigint,bigint): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._rotate_jobs(min_jobs bigint, step_rows bigint, max_live bigint, drain_s bigint)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- The longest a rotation waits for its lock, and so holds up the claims
    -- and acks queued behind it.
    max_wait_ms constant bigint := 100;
    since bigint;
    switched_at bigint;
    moved bigint;
    last_id bigint;
    taken bigint;
    cur bigint;
    draining bigint;
    live bigint;
    drained_min bigint;
    bound bigint;
    keyed bigint := 0;
    step_moved bigint;
    step_live bigint;
    left_live boolean := true;  -- whether the draining slot may still hold live jobs
BEGIN
    IF min_jobs IS NULL OR min_jobs < 0 THEN
        PERFORM alk._raise('LK002', 'min_jobs must be >= 0, got ' || coalesce(min_jobs::text, 'NULL'));
    END IF;
    drained_min := min_jobs / 10 + (min_jobs % 10 <> 0)::int;  -- a tenth, rounded up
    -- Never queue behind anybody: a waiting ACCESS EXCLUSIVE request would
    -- stall every claim and ack behind it. Whoever holds a lock, we go.
    IF NOT pg_catalog.pg_try_advisory_xact_lock(alk._rotation_lock()) THEN
        RETURN 'locked';
    END IF;
    SELECT s.current_slot, s.rotated_at_id, s.moved_in, s.draining_slot, s.rotated_at
      INTO cur, since, moved, draining, switched_at
      FROM alk.job_slots s;
    IF draining IS NULL THEN
        last_id := coalesce(pg_catalog.pg_sequence_last_value('alk.jobs_id_seq'), 0);
        taken := last_id - since;
        IF taken + moved < drained_min THEN
            RETURN 'not due';  -- not even with every entry settled: nothing to count
        END IF;
        -- Due once min_jobs entries are settled and no more are live than
        -- settled, and with over step_rows live, once twice as many are
        -- settled as live: a burst's moves then start late, where 0043's
        -- did (a burst of 100,000 moved 50,000, 25,000 and 12,500 at an
        -- even split, 3.6% of its run), while a backlog that never drains
        -- still rotates (at four times, its claims decayed to 0.44 of the
        -- first run before it did). So it is due exactly when at most bound
        -- jobs are live: the count stops at bound + 1, and the pass over
        -- the slot it costs is before the lock, which it may spare
        -- everybody. A backlog over step_rows not yet due says so ('too
        -- many live jobs': the caller waits longer before the next count).
        IF min_jobs = 0 THEN
            bound := max_live;
        ELSE
            bound := (taken + moved) / 2;
            IF bound > step_rows THEN
                bound := greatest(step_rows, (taken + moved) / 3);
            END IF;
            bound := greatest(least(taken + moved - min_jobs, bound), 0);
        END IF;
        -- Above max_live a count costs more than a call should spend each
        -- time a worker asks: the slot's live tuples by the statistics
        -- (inserted less deleted, flushed about every second; dead and
        -- completed jobs count too, so no fewer than its live jobs but for
        -- the last second's inserts) must first say it may be due.
        IF bound > max_live
           AND pg_catalog.pg_stat_get_live_tuples(pg_catalog.format('alk.jobs_%s', cur)::regclass) > bound THEN
            RETURN 'too many live jobs';
        END IF;
        live := alk._slot_live(cur, bound + 1);
        IF live > bound THEN
            RETURN CASE WHEN live > step_rows THEN 'too many live jobs' ELSE 'not due' END;
        END IF;
        -- The keyed ones move at once (below), so more than step_rows of them
        -- wait for their backlog.
        keyed := alk._slot_live(cur, step_rows + 1, keyed => true);
        IF keyed > step_rows THEN
            RETURN 'too many live jobs';
        END IF;
        -- Jobs enqueued while it waits for the lock move too.
        IF NOT alk._lock_slot(cur, max_wait_ms) THEN
            RETURN 'locked';
        END IF;
        -- New jobs go to the other slot from here on, and the live jobs with
        -- a dedup key go there now: a keyed enqueue must find its key's live
        -- holder in the slot it inserts into (jobs_dedup is unique per slot).
        -- Through the parent, so each row moves whole (id, attempts, lease
        -- and all: every token stays valid). Whoever waited for our lock
        -- takes its snapshot after it, and finds the rows where they went.
        EXECUTE pg_catalog.format(
            'WITH m AS (UPDATE alk.jobs SET slot = %s WHERE slot = %s AND dedup_key IS NOT NULL'
            ' AND state IN (''pending'', ''processing'') RETURNING 1) SELECT count(*) FROM m', 1 - cur, cur)
           INTO keyed;
        switched_at := alk.now();
        UPDATE alk.job_slots s
           SET current_slot = 1 - cur, draining_slot = cur, rotated_at_id = last_id, rotated_at = switched_at,
               rotations = s.rotations + 1, moved_in = keyed;
        draining := cur;
        left_live := live > keyed;  -- none left: the step below only clears the slot
    END IF;
    -- The live jobs are left to the claims for drain_s after the switch,
    -- unless nothing clears dead rows (0049): no lock, nothing moved.
    IF min_jobs > 0 AND drain_s > 0 AND left_live AND alk.now() < switched_at + drain_s
       AND NOT alk._horizon_held() THEN
        RETURN 'moving';
    END IF;
    -- The switch holds the slot's lock already.
    IF draining <> cur AND NOT alk._lock_slot(draining, max_wait_ms) THEN
        RETURN 'locked';
    END IF;
    -- A step: up to step_rows of the draining slot's rows move, the live
    -- ones to the current slot (counted there as moved in), the dead and
    -- completed ones to the kept slot. Fewer than step_rows found: none is
    -- left (nobody else can write the slot while we hold its lock), and
    -- TRUNCATE gives its space back.
    EXECUTE pg_catalog.format(
        'WITH m AS (UPDATE alk.jobs SET slot = CASE WHEN state IN (''pending'', ''processing'') THEN %1$s ELSE 2 END'
        ' WHERE slot = %2$s AND ctid = ANY (ARRAY(SELECT ctid FROM alk.jobs_%2$s LIMIT %3$s)) RETURNING slot)'
        ' SELECT count(*), count(*) FILTER (WHERE slot <> 2) FROM m', 1 - draining, draining, step_rows)
       INTO step_moved, step_live;
    IF step_moved < step_rows THEN
        EXECUTE pg_catalog.format('TRUNCATE alk.jobs_%s', draining);
        UPDATE alk.job_slots s SET draining_slot = NULL, moved_in = s.moved_in + step_live;
        RETURN 'rotated';
    END IF;
    UPDATE alk.job_slots s SET moved_in = s.moved_in + step_live;
    RETURN 'moving';
END
$$;
COMMENT ON FUNCTION alk._rotate_jobs(bigint, bigint, bigint, bigint) IS
'internal: alk.rotate_jobs with its bounds: step_rows moved per call, max_live live jobs counted at most unless the '
'statistics say the slot may be due, live jobs left to the claims for drain_s seconds unless a snapshot is held';

-- alk.rotate_jobs(bigint): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.rotate_jobs(min_jobs bigint DEFAULT 10000)
RETURNS text
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT alk._rotate_jobs($1, 20000, 100000, 2)
$$;
COMMENT ON FUNCTION alk.rotate_jobs(bigint) IS
'Rotate the job storage once min_jobs of the jobs the current slot took since the last rotation, or that the last '
'rotation moved into it, are settled and no more of them are live than settled, or half as many with over 20,000 '
'live (a tenth of min_jobs once none of them is live; min_jobs 0: now): new jobs go to the other slot from then on, the slot''s pending and processing jobs '
'move there (those the claims have not taken within 1 to 2 s, unless min_jobs is 0 or a snapshot over a second old '
'holds dead rows back: then at once) and its dead and completed jobs to the kept slot, at most 20,000 rows a call, and once none is left it '
'is emptied with TRUNCATE, which gives the space back even while a snapshot holds VACUUM back. Waits at most 100 ms '
'for its lock, and only behind the claims, acks and enqueues of transactions under a second old (not behind a '
'VACUUM or ANALYZE of the slot): returns ''rotated'' (the slot is emptied), ''moving'' (the slot is being emptied: '
'call again), ''not due'', ''locked'' (a transaction that touched the jobs is open, a VACUUM of the slot '
'or a rotation runs: try again) or ''too many live jobs'' (over 20,000 pending and processing jobs and not due '
'yet, over 100,000 when min_jobs is 0, or over 20,000 with a dedup key: try again later; counting them takes a pass '
'over the slot, which over 100,000 it takes only once the statistics'' live tuples of the slot say it may be due). '
'Workers call it; without workers, call it every second or so (pg_cron). '
'Example: SELECT alk.rotate_jobs();';

-- alk._rotate_jobs(bigint,bigint,bigint) is gone from the current files
DROP FUNCTION alk._rotate_jobs(bigint,bigint,bigint);

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
