-- pyalk queue, serial groups' turns (docs/queue.md "Limits"): which pending
-- jobs of a group are in the claim index. Landed in 0032_group_turns.sql.
--
-- Every statement here reads or writes live jobs only, so each says
-- slot <> 2: the planner leaves the kept slot out of its plan
-- (alk.jobs_kept, 10_table.sql; 0035).
--
-- The claim rule for groups is alk._group_has_room (40_claim.sql); this file
-- keeps a claim from walking past the jobs that rule would refuse. A due job
-- of a full group is *parked*: after_left = -1, out of jobs_claim_pending
-- (whose predicate is after_left = 0) and in jobs_group_parked. A group's
-- *turns* are the jobs it may run next: when it has room (fewer than its
-- share, max_running_per_group, default 1, processing), the first `room`
-- jobs of each of its priorities in (run_at, id) order; none when full.
-- Every turn is unparked; a job that is not a turn may be parked. That set
-- holds whatever the clock does: within a priority the first to come due is
-- the first by run_at, and a job due at a lower priority than a due turn is
-- behind it anyway. So a claim walks at most the turns of each group, and a
-- queue of 10^4 busy groups costs it what a queue without groups does.
--
-- Two writers keep the rule, serialized per group by an advisory lock:
-- - alk._group_turns unparks, after every statement that takes a grouped job
--   out of processing (ack, retry, fail, snooze, release, completion, cancel,
--   the claim's and the sweep's burials) or a pending one out of pending, in
--   a later statement (a fresh read): the deletes (ack, ack_batch, settle,
--   cancel) call it with the group keys they returned, the updates through
--   the trigger jobs_group_left. It takes the group's lock SHARED, waiting
--   only for a parker's commit (parkers never wait), so settles of one group
--   never wait for each other nor deadlock.
-- - alk._group_park parks, at the commit of a transaction that inserted a
--   grouped job (a row in alk.group_arrivals, written by the enqueue) or
--   made one pending again (a retry's or snooze's new run_at, requeue_dead,
--   the last after job done: the trigger jobs_group_returned), through
--   deferred triggers. It only TRIES the lock EXCLUSIVELY: while any settle
--   of the group is open it parks nothing (an unparked job costs a claim a
--   step, never a turn). With the lock it reads the group afresh (READ
--   COMMITTED: a new snapshot per statement, after the lock), parks what is
--   not a turn and unparks what is.
-- Jobs without a group pay nothing for any of it: no trigger on the insert
-- or the delete of a job, and the update trigger fires only on columns the
-- claim does not set.
-- A parked job a settle must see is therefore committed before that settle
-- reads the group, or parked by a transaction that saw the settle: no turn
-- stays parked. Two cases are left to the group's next settle or arrival, or
-- alk.sweep_expired (which heals its queue's groups): a settle under
-- REPEATABLE READ (its snapshot predates the lock), and a turn whose row
-- another settle held and rolled back.

-- The group's lock key: two int4 keys, a space apart from the bigint keys
-- (alk._rotation_lock). A hash collision only makes two groups share a lock.
CREATE FUNCTION alk._group_lock(queue text, group_key text)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.hashtext($1 || E'\x1f' || $2)
$$;
COMMENT ON FUNCTION alk._group_lock(text, text) IS
'internal: the second key of a serial group''s advisory locks (the first is 1634495335, ''alkg'', for its turns, '
'1634495331, ''alkc'', for its claims)';

-- The group's turns (see the top of this file), for a room of `room` jobs:
-- per priority, parked or not, the first `room` by (run_at, id). Priorities
-- found by a loose scan of each of the two group indexes.
CREATE FUNCTION alk._group_turn_ids(queue text, group_key text, room bigint)
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

-- How many more of the group may run: its share less its processing jobs
-- (any lease, as alk._group_has_room counts them).
CREATE FUNCTION alk._group_room(queue text, group_key text)
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

-- Unpark the turns of the groups (queues[i], group_keys[i]) (NULL keys and
-- repeats ignored), each under its lock taken shared: the settles' half.
-- A group without a parked job, or full, costs two index probes.
CREATE FUNCTION alk._group_turns(queues text[], group_keys text[])
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

-- Every group of a queue with a parked job gets its turns: what a settle
-- under REPEATABLE READ may have missed (alk.sweep_expired), or a new share
-- (alk.set_queue_limits).
CREATE FUNCTION alk._group_heal(queue text)
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

-- A grouped job left processing or pending by an update: its group's turns
-- may have changed.
CREATE FUNCTION alk._group_left()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM alk._group_turns(ARRAY[OLD.queue], ARRAY[OLD.group_key]);
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION alk._group_left() IS
'internal: trigger: unpark the turns of the group of a job that left processing or pending';

-- A trigger rather than a call in each of the statements that retry, fail,
-- snooze, release, complete or bury a job. It fires only on the columns
-- those set and the claim does not (retry and snooze set run_at, release
-- attempts_refunded, a burial died_at, a completion completed_at), and WHEN
-- keeps jobs without a group out of it. A rotation's moved rows are deleted
-- and inserted, which fires no UPDATE trigger.
CREATE TRIGGER jobs_group_left AFTER UPDATE OF run_at, attempts_refunded, died_at, completed_at ON alk.jobs
    FOR EACH ROW WHEN (OLD.group_key IS NOT NULL AND OLD.state IN ('pending', 'processing') AND NEW.state <> OLD.state)
    EXECUTE FUNCTION alk._group_left();
COMMENT ON TRIGGER jobs_group_left ON alk.jobs IS
'Unparks the turns of the serial group of a job that left processing or pending (alk._group_turns).';

-- The parkers' half (see the top of this file), for one group.
CREATE FUNCTION alk._group_park(queue text, group_key text)
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

-- The groups a transaction enqueued into, one row per enqueue (per group
-- for a batch), each handed to alk._group_park at its commit by a deferred
-- trigger, which deletes it: rows live only inside their transaction. A
-- side table rather than a trigger on the insert of every job, which would
-- cost each job without a group its WHEN test and after-trigger setup.
CREATE TABLE alk.group_arrivals (
    id bigint GENERATED ALWAYS AS IDENTITY,
    queue text NOT NULL,
    group_key text NOT NULL,
    CONSTRAINT group_arrivals_pkey PRIMARY KEY (id)
);
COMMENT ON TABLE alk.group_arrivals IS
'Serial groups enqueued into by open transactions, parked at their commit. Private: written by the enqueues.';

-- SECURITY DEFINER: a deferred trigger runs at commit as the session's
-- role, outside the alk function that enqueued.
CREATE FUNCTION alk._group_arrived()
RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM alk._group_park(NEW.queue, NEW.group_key);
    DELETE FROM alk.group_arrivals a WHERE a.id = NEW.id;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION alk._group_arrived() IS
'internal: trigger, at commit: park a group enqueued into (alk._group_park) and forget its arrival row';

-- Deferred to the commit, so the group's lock is held from the fresh read
-- to the commit only, not for the life of the transaction that enqueued
-- (a settle of the group waits for that lock).
CREATE CONSTRAINT TRIGGER group_arrivals_park AFTER INSERT ON alk.group_arrivals
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    EXECUTE FUNCTION alk._group_arrived();
COMMENT ON TRIGGER group_arrivals_park ON alk.group_arrivals IS
'At commit, parks the pending jobs of the group enqueued into that are not its turns (alk._group_park).';

CREATE FUNCTION alk._group_returned()
RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM alk._group_park(NEW.queue, NEW.group_key);
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION alk._group_returned() IS
'internal: trigger, at commit: park the group of a job pending again or done waiting (alk._group_park)';

-- A job pending again (a retry's or snooze's run_at, requeue_dead) or done
-- waiting for its after jobs. Neither the claim nor an ack sets these
-- columns, so their hot path pays nothing; an unpark (-1 to 0) is a turn.
CREATE CONSTRAINT TRIGGER jobs_group_returned AFTER UPDATE OF run_at, after_left ON alk.jobs
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (NEW.group_key IS NOT NULL AND NEW.state = 'pending' AND NEW.after_left = 0 AND OLD.after_left <> -1)
    EXECUTE FUNCTION alk._group_returned();
COMMENT ON TRIGGER jobs_group_returned ON alk.jobs IS
'At commit, parks a grouped job that became pending again, or claimable after its after jobs, unless it is one of '
'its group''s turns (alk._group_park).';
