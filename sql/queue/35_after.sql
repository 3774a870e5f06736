-- pyalk queue, dependencies (docs/queue.md "Dependencies"): alk.enqueue's
-- after. Landed in 0028_job_dependencies.sql.
--
-- A job enqueued after=[a, b] waits (pending, after_left = the number of
-- listed jobs that still exist, out of jobs_claim_pending) until none of
-- them exists any more: acked, cancelled or purged (gone), or completed.
-- One row per (job waited for, waiting job) in alk.job_after. The enqueue
-- locks each listed job's row (setting its awaited flag), so a removal or
-- burial of that job orders after the enqueue's commit and its next
-- statement sees the edge, or before it and the enqueue sees it gone or
-- dead. Every path that removes, completes or buries an awaited job calls
-- alk._after_sync in a later statement than the change (a fresh snapshot
-- under READ COMMITTED): a queue that never uses after never calls it.
-- After enqueue (whose bodies call these at run time only).

-- LK002 unless after names only jobs of this queue (missing ids are done).
CREATE FUNCTION alk._after_check(queue text, after bigint[])
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    other bigint;
BEGIN
    IF pg_catalog.array_position(after, NULL) IS NOT NULL THEN
        PERFORM alk._raise('LK002', 'after must hold job ids, got NULL at position '
            || pg_catalog.array_position(after, NULL));
    END IF;
    SELECT j.id INTO other FROM alk.jobs j WHERE j.id = ANY (after) AND j.queue <> _after_check.queue LIMIT 1;
    IF other IS NOT NULL THEN
        PERFORM alk._raise('LK002', 'after must name jobs of queue ' || alk._show(_after_check.queue) || ': job '
            || other || ' is in another queue');
    END IF;
END
$$;
COMMENT ON FUNCTION alk._after_check(text, bigint[]) IS
'internal: LK002 unless after holds no NULL and names no job of another queue';

