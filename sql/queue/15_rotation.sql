-- pyalk queue, the rotation of job storage (docs/contract.md#queue,
-- docs/design.md "Job storage"): alk.rotate_jobs and the lock a keyed
-- enqueue shares with it.
--
-- After the table: it moves alk.jobs' rows between its partitions; before
-- enqueue, whose keyed path takes alk._rotation_lock. Landed in
-- 0031_job_rotation.sql; 0038 counts the jobs a rotation moved in, and the
-- live ones before it takes its lock; 0040 does not wait behind a VACUUM;
-- 0042 moves live jobs only with as many settled ones; 0044 empties a slot
-- in steps, so a backlog over 20,000 rotates too; 0045 counts its keyed
-- jobs with alk._slot_live; 0048 counts a slot over 100,000 live jobs once
-- the statistics say it may be due; 0049 leaves a slot's live jobs to the
-- claims for a moment before moving them, unless a snapshot is held; 0050
-- keeps the even split above 20,000 live jobs while a snapshot is held.

-- A claim walks the pending index of every slot from the front, and each
-- entry a claim or an ack left behind costs it a heap visit until VACUUM
-- removes it, which no VACUUM can while any snapshot older than the entry
-- is held. A rotation bounds that walk to the jobs the current slot took
-- since the last rotation, and TRUNCATE returns the space at once.
--
-- When is a rotation due? The slot holds an entry for every job it took
-- since the last rotation (new ids) and for every live job that rotation
-- moved in; settled, each is an entry a claim walks past. It is due once
-- min_jobs of those entries are settled and no more of them are live than
-- settled (half as many above step_rows live, unless a snapshot is held),
-- or once a tenth of min_jobs are settled and none is live (the rotation
-- then moves nothing); min_jobs 0 asks for one now. A rotation
-- moves the live jobs under the slot's lock (about 2 ms per 1,000, every
-- claim and settle waiting), so it waits until it clears at least as many
-- entries as it moves: until 0042 it was also due once min_jobs ids were
-- taken, and a burst of 20,000 had its 19,000 live jobs moved at its first
-- settle (73 ms), then moved again. After a burst drains no new id comes,
-- and without the drained rule the next burst would start on the settled
-- entries of the jobs the last rotation moved in (under a held snapshot
-- nothing else clears them).
--
-- How does it move them? New jobs go to the other slot at once (with the
-- live jobs that hold a dedup key), and the rest leave the old slot at most
-- step_rows a call, each call under the slot's lock; the call that finds it
-- empty TRUNCATEs it. Until 0044 it moved everything in one call and so
-- refused slots of over 20,000 live jobs, and a backlog that stayed above
-- that was never rotated: under a held snapshot its claims walked ever more
-- settled entries, as the single table's did.
--
-- When does it move them? A live job moved costs about 7.5 us under the
-- slot's lock, every claim and settle waiting; one left where it is costs
-- nothing if the claims take it soon, as they do in a queue that drains
-- (its jobs are the oldest, so claimed first), and its settled entry is
-- cleared by the first claim that walks past it (a dead index entry is
-- marked as such once no snapshot can see it). So from 0049 the live jobs
-- are left to the claims for drain_s seconds of alk.now() after the switch
-- (1 to 2 s: whole seconds), and only what is left then moves. Unless a
-- snapshot is held (alk._horizon_held): then no dead entry is cleared,
-- every claim walks all of the old slot's, and moving at once is cheaper,
-- as it was until 0049 (a burst of 100,000 moved about 30,000 rows in two
-- calls, 145 ms under the lock, and ran 5% slower; docs/design.md).

-- The advisory lock key a rotation takes exclusively and a keyed enqueue or
-- requeue_dead shares: a live keyed job is then always in the current slot,
-- where jobs_dedup (unique per slot) sees it. 'alk_rot' in ASCII.
CREATE FUNCTION alk._rotation_lock()
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT 27422281159569268::bigint $$;
COMMENT ON FUNCTION alk._rotation_lock() IS
'internal: the advisory lock key alk.rotate_jobs takes and keyed enqueues share';

-- The live (pending, processing) jobs in one rotating slot, counted up to
-- at most: the rotation only needs to know whether there are more. keyed:
-- only those that hold a dedup key (a rotation moves them at once; 0045).
CREATE FUNCTION alk._slot_live(slot bigint, at_most bigint, keyed boolean DEFAULT false)
RETURNS bigint
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    live bigint;
BEGIN
    EXECUTE pg_catalog.format(
        'SELECT count(*) FROM (SELECT FROM alk.jobs_%s j WHERE j.state IN (''pending'', ''processing'')%s LIMIT %s) l',
        slot, CASE WHEN keyed THEN ' AND j.dedup_key IS NOT NULL' ELSE '' END, at_most) INTO live;
    RETURN live;
END
$$;
COMMENT ON FUNCTION alk._slot_live(bigint, bigint, boolean) IS
'internal: the live jobs in one rotating slot of alk.jobs (keyed: only those with a dedup key), counted up to at_most';

