-- pyalk 0042: rotation_moves_with_settled (issue 25; end to end on bursts of 20,000 jobs, 0.97x graphile-worker). A
-- rotation was due once min_jobs ids were taken, live or not, so a burst of 20,000 had its 19,000 live jobs moved
-- under the slot's lock at its first settle (73 ms, every claim and settle waiting), and moved again: 3 rotations,
-- 97 ms of a 460 ms run. A rotation is now due once min_jobs of the slot's entries are settled and no more of them
-- are live than settled (a tenth of min_jobs once none is live, as 0038; min_jobs 0 still means now), so it moves
-- live jobs only with at least as many settled entries to clear. The rule lives in sql/queue/15_rotation.sql.

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
    moved bigint;
    last_id bigint;
    taken bigint;
    cur bigint;
    nxt bigint;
    live bigint;
    drained_min bigint;
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
    SELECT s.current_slot, s.rotated_at_id, s.moved_in INTO cur, since, moved FROM alk.job_slots s;
    last_id := coalesce(pg_catalog.pg_sequence_last_value('alk.jobs_id_seq'), 0);
    taken := last_id - since;
    IF taken + moved < drained_min THEN
        RETURN 'not due';  -- not even with every entry settled: nothing to count
    END IF;
    nxt := 1 - cur;
    -- Counted before the lock, which it may spare everybody: a backlog too
    -- big to move, or moved jobs still live, hold nobody up to say so. The
    -- count under the lock below is the one the move goes by.
    live := alk._slot_live(cur, max_live + 1);
    IF live > max_live THEN
        RETURN 'too many live jobs';
    END IF;
    IF min_jobs > 0
       AND taken + moved - live < (CASE WHEN live = 0 THEN drained_min ELSE greatest(min_jobs, live) END) THEN
        RETURN 'not due';
    END IF;
    -- Every statement on alk.jobs locks every slot it may touch until its
    -- transaction ends, and under load some claim or ack always holds the
    -- slot. Wait for it, briefly (the statements that queue behind our
    -- request wait as long), and only behind the row locks of transactions
    -- under a second old (claims, acks, enqueues): behind an old one (an
    -- enqueue in a long transaction, a pg_dump) or a VACUUM or ANALYZE of
    -- the slot (autovacuum's too, which yields only after deadlock_timeout)
    -- we would stall everybody for nothing. 0040.
    BEGIN
        EXECUTE pg_catalog.format('LOCK TABLE alk.jobs_%s IN ACCESS EXCLUSIVE MODE NOWAIT', cur);
    EXCEPTION WHEN lock_not_available THEN
        IF EXISTS (SELECT FROM pg_catalog.pg_locks l JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
                    WHERE l.locktype = 'relation' AND l.database = a.datid AND l.granted
                      AND l.relation = pg_catalog.format('alk.jobs_%s', cur)::regclass
                      AND (a.xact_start < pg_catalog.clock_timestamp() - interval '1 second'
                           OR l.mode NOT IN ('AccessShareLock', 'RowShareLock', 'RowExclusiveLock'))) THEN
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
    live := alk._slot_live(cur, max_live + 1);
    IF live > max_live THEN
        RETURN 'too many live jobs';
    END IF;
    -- Through the parent, so the row moves whole (id, attempts, lease and
    -- all: every token stays valid). Whoever waited for our lock takes its
    -- snapshot after it, and finds the rows where they went.
    EXECUTE pg_catalog.format(
        'UPDATE alk.jobs SET slot = CASE WHEN state IN (''pending'', ''processing'') THEN %s ELSE 2 END WHERE slot = %s',
        nxt, cur);
    EXECUTE pg_catalog.format('TRUNCATE alk.jobs_%s', cur);
    UPDATE alk.job_slots s
       SET current_slot = nxt, rotated_at_id = last_id, rotated_at = alk.now(), rotations = s.rotations + 1,
           moved_in = live;
    RETURN 'rotated';
END
$$;
COMMENT ON FUNCTION alk.rotate_jobs(bigint) IS
'Rotate the job storage once min_jobs of the jobs the current slot took since the last rotation, or that the last '
'rotation moved into it, are settled and no more of them are live than settled (a tenth of min_jobs once none of '
'them is live; min_jobs 0: now): its pending '
'and processing jobs move to the other slot, its dead and completed jobs to the kept slot, and it is emptied with '
'TRUNCATE, which gives the space back even while a snapshot holds VACUUM back. Waits at most 100 ms for its lock, '
'and only behind the claims, acks and enqueues of transactions under a second old (not behind a VACUUM or ANALYZE '
'of the slot): returns ''rotated'', ''not due'', ''locked'' (a transaction that touched the jobs is open, a VACUUM '
'of the slot or a rotation runs: try again) '
'or ''too many live jobs'' (over 20,000 pending and processing: waits for the backlog to drain). Workers call it; '
'without workers, call it every second or so (pg_cron). '
'Example: SELECT alk.rotate_jobs();';

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