-- Make the new jobs job_ids (just inserted, checked by _after_check) wait
-- for the listed jobs that still exist. A listed job that is dead buries
-- them at once, as if they had been enqueued just before it died.
CREATE FUNCTION alk._after_link(queue text, job_ids bigint[], after bigint[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    waits bigint[];
    died bigint[];
BEGIN
    -- The lock that orders us against the listed jobs' ack, cancel or death
    -- (see the top of this file); completed jobs are done already.
    WITH listed AS (
        UPDATE alk.jobs j SET awaited = true
         WHERE j.id = ANY (after) AND j.queue = _after_link.queue AND j.state IN ('pending', 'processing', 'dead')
        RETURNING j.id, j.state
    )
    SELECT array_agg(l.id), array_agg(l.id) FILTER (WHERE l.state = 'dead') INTO waits, died FROM listed l;
    IF waits IS NULL THEN
        RETURN;
    END IF;
    INSERT INTO alk.job_after (after_id, job_id, queue)
    SELECT w.id, c.id, _after_link.queue FROM unnest(waits) AS w(id), unnest(job_ids) AS c(id);
    UPDATE alk.jobs j SET after_left = cardinality(waits)
     WHERE j.id = ANY (job_ids) AND j.queue = _after_link.queue;
    IF died IS NOT NULL THEN
        PERFORM alk._after_sync(died);
    END IF;
END
$$;
COMMENT ON FUNCTION alk._after_link(text, bigint[], bigint[]) IS
'internal: make new jobs wait for the listed jobs that still exist (buried at once when one is dead)';

-- Apply what became of jobs that others wait for (any ids; those nobody
-- waits for cost one probe): gone or completed releases their waiters
-- (after_left - 1 each; a waiter at 0 is claimable and idle workers are
-- woken); dead buries their waiters and theirs, transitively, each with
-- last_error 'after job <id> died' naming the job it waited for (their
-- rows in alk.job_after stay, for requeue_dead). Pending or processing:
-- nothing. Idempotent, so a caller may pass ids it did not change.
CREATE FUNCTION alk._after_sync(after_ids bigint[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock bigint := alk.now();
    done bigint[];
    died bigint[];
    woken text[];
BEGIN
    SELECT array_agg(e.after_id) FILTER (WHERE p.state IS NULL OR p.state = 'completed'),
           array_agg(e.after_id) FILTER (WHERE p.state = 'dead')
      INTO done, died
      FROM (SELECT DISTINCT e.after_id, e.queue FROM alk.job_after e WHERE e.after_id = ANY (after_ids)) e
      LEFT JOIN alk.jobs p ON p.id = e.after_id AND p.queue = e.queue;
    IF done IS NOT NULL THEN
        -- The child's UPDATE takes its row lock and rereads it: concurrent
        -- releases of one waiter by different jobs each subtract their own.
        WITH gone AS (
            DELETE FROM alk.job_after e WHERE e.after_id = ANY (done) RETURNING e.job_id, e.queue
        ), n AS (
            SELECT g.job_id, g.queue, count(*) AS k FROM gone g GROUP BY g.job_id, g.queue
        ), freed AS (
            UPDATE alk.jobs j SET after_left = j.after_left - n.k
              FROM n WHERE j.id = n.job_id AND j.queue = n.queue
            RETURNING j.queue, j.after_left, j.state
        )
        SELECT array_agg(DISTINCT f.queue) FILTER (WHERE f.after_left = 0 AND f.state = 'pending')
          INTO woken FROM freed f;
        PERFORM alk._wake(q.name) FROM unnest(woken) AS q(name);
    END IF;
    IF died IS NOT NULL THEN
        WITH RECURSIVE down(job_id, after_id, queue) AS (
            SELECT e.job_id, e.after_id, e.queue FROM alk.job_after e WHERE e.after_id = ANY (died)
            UNION
            SELECT e.job_id, e.after_id, e.queue FROM down d JOIN alk.job_after e ON e.after_id = d.job_id
        )
        UPDATE alk.jobs j
           SET state = 'dead', died_at = clock, purge_at = alk._purge_at(clock, j.dead_letter_retention_s),
               last_error = 'after job ' || d.after_id || ' died'
          FROM (SELECT DISTINCT ON (d.job_id) d.job_id, d.after_id, d.queue FROM down d
                 ORDER BY d.job_id, d.after_id) d
         WHERE j.id = d.job_id AND j.queue = d.queue AND j.state = 'pending';
    END IF;
END
$$;
COMMENT ON FUNCTION alk._after_sync(bigint[]) IS
'internal: release the waiters of gone or completed jobs, bury (transitively) the waiters of dead ones';

-- requeue_dead of awaited jobs: their dead waiters (transitively) come back
-- too, pending under requeue_dead's rule and still waiting (their rows in
-- alk.job_after stayed). Returns how many came back.
CREATE FUNCTION alk._after_revive(queue text, after_ids bigint[])
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock bigint := alk.now();
    revived bigint;
BEGIN
    WITH RECURSIVE down(job_id) AS (
        SELECT e.job_id FROM alk.job_after e WHERE e.after_id = ANY (after_ids)
        UNION
        SELECT e.job_id FROM down d JOIN alk.job_after e ON e.after_id = d.job_id
    )
    UPDATE alk.jobs j
       SET state = 'pending', run_at = clock, attempts_refunded = j.attempts,
           worker_id = NULL, claimed_at = NULL, claim_expires_at = NULL,
           last_error = NULL, died_at = NULL, purge_at = NULL,
           expires_at = alk._sat_add(clock, alk._sat_sub(j.expires_at, j.created_at)),
           -- Into the current slot, as requeue_dead's own (under its rotation lock).
           slot = (SELECT s.current_slot FROM alk.job_slots s)
      FROM down d
     WHERE j.id = d.job_id AND j.queue = _after_revive.queue AND j.state = 'dead'
       -- requeue_dead's dedup rule: a key a live job holds stays with it.
       AND (j.dedup_key IS NULL OR NOT EXISTS (
            SELECT FROM alk.jobs h WHERE h.queue = j.queue AND h.dedup_key = j.dedup_key
                                     AND h.state IN ('pending', 'processing')));
    GET DIAGNOSTICS revived = ROW_COUNT;
    RETURN revived;
END
$$;
COMMENT ON FUNCTION alk._after_revive(text, bigint[]) IS
'internal: requeue_dead of awaited jobs brings their dead waiters back, still waiting';