-- Lock one rotating slot ACCESS EXCLUSIVE for the rest of the transaction,
-- or say false. Every statement on alk.jobs locks every slot it may touch
-- until its transaction ends, and under load some claim or ack always holds
-- the slot. Wait for it, briefly (the statements that queue behind our
-- request wait as long), and only behind the row locks of transactions
-- under a second old (claims, acks, enqueues): behind an old one (an
-- enqueue in a long transaction, a pg_dump) or a VACUUM or ANALYZE of the
-- slot (autovacuum's too, which yields only after deadlock_timeout) we
-- would stall everybody for nothing (0040).
CREATE FUNCTION alk._lock_slot(slot bigint, max_wait_ms bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    previous_timeout text;
BEGIN
    BEGIN
        EXECUTE pg_catalog.format('LOCK TABLE alk.jobs_%s IN ACCESS EXCLUSIVE MODE NOWAIT', slot);
        RETURN true;
    EXCEPTION WHEN lock_not_available THEN
        IF EXISTS (SELECT FROM pg_catalog.pg_locks l JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
                    WHERE l.locktype = 'relation' AND l.database = a.datid AND l.granted
                      AND l.relation = pg_catalog.format('alk.jobs_%s', slot)::regclass
                      AND (a.xact_start < pg_catalog.clock_timestamp() - interval '1 second'
                           OR l.mode NOT IN ('AccessShareLock', 'RowShareLock', 'RowExclusiveLock'))) THEN
            RETURN false;
        END IF;
    END;
    previous_timeout := pg_catalog.current_setting('lock_timeout');
    PERFORM pg_catalog.set_config('lock_timeout', max_wait_ms::text, true);
    BEGIN
        EXECUTE pg_catalog.format('LOCK TABLE alk.jobs_%s IN ACCESS EXCLUSIVE MODE', slot);
    EXCEPTION WHEN lock_not_available THEN
        PERFORM pg_catalog.set_config('lock_timeout', previous_timeout, true);
        RETURN false;
    END;
    PERFORM pg_catalog.set_config('lock_timeout', previous_timeout, true);
    RETURN true;
END
$$;
COMMENT ON FUNCTION alk._lock_slot(bigint, bigint) IS
'internal: lock a rotating slot of alk.jobs ACCESS EXCLUSIVE, waiting at most max_wait_ms and only behind young '
'claims, acks and enqueues; false when not taken';

-- Whether a snapshot holds back the clearing of dead rows in this database:
-- a transaction here over a second old that holds a snapshot or an xid
-- (not autovacuum's, which VACUUM leaves out), a standby's snapshot
-- (hot_standby_feedback, through its walsender) or a replication slot's.
-- The same second as alk._lock_slot's "old transaction": the claims, acks
-- and enqueues of a working queue are all younger. Other roles' sessions
-- show their snapshot only to a superuser or a member of pg_read_all_stats,
-- so an owner that is neither sees fewer (0049).
CREATE FUNCTION alk._horizon_held()
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

-- The rotation, its bounds as arguments (alk.rotate_jobs passes the
-- documented ones; tests pass small ones). step_rows: the most rows one call
-- moves under the slot's lock (about 2 ms per 1,000, every claim and settle
-- of the slot waiting). max_live: the most live jobs a call counts on its
-- own say (100,000 cost about 10 ms); a slot that could be due only with
-- more is counted only once the statistics say it may be (0048). Until 0044
-- a slot with more than 20,000 live jobs never rotated, until 0048 one with
-- more than 100,000, and a backlog that stayed above it decayed as the
-- single table did. drain_s: how long the live jobs are left to the claims
-- after the switch, when min_jobs is not 0 and no snapshot is held (0049).
CREATE FUNCTION alk._rotate_jobs(min_jobs bigint, step_rows bigint, max_live bigint, drain_s bigint)
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
        -- first run before it did). Unless a snapshot holds dead rows back
        -- (0050): then every claim walks every settled entry (about 0.4 us
        -- a job per 1,000), and waiting for twice as many costs a backlog
        -- more than the moves it saves (7.5 us a row), so the even split
        -- holds at any size. So it is due exactly when at most bound jobs
        -- are live: the count stops at bound + 1, and the pass over the
        -- slot it costs is before the lock, which it may spare everybody.
        -- A backlog over step_rows not yet due says so ('too many live
        -- jobs': the caller waits longer before the next count).
        IF min_jobs = 0 THEN
            bound := max_live;
        ELSE
            bound := (taken + moved) / 2;
            IF bound > step_rows AND NOT alk._horizon_held() THEN
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

CREATE FUNCTION alk.rotate_jobs(min_jobs bigint DEFAULT 10000)
RETURNS text
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT alk._rotate_jobs($1, 20000, 100000, 2)
$$;
COMMENT ON FUNCTION alk.rotate_jobs(bigint) IS
'Rotate the job storage once min_jobs of the jobs the current slot took since the last rotation, or that the last '
'rotation moved into it, are settled and no more of them are live than settled, or half as many with over 20,000 '
'live and no snapshot over a second old holding dead rows back (a tenth of min_jobs once none of them is live; min_jobs 0: now): new jobs go to the other slot from then on, the slot''s pending and processing jobs '
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
