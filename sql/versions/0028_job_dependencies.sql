-- pyalk 0028: job_dependencies (issue 26, point 4). alk.enqueue and alk.enqueue_batch take after bigint[]: ids
-- of jobs of the same queue that the new job waits for. It is pending but out of jobs_claim_pending (whose
-- predicate gains after_left = 0) until none of them exists any more (acked, cancelled, purged) or is completed;
-- a listed job that dies buries its waiters, transitively, with last_error 'after job <id> died', and
-- requeue_dead of it brings them back, waiting again. The edges live in alk.job_after; alk.jobs gains
-- after_left (how many listed jobs a job still waits for) and awaited (some job waits for this one: only then
-- do its ack, cancel, completion or death look in alk.job_after). queue_stats counts waiting jobs as scheduled
-- (the index jobs_after_waiting).
--
-- The claim index is rebuilt under this migration's transaction (a lock on alk.jobs for as long as the
-- build takes: seconds per million pending jobs). Signatures only gain trailing defaulted parameters, so an
-- older client runs as before and breaking_since stays.

-- hand-written: the functions that gain a trailing parameter are dropped and created anew. Keep what an
-- administrator granted on the old signatures (0026's way), re-granted on the new ones at the end; the role
-- kinds are re-granted by alk._regrant().
SELECT pg_catalog.set_config('alk.upgrade_grants', coalesce((
    SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_array(p.proname, a.grantee::regrole::text))
      FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
     WHERE p.oid IN ('alk.enqueue(text,jsonb,bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,text,jsonb)'::regprocedure,
                     'alk.enqueue_batch(text,jsonb[],bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,text[],jsonb)'::regprocedure)
       AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner), '[]')::text, false);
DROP FUNCTION alk._enqueue_one(text,jsonb,bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,text,jsonb);
DROP FUNCTION alk.enqueue(text,jsonb,bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,text,jsonb);
DROP FUNCTION alk.enqueue_batch(text,jsonb[],bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,text[],jsonb);

-- hand-written: the columns, the claim index without waiting jobs, the waiting index, the edge table.
ALTER TABLE alk.jobs ADD COLUMN after_left bigint NOT NULL DEFAULT 0, ADD COLUMN awaited boolean NOT NULL DEFAULT false;
DROP INDEX alk.jobs_claim_pending;
CREATE INDEX jobs_claim_pending ON alk.jobs (queue, priority DESC, run_at, id)
    WHERE state = 'pending' AND after_left = 0;
CREATE INDEX jobs_after_waiting ON alk.jobs (queue, run_at) WHERE state = 'pending' AND after_left > 0;
CREATE TABLE alk.job_after (
    after_id bigint NOT NULL,
    job_id bigint NOT NULL,
    queue text NOT NULL,
    CONSTRAINT job_after_pkey PRIMARY KEY (after_id, job_id)
);
COMMENT ON TABLE alk.job_after IS 'Which job waits for which (alk.enqueue''s after). Private: use alk.enqueue.';

-- alk._after_check(text,bigint[]): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._after_check(queue text, after bigint[])
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

-- alk._after_link(text,bigint[],bigint[]): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._after_link(queue text, job_ids bigint[], after bigint[])
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

-- alk._after_revive(text,bigint[]): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._after_revive(queue text, after_ids bigint[])
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
           expires_at = alk._sat_add(clock, alk._sat_sub(j.expires_at, j.created_at))
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

-- alk._after_sync(bigint[]): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._after_sync(after_ids bigint[])
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
BEGIN
    -- An extent: n <= 0 (or NULL) claims nothing.
    IF wanted IS NULL OR wanted <= 0 THEN
        RETURN;
    END IF;
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
                   c.attempts_refunded, c.headers, c.result, c.completed_at
              FROM moved c
             ORDER BY c.priority DESC, c.run_at, c.id;
            GET DIAGNOSTICS claimed = ROW_COUNT;
            wanted := wanted - claimed;
        END IF;
        -- Only burying leaves room to look again; otherwise the queue is empty
        -- of claimable rows (or we have enough).
        EXIT WHEN dead IS NULL OR wanted <= 0;
    END LOOP;
END
$$;
COMMENT ON FUNCTION alk._claim(text, text, bigint) IS 'internal: the claim rule for an already validated queue name';

-- alk._complete(text,text,bigint,bigint[],bigint[],text[],jsonb[]): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._complete(queue text, wid text, clock bigint, job_ids bigint[], attempts bigint[],
                              outcomes text[], results jsonb[])
RETURNS bigint[]
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
-- The batch meets its rows in a hash join, as in alk._settle.
SET enable_nestloop = off
-- One generic plan: planned per call (a custom plan, which the plan cache
-- kept choosing), 500 single acks cost 385-510 ms against 43-60 ms, server
-- side.
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    completed bigint[];
    awaited bigint[];
BEGIN
    WITH first AS (
        SELECT DISTINCT ON (i.id) i.id, i.attempt, i.outcome, i.result
          FROM unnest(_complete.job_ids, _complete.attempts, _complete.outcomes, _complete.results)
               WITH ORDINALITY AS i(id, attempt, outcome, result, ord)
         ORDER BY i.id, i.ord
    ), kept AS (
        -- Worker, claim and lease stay, as on a dead row: who ran it, when.
        UPDATE alk.jobs j
           SET state = 'completed', completed_at = _complete.clock, result = f.result,
               purge_at = alk._purge_at(_complete.clock, s.completed_s)
          FROM first f, alk.queue_settings s
         WHERE coalesce(f.outcome, 'ack') = 'ack' AND j.id = ANY (_complete.job_ids) AND j.id = f.id
           AND (_complete.queue IS NULL OR j.queue = _complete.queue) AND s.queue = j.queue
           AND alk._holds(j, _complete.wid, f.attempt, _complete.clock)
        RETURNING j.id, j.queue, j.awaited
    ), counted AS (
        INSERT INTO alk.queue_counts AS c (queue, minute, backend, acked)
        SELECT k.queue, _complete.clock / 60 * 60, pg_catalog.pg_backend_pid(), count(*) FROM kept k GROUP BY k.queue
        ON CONFLICT ON CONSTRAINT queue_counts_pkey DO UPDATE SET acked = c.acked + excluded.acked
        RETURNING c.queue
    )
    SELECT array_agg(k.id), array_agg(k.id) FILTER (WHERE k.awaited) INTO completed, awaited FROM kept k;
    -- A completed job is done for the jobs enqueued after it (35_after.sql).
    IF awaited IS NOT NULL THEN
        PERFORM alk._after_sync(awaited);
    END IF;
    RETURN completed;
END
$$;
COMMENT ON FUNCTION alk._complete(text, text, bigint, bigint[], bigint[], text[], jsonb[]) IS
'internal: acks of held jobs whose queue keeps completed jobs: completed with their results, counted; the ids';

-- alk._enqueue_one(text,jsonb,bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,text,jsonb,bigint[]): changed or new in the current files
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
    IF p_after IS NOT NULL THEN
        PERFORM alk._after_check(p_queue, p_after);
    END IF;
    IF p_dedup_key IS NULL THEN
        INSERT INTO alk.jobs (queue, payload, priority, run_at, max_attempts, created_at, expires_at,
                              visibility_timeout_s, backoff_base_s, dead_letter_retention_s, headers)
        VALUES (p_queue, p_payload, p_priority,
                CASE WHEN p_delay IS NOT NULL THEN alk._sat_add(p_clock, p_delay)
                     WHEN p_run_at IS NOT NULL THEN p_run_at ELSE p_clock END,
                p_max_attempts, p_clock, alk._sat_add(p_clock, p_expires),
                p_visibility_timeout_s, p_backoff_base_s, p_dead_letter_retention_s, p_headers)
        RETURNING alk.jobs.id INTO v_id;
    ELSE
        PERFORM alk._name_ok('dedup_key', p_dedup_key, true);
        LOOP
            -- The unique index decides: a concurrent enqueue of the same key
            -- waits for ours (or we for it) and then does nothing.
            INSERT INTO alk.jobs (queue, payload, priority, run_at, max_attempts, created_at, expires_at,
                                  visibility_timeout_s, backoff_base_s, dead_letter_retention_s, dedup_key,
                                  headers)
            VALUES (p_queue, p_payload, p_priority,
                    CASE WHEN p_delay IS NOT NULL THEN alk._sat_add(p_clock, p_delay)
                         WHEN p_run_at IS NOT NULL THEN p_run_at ELSE p_clock END,
                    p_max_attempts, p_clock, alk._sat_add(p_clock, p_expires),
                    p_visibility_timeout_s, p_backoff_base_s, p_dead_letter_retention_s, p_dedup_key, p_headers)
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
COMMENT ON FUNCTION alk._enqueue_one(text, jsonb, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, text, jsonb, bigint[]) IS
'internal: insert one job with resolved stamps (or return the live holder of its dedup key) and wake idle workers';

-- alk._estimate_jobs(text,text,bigint): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._estimate_jobs(queue text, kind text, clock bigint)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    plan json;
BEGIN
    -- The planner's row estimate for one queue's entries of one kind: what
    -- its statistics (ANALYZE, autovacuum) and the table's current size
    -- say, read without visiting the entries. The query texts are fixed;
    -- the queue and the clock are bound as parameters.
    CASE kind
    WHEN 'ready' THEN
        EXECUTE 'EXPLAIN (FORMAT JSON) SELECT FROM alk.jobs j '
                'WHERE j.queue = $1 AND j.state = ''pending'' AND j.after_left = 0 AND j.run_at <= $2'
           INTO plan USING queue, clock;
    WHEN 'scheduled' THEN
        EXECUTE 'EXPLAIN (FORMAT JSON) SELECT FROM alk.jobs j '
                'WHERE j.queue = $1 AND j.state = ''pending'' AND j.after_left = 0 AND j.run_at > $2'
           INTO plan USING queue, clock;
    WHEN 'waiting' THEN
        EXECUTE 'EXPLAIN (FORMAT JSON) SELECT FROM alk.jobs j '
                'WHERE j.queue = $1 AND j.state = ''pending'' AND j.after_left > 0' INTO plan USING queue;
    WHEN 'processing' THEN
        EXECUTE 'EXPLAIN (FORMAT JSON) SELECT FROM alk.jobs j '
                'WHERE j.queue = $1 AND j.state = ''processing''' INTO plan USING queue;
    WHEN 'lapsed' THEN
        EXECUTE 'EXPLAIN (FORMAT JSON) SELECT FROM alk.jobs j '
                'WHERE j.queue = $1 AND j.state = ''processing'' AND j.claim_expires_at < $2'
           INTO plan USING queue, clock;
    WHEN 'dead' THEN
        EXECUTE 'EXPLAIN (FORMAT JSON) SELECT FROM alk.jobs j '
                'WHERE j.queue = $1 AND j.state = ''dead''' INTO plan USING queue;
    WHEN 'completed' THEN
        EXECUTE 'EXPLAIN (FORMAT JSON) SELECT FROM alk.jobs j '
                'WHERE j.queue = $1 AND j.state = ''completed''' INTO plan USING queue;
    END CASE;
    RETURN round((plan -> 0 -> 'Plan' ->> 'Plan Rows')::numeric)::bigint;
END
$$;
COMMENT ON FUNCTION alk._estimate_jobs(text, text, bigint) IS
'internal: the planner''s estimate of how many of a queue''s jobs are ready, scheduled, waiting (on after jobs), '
'processing, lapsed, dead or completed '
'(alk.queue_stats past its exact_limit)';

-- alk._settle(text,text,bigint[],bigint[],text[],text[],bigint[],jsonb[]): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._settle(queue text, worker_id text, job_ids bigint[], attempts bigint[], outcomes text[],
                            errs text[], delays bigint[], results jsonb[] DEFAULT NULL)
RETURNS TABLE (job_id bigint, attempt bigint, state text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
-- No nested loop between the batch and its rows: planned on a table never
-- analyzed, a plan (generic or custom) joined them that way, the whole
-- id = ANY (job_ids) list once per input row, quadratic in the batch (57-86
-- against 6-9 ms for 500 acks until autovacuum came). The rows come from
-- jobs_pkey by id = ANY (job_ids) and meet the batch in a hash join.
SET enable_nestloop = off
AS $$
#variable_conflict use_column
DECLARE
    clock bigint := alk.now();
    wid text := alk._name_ok('worker_id', _settle.worker_id, true);
    k bigint := coalesce(cardinality(_settle.job_ids), 0);
    bad bigint;
    all_ack boolean := true;
    this_minute bigint := clock / 60 * 60;
    me integer := pg_catalog.pg_backend_pid();
    completed bigint[];
BEGIN
    IF (_settle.attempts IS NOT NULL AND cardinality(_settle.attempts) <> k)
       OR (_settle.outcomes IS NOT NULL AND cardinality(_settle.outcomes) <> k)
       OR (_settle.errs IS NOT NULL AND cardinality(_settle.errs) <> k)
       OR (_settle.delays IS NOT NULL AND cardinality(_settle.delays) <> k)
       OR (_settle.results IS NOT NULL AND cardinality(_settle.results) <> k) THEN
        PERFORM alk._raise('LK002', 'attempts, outcomes, errs, delays and results must each be NULL or have one '
            || 'entry per job id: got ' || k || ' job_ids, ' || coalesce(cardinality(_settle.attempts)::text, 'NULL')
            || ' attempts, ' || coalesce(cardinality(_settle.outcomes)::text, 'NULL') || ' outcomes, '
            || coalesce(cardinality(_settle.errs)::text, 'NULL') || ' errs, '
            || coalesce(cardinality(_settle.delays)::text, 'NULL') || ' delays and '
            || coalesce(cardinality(_settle.results)::text, 'NULL') || ' results');
    END IF;
    -- NULL outcomes (all ack, a batching worker's usual call): nothing to
    -- check, and no statement spent on it. Outcomes that are all 'ack' take
    -- the same all-ack statement below (an ack ignores its err and delay):
    -- measured at 250 jobs, 14 against 5 us per job, server side.
    IF _settle.outcomes IS NOT NULL THEN
        SELECT min(o.ord) FILTER (WHERE o.outcome IS NULL OR o.outcome NOT IN ('ack', 'retry', 'fail')),
               coalesce(bool_and(o.outcome = 'ack'), true)
          INTO bad, all_ack
          FROM unnest(_settle.outcomes) WITH ORDINALITY AS o(outcome, ord);
    END IF;
    IF bad IS NOT NULL THEN
        PERFORM alk._raise('LK002', 'outcome ' || bad || ' must be ''ack'', ''retry'' or ''fail'', got '
            || alk._show(_settle.outcomes[bad]));
    END IF;
    IF k = 0 THEN
        RETURN;
    END IF;
    -- Acks on queues that keep completed jobs, first; the statements below
    -- then delete the acked jobs they left.
    IF EXISTS (SELECT FROM alk.queue_settings s WHERE _settle.queue IS NULL OR s.queue = _settle.queue) THEN
        completed := alk._complete(_settle.queue, wid, clock, _settle.job_ids, _settle.attempts, _settle.outcomes,
                                   _settle.results);
    END IF;
    IF all_ack THEN
        -- All ack (a batching worker's usual call): the ack branch of the
        -- statement below on its own, without the retry/fail UPDATE that a
        -- generic plan would set up on every call for no rows.
        RETURN QUERY
        WITH input AS (
            SELECT i.id, i.attempt, i.ord
              FROM unnest(_settle.job_ids, _settle.attempts) WITH ORDINALITY AS i(id, attempt, ord)
        ), first AS (
            SELECT DISTINCT ON (i.id) i.* FROM input i ORDER BY i.id, i.ord
        ), acked AS (
            -- id = ANY (job_ids): the plan probes jobs_pkey per id rather than
            -- walking every row the worker holds (a generic plan knows no
            -- batch size; measured 22-137 ms a call at 500 held).
            DELETE FROM alk.jobs j USING first f
             WHERE j.id = ANY (_settle.job_ids) AND j.id = f.id AND (_settle.queue IS NULL OR j.queue = _settle.queue)
               AND alk._holds(j, wid, f.attempt, clock)
            RETURNING j.id, j.queue
        ), counted AS (
            INSERT INTO alk.queue_counts AS c (queue, minute, backend, acked)
            SELECT a.queue, this_minute, me, count(*) FROM acked a GROUP BY a.queue
            ON CONFLICT ON CONSTRAINT queue_counts_pkey DO UPDATE SET acked = c.acked + excluded.acked
            RETURNING c.queue
        )
        SELECT i.id, i.attempt, CASE WHEN a.id IS NOT NULL OR f.id = ANY (completed) THEN 'acked' END
          FROM input i
          LEFT JOIN first f ON f.ord = i.ord
          LEFT JOIN acked a ON a.id = f.id
         ORDER BY i.ord;
        -- Jobs enqueued after these (35_after.sql): RETURN QUERY keeps no
        -- awaited flag, so one probe of alk.job_after, empty unless
        -- dependencies are used, in a later statement than the settlement.
        IF EXISTS (SELECT FROM alk.job_after e WHERE e.after_id = ANY (_settle.job_ids)) THEN
            PERFORM alk._after_sync(_settle.job_ids);
        END IF;
        RETURN;
    END IF;
    RETURN QUERY
    WITH input AS (
        SELECT i.id, i.attempt, coalesce(i.outcome, 'ack') AS outcome, i.err, i.delay, i.ord
          FROM unnest(_settle.job_ids, _settle.attempts, _settle.outcomes, _settle.errs, _settle.delays)
               WITH ORDINALITY AS i(id, attempt, outcome, err, delay, ord)
    ), first AS (
        SELECT DISTINCT ON (i.id) i.* FROM input i ORDER BY i.id, i.ord
    ), acked AS (
        DELETE FROM alk.jobs j USING first f
         WHERE f.outcome = 'ack' AND j.id = ANY (_settle.job_ids) AND j.id = f.id AND (_settle.queue IS NULL OR j.queue = _settle.queue)
           AND alk._holds(j, wid, f.attempt, clock)
        RETURNING j.id, j.queue, 'acked'::text AS state
    ), moved AS (
        -- retry: pending again, no worker, ready at now + delay (NULL: the
        -- row's curve, base * 2^(spent - 1)), unless its attempts are spent:
        -- then, like fail, dead with the error.
        UPDATE alk.jobs j
           SET state = CASE WHEN f.outcome = 'fail' OR j.attempts - j.attempts_refunded >= j.max_attempts
                            THEN 'dead' ELSE 'pending' END,
               run_at = CASE WHEN f.outcome = 'fail' OR j.attempts - j.attempts_refunded >= j.max_attempts
                             THEN j.run_at
                             ELSE alk._sat_add(clock, coalesce(f.delay, alk._sat_mul_pow2(j.backoff_base_s,
                                  j.attempts - j.attempts_refunded - 1))) END,
               worker_id = CASE WHEN f.outcome = 'fail' OR j.attempts - j.attempts_refunded >= j.max_attempts
                                THEN j.worker_id END,
               claimed_at = CASE WHEN f.outcome = 'fail' OR j.attempts - j.attempts_refunded >= j.max_attempts
                                 THEN j.claimed_at END,
               claim_expires_at = CASE WHEN f.outcome = 'fail' OR j.attempts - j.attempts_refunded >= j.max_attempts
                                       THEN j.claim_expires_at END,
               last_error = CASE WHEN f.outcome = 'fail' THEN coalesce(f.err, 'failed')
                                 WHEN j.attempts - j.attempts_refunded >= j.max_attempts
                                 THEN coalesce(f.err, 'max attempts exceeded') END,
               died_at = CASE WHEN f.outcome = 'fail' OR j.attempts - j.attempts_refunded >= j.max_attempts
                              THEN clock END,
               purge_at = CASE WHEN f.outcome = 'fail' OR j.attempts - j.attempts_refunded >= j.max_attempts
                               THEN alk._purge_at(clock, j.dead_letter_retention_s) END
          FROM first f
         WHERE f.outcome <> 'ack' AND j.id = ANY (_settle.job_ids) AND j.id = f.id AND (_settle.queue IS NULL OR j.queue = _settle.queue)
           AND alk._holds(j, wid, f.attempt, clock)
        RETURNING j.id, j.queue, j.state
    ), done AS (
        SELECT a.id, a.queue, a.state FROM acked a UNION ALL SELECT m.id, m.queue, m.state FROM moved m
    ), counted AS (
        -- retried: pending again; dead: failed, or retried with attempts spent.
        INSERT INTO alk.queue_counts AS c (queue, minute, backend, acked, retried, dead)
        SELECT d.queue, this_minute, me, count(*) FILTER (WHERE d.state = 'acked'),
               count(*) FILTER (WHERE d.state = 'pending'), count(*) FILTER (WHERE d.state = 'dead')
          FROM done d GROUP BY d.queue
        ON CONFLICT ON CONSTRAINT queue_counts_pkey DO UPDATE
           SET acked = c.acked + excluded.acked, retried = c.retried + excluded.retried, dead = c.dead + excluded.dead
        RETURNING c.queue
    )
    SELECT i.id, i.attempt, coalesce(d.state, CASE WHEN f.id = ANY (completed) THEN 'acked' END)
      FROM input i
      LEFT JOIN first f ON f.ord = i.ord
      LEFT JOIN done d ON d.id = f.id
     ORDER BY i.ord;
    -- Acked or dead: the jobs enqueued after them are released or buried.
    IF EXISTS (SELECT FROM alk.job_after e WHERE e.after_id = ANY (_settle.job_ids)) THEN
        PERFORM alk._after_sync(_settle.job_ids);
    END IF;
END
$$;
COMMENT ON FUNCTION alk._settle(text, text, bigint[], bigint[], text[], text[], bigint[], jsonb[]) IS
'internal: the settlement rule (ack, retry, fail) for a batch, counted per queue for alk.queue_throughput; '
'queue NULL: any queue; results: the acks'' results, kept on queues that keep completed jobs';

-- alk._sweep_expired(text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._sweep_expired(queue text)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock bigint := alk.now();
    expired bigint;
    purged bigint;
    completed bigint;
    awaited bigint[];
    gone bigint[];
BEGIN
    -- Waiting rows past expiry, and processing rows past expiry whose lease
    -- lapsed; a row with a valid lease is left to its owner.
    WITH swept AS (
        UPDATE alk.jobs j
           SET state = 'dead', last_error = 'expired', died_at = clock,
               purge_at = alk._purge_at(clock, j.dead_letter_retention_s)
         WHERE j.queue = _sweep_expired.queue
           AND j.expires_at IS NOT NULL AND j.expires_at <= clock
           AND (j.state = 'pending' OR (j.state = 'processing' AND j.claim_expires_at < clock))
        RETURNING j.id, j.awaited
    )
    SELECT count(*), array_agg(w.id) FILTER (WHERE w.awaited) INTO expired, awaited FROM swept w;
    -- Dead rows past their retention.
    WITH purged_rows AS (
        DELETE FROM alk.jobs j
         WHERE j.queue = _sweep_expired.queue
           AND j.state = 'dead'
           AND j.purge_at <= clock
        RETURNING j.id, j.awaited
    )
    SELECT count(*), array_agg(d.id) FILTER (WHERE d.awaited) INTO purged, gone FROM purged_rows d;
    -- Expired: the jobs enqueued after them die too; purged: they no longer
    -- wait for them (35_after.sql). One call: it reads what each became.
    IF awaited IS NOT NULL OR gone IS NOT NULL THEN
        PERFORM alk._after_sync(coalesce(awaited, '{}') || coalesce(gone, '{}'));
    END IF;
    -- Completed rows past theirs (jobs_completed, as jobs_dead above).
    DELETE FROM alk.jobs j
     WHERE j.queue = _sweep_expired.queue
       AND j.state = 'completed'
       AND j.purge_at <= clock;
    GET DIAGNOSTICS completed = ROW_COUNT;
    RETURN expired + purged + completed;
END
$$;
COMMENT ON FUNCTION alk._sweep_expired(text) IS 'internal: sweep_expired for an already validated queue name';

-- alk.ack(bigint,text,bigint,text,jsonb): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.ack(job_id bigint, worker_id text, attempt bigint DEFAULT NULL, queue text DEFAULT NULL,
                        result jsonb DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    clock bigint := alk.now();
    wid text := alk._name_ok('worker_id', ack.worker_id, true);
    this_minute bigint := clock / 60 * 60;
    done boolean;
    awaited boolean;
BEGIN
    IF EXISTS (SELECT FROM alk.queue_settings s WHERE ack.queue IS NULL OR s.queue = ack.queue) THEN
        IF alk._complete(ack.queue, wid, clock, ARRAY[ack.job_id], ARRAY[ack.attempt], NULL, ARRAY[ack.result])
           IS NOT NULL THEN
            RETURN true;
        END IF;
    END IF;
    WITH acked AS (
        DELETE FROM alk.jobs j
         WHERE j.id = ack.job_id AND (ack.queue IS NULL OR j.queue = ack.queue)
           AND alk._holds(j, wid, ack.attempt, clock)
        RETURNING j.queue, j.awaited
    ), counted AS (
        INSERT INTO alk.queue_counts AS c (queue, minute, backend, acked)
        SELECT a.queue, this_minute, pg_catalog.pg_backend_pid(), 1 FROM acked a
        ON CONFLICT ON CONSTRAINT queue_counts_pkey DO UPDATE SET acked = c.acked + excluded.acked
        RETURNING c.queue
    )
    SELECT true, (SELECT a.awaited FROM acked a) INTO done, awaited FROM counted;
    -- Jobs enqueued after this one may run now (35_after.sql).
    IF awaited THEN
        PERFORM alk._after_sync(ARRAY[ack.job_id]);
    END IF;
    RETURN done IS NOT NULL;
END
$$;
COMMENT ON FUNCTION alk.ack(bigint, text, bigint, text, jsonb) IS
'Acknowledge a claimed job: it is deleted, or, when its queue keeps completed jobs (alk.set_queue_retention), kept '
'as completed with completed_at = now and result (any JSON value; NULL: none) until its retention ends. False, and '
'nothing changes, unless the job is processing, held by worker_id under claim attempt (the fencing token the claim '
'returned; NULL skips that check) and its lease has not lapsed (claim_expires_at >= now). worker_id follows the name '
'rule (LK001). queue is optional routing for sharded deployments. '
'Example: SELECT alk.ack(job_id => 42, worker_id => ''worker-1'', attempt => 1, result => ''{"sent": true}'');';

-- alk.ack_batch(bigint[],text,bigint[],text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.ack_batch(job_ids bigint[], worker_id text, attempts bigint[] DEFAULT NULL, queue text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- No nested loop, as alk._settle (the same statement shape).
SET enable_nestloop = off
AS $$
#variable_conflict use_column
DECLARE
    clock bigint := alk.now();
    wid text := alk._name_ok('worker_id', ack_batch.worker_id, true);
    this_minute bigint := clock / 60 * 60;
    n_acked bigint;
    n_kept bigint := 0;
    awaited bigint[];
BEGIN
    IF ack_batch.attempts IS NOT NULL AND cardinality(ack_batch.attempts) <> coalesce(cardinality(ack_batch.job_ids), 0) THEN
        -- _settle raises the LK002 that names the arrays.
        PERFORM alk._settle(ack_batch.queue, ack_batch.worker_id, ack_batch.job_ids, ack_batch.attempts, NULL, NULL, NULL);
    END IF;
    IF EXISTS (SELECT FROM alk.queue_settings s WHERE ack_batch.queue IS NULL OR s.queue = ack_batch.queue) THEN
        n_kept := coalesce(cardinality(alk._complete(ack_batch.queue, wid, clock, ack_batch.job_ids,
                                                      ack_batch.attempts, NULL, NULL)), 0);
    END IF;
    WITH first AS (
        SELECT DISTINCT ON (i.id) i.id, i.attempt
          FROM unnest(ack_batch.job_ids, ack_batch.attempts) WITH ORDINALITY AS i(id, attempt, ord)
         ORDER BY i.id, i.ord
    ), acked AS (
        -- id = ANY (job_ids): jobs_pkey probes, as in _settle.
        DELETE FROM alk.jobs j USING first f
         WHERE j.id = ANY (ack_batch.job_ids) AND j.id = f.id
           AND (ack_batch.queue IS NULL OR j.queue = ack_batch.queue)
           AND alk._holds(j, wid, f.attempt, clock)
        RETURNING j.id, j.queue, j.awaited
    ), counted AS (
        INSERT INTO alk.queue_counts AS c (queue, minute, backend, acked)
        SELECT a.queue, this_minute, pg_catalog.pg_backend_pid(), count(*) FROM acked a GROUP BY a.queue
        ON CONFLICT ON CONSTRAINT queue_counts_pkey DO UPDATE SET acked = c.acked + excluded.acked
        RETURNING c.queue
    )
    SELECT count(*), array_agg(a.id) FILTER (WHERE a.awaited) INTO n_acked, awaited FROM acked a;
    -- Jobs enqueued after these may run now (35_after.sql).
    IF awaited IS NOT NULL THEN
        PERFORM alk._after_sync(awaited);
    END IF;
    RETURN n_acked + n_kept;
END
$$;
COMMENT ON FUNCTION alk.ack_batch(bigint[], text, bigint[], text) IS
'Acknowledge several claimed jobs in one call; returns how many were validly held (and are now deleted, or kept as '
'completed without a result when their queue keeps completed jobs). '
'attempts, when given, holds each job''s fencing token in the same order. '
'Example: SELECT alk.ack_batch(ARRAY[41, 42], ''worker-1'', ARRAY[1, 1]);';

-- alk.cancel(text,bigint): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.cancel(queue text, job_id bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    was text;
    holder text;
    awaited boolean;
BEGIN
    PERFORM alk._check_name('queue', cancel.queue);
    DELETE FROM alk.jobs j WHERE j.queue = cancel.queue AND j.id = job_id AND j.state IN ('pending', 'processing')
    RETURNING j.state, j.worker_id, j.awaited INTO was, holder, awaited;
    IF was IS NULL THEN
        RETURN false;
    END IF;
    -- A cancelled job no longer exists: the jobs enqueued after it are
    -- released, as by an ack (docs/queue.md "Dependencies").
    IF awaited THEN
        PERFORM alk._after_sync(ARRAY[job_id]);
    END IF;
    -- A processing job's holder learns at commit on its control channel
    -- (sql/workers.sql), so its handler stops instead of running to a refused
    -- outcome. Sent whatever the lease: a lapsed holder may still be running it.
    IF was = 'processing' AND holder IS NOT NULL THEN
        PERFORM pg_catalog.pg_notify(alk._worker_channel(holder), 'cancel ' || job_id);
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION alk.cancel(text, bigint) IS
'Delete a pending or processing job whatever its lease; true if a row went. Dead and completed jobs stay for '
'inspection (false). A processing job''s holder is told at commit: ''cancel <job_id>'' on its control channel '
'(alk.worker_register), so its handler is cancelled; its later ack, nack or settle is refused as for any lost job. '
'Jobs enqueued after it (alk.enqueue''s after) no longer wait for it, as after an ack. '
'Example: SELECT alk.cancel(''emails'', 42);';

-- alk.enqueue(text,jsonb,bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,text,jsonb,bigint[]): changed or new in the current files
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
    after bigint[] DEFAULT NULL
)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT alk._enqueue_one(alk._name_ok('queue', $1, false), $2, alk.now(), $3, $4, coalesce($5, 0),
                            coalesce($6, 3), $7, coalesce($8, 300), coalesce($9, 5), $10, $11, $12, $13)
$$;
COMMENT ON FUNCTION alk.enqueue(text, jsonb, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, text, jsonb, bigint[]) IS
'Enqueue one job; returns its id. Ready time: delay (seconds from now) wins over run_at (absolute unix seconds); '
'neither means now. expires is a TTL in seconds from now. Stamps default to 300 s visibility, 3 attempts, 5 s backoff base, '
'dead rows kept forever. dedup_key: while a live (pending or processing) job of this queue holds the key, nothing is '
'written and that job''s id is returned; NULL: no dedup. headers: a JSON object that travels with the job (trace '
'context, correlation ids; get_job and claim return it), or NULL; anything else is LK002. '
'after: ids of jobs of this queue; the job stays pending but is not claimed until none of them exists any more '
'(acked, cancelled or purged) or is completed; ids that no longer exist count as done; an id of another queue or a '
'NULL entry is LK002. When a listed job dies the job dies too (last_error ''after job <id> died''), and '
'requeue_dead of that job brings it back, waiting again. A dedup hit ignores after. '
'Example: SELECT alk.enqueue(queue => ''emails'', payload => ''{"to": 1}'', delay => 30, dedup_key => ''welcome:1''); '
'SELECT alk.enqueue(''emails'', ''{"step": 2}'', after => ARRAY[41]);';

-- alk.enqueue_batch(text,jsonb[],bigint,bigint,bigint,bigint,bigint,bigint,bigint,bigint,text[],jsonb,bigint[]): changed or new in the current files
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
            enqueue_batch.dead_letter_retention_s, 300, 3, 5, enqueue_batch.headers));
        PERFORM alk._after_link(q, ids, enqueue_batch.after);
        RETURN QUERY SELECT * FROM unnest(ids);
        RETURN;
    END IF;
    IF dedup_keys IS NULL THEN
        RETURN QUERY SELECT * FROM alk._enqueue(q, payloads, clock,
            delay, enqueue_batch.run_at, enqueue_batch.priority, enqueue_batch.max_attempts,
            expires, enqueue_batch.visibility_timeout_s, enqueue_batch.backoff_base_s,
            enqueue_batch.dead_letter_retention_s, 300, 3, 5, enqueue_batch.headers);
        RETURN;
    END IF;
    PERFORM alk._check_payloads(payloads);
    IF cardinality(dedup_keys) <> cardinality(payloads) THEN
        PERFORM alk._raise('LK002', 'dedup_keys must have one entry per payload: got ' || cardinality(payloads)
            || ' payloads and ' || cardinality(dedup_keys) || ' dedup_keys');
    END IF;
    -- One at a time, in input order: a key repeated within the batch is
    -- held by its first occurrence, whose id the later ones return.
    FOR i IN 1 .. cardinality(payloads) LOOP
        RETURN NEXT alk._enqueue_one(q, payloads[i], clock, delay, enqueue_batch.run_at,
            coalesce(enqueue_batch.priority, 0), coalesce(enqueue_batch.max_attempts, 3), expires,
            coalesce(enqueue_batch.visibility_timeout_s, 300), coalesce(enqueue_batch.backoff_base_s, 5),
            enqueue_batch.dead_letter_retention_s, dedup_keys[i], enqueue_batch.headers, enqueue_batch.after);
    END LOOP;
END
$$;
COMMENT ON FUNCTION alk.enqueue_batch(text, jsonb[], bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, text[], jsonb, bigint[]) IS
'Enqueue several jobs in one call with the same options; returns their ids in input order. dedup_keys, when given, '
'holds one key (or NULL) per payload, with alk.enqueue''s rule: a key held by a live job, or by an earlier payload of '
'the same batch, writes nothing and returns the holder''s id. headers, like every other option, is one value for '
'the whole batch (a JSON object or NULL, else LK002): the trace context of the call that enqueued it. after too is '
'one list for the whole batch: every job of it waits for all of them (alk.enqueue''s rule). '
'Example: SELECT * FROM alk.enqueue_batch(''emails'', ARRAY[''{"to": 1}'', ''{"to": 2}'']::jsonb[], priority => 5);';

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
    -- The first lease to lapse (one probe of jobs_claim_lapsed). A lease is
    -- claimable once claim_expires_at < now, i.e. from the next second on.
    SELECT min(j.claim_expires_at) INTO first_lease_end
      FROM alk.jobs j WHERE j.queue = next_claim_at.queue AND j.state = 'processing';
    next_at := least(first_run_at, alk._sat_add(first_lease_end, 1));
    IF next_at IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN greatest(next_at, clock);
END
$$;
COMMENT ON FUNCTION alk.next_claim_at(text) IS
'When alk.claim on this queue can next return a job: now when one is due (or a lease has lapsed), else the earliest '
'run_at of a pending job or the second after the earliest lease ends, whichever comes first; NULL when the queue has '
'no pending or processing job, or is paused. A worker sleeps until then (or until a NOTIFY on alk.queue_channel). '
'Due jobs that claim will bury (out of attempts, expired) count as claimable. '
'Example: SELECT alk.next_claim_at(''emails'') - alk.now() AS seconds_to_wait;';

-- alk.queue_stats(text,bigint): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.queue_stats(queue text DEFAULT NULL, exact_limit bigint DEFAULT NULL)
RETURNS SETOF alk.queue_stat
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Planned per call: a generic plan keeps every LIMIT node and CASE that a
-- NULL exact_limit folds away (exact counts: 1.10x the time of 0017's, 1.06x
-- with this), and the plan costs less than a millisecond.
SET plan_cache_mode = force_custom_plan
AS $$
#variable_conflict use_column
DECLARE
    clock bigint := alk.now();
    only_queue text := queue_stats.queue;
    -- Held one below the largest bigint: the counts read cap + 1 entries.
    cap bigint := least(queue_stats.exact_limit, 9223372036854775806);
BEGIN
    IF only_queue IS NOT NULL THEN
        -- Read-only, so reserved names (outbox backing queues) are accepted.
        PERFORM alk._check_name('queue', only_queue, true);
    END IF;
    IF cap < 0 THEN
        PERFORM alk._raise('LK002', 'exact_limit must be >= 0 or NULL (every count exact), got ' || cap);
    END IF;
    -- Every row is in exactly one of the five partial indexes (pending,
    -- waiting on after jobs, processing, dead, completed), and each leads with
    -- the queue: the queue names come from a loose scan of the five (five
    -- probes per queue, whatever
    -- the row count), and each count is an index-only scan of one queue's
    -- entries in one of them. Nothing reads the heap but for pages the
    -- visibility map does not yet know to be all-visible.
    -- An exact count visits every entry once, so its cost is per entry
    -- (docs/dashboard.md "Performance"): with exact_limit each count stops
    -- after exact_limit + 1 entries and, past it, is the planner's estimate
    -- instead (at least exact_limit + 1, so a count above exact_limit is
    -- always an estimate, and estimated says the row holds one). The ages
    -- come from a loose scan over the pending index's priorities (per
    -- priority, its first entry at or before the clock and its first after
    -- it), so they stay exact at any size.
    RETURN QUERY
    WITH RECURSIVE names(name) AS (
        SELECT coalesce(only_queue, '')
        UNION ALL
        SELECT least(
            (SELECT j.queue FROM alk.jobs j WHERE j.state = 'pending' AND j.after_left = 0 AND j.queue > n.name
              ORDER BY j.queue LIMIT 1),
            (SELECT j.queue FROM alk.jobs j WHERE j.state = 'pending' AND j.after_left > 0 AND j.queue > n.name
              ORDER BY j.queue LIMIT 1),
            (SELECT j.queue FROM alk.jobs j WHERE j.state = 'processing' AND j.queue > n.name
              ORDER BY j.queue LIMIT 1),
            (SELECT j.queue FROM alk.jobs j WHERE j.state = 'dead' AND j.queue > n.name ORDER BY j.queue LIMIT 1),
            (SELECT j.queue FROM alk.jobs j WHERE j.state = 'completed' AND j.queue > n.name
              ORDER BY j.queue LIMIT 1))
          FROM names n WHERE n.name IS NOT NULL AND only_queue IS NULL
    ),
    -- MATERIALIZED: inlined, each count would run once per mention below.
    capped AS MATERIALIZED (
        SELECT n.name,
               (SELECT count(*) FROM (SELECT FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'pending'
                                         AND j.after_left = 0 AND j.run_at <= clock LIMIT cap + 1) e) AS ready,
               (SELECT count(*) FROM (SELECT FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'pending'
                                         AND j.after_left = 0 AND j.run_at > clock LIMIT cap + 1) e) AS scheduled,
               (SELECT count(*) FROM (SELECT FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'pending'
                                         AND j.after_left > 0 LIMIT cap + 1) e) AS waiting,
               (SELECT count(*) FROM (SELECT FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'processing'
                                       LIMIT cap + 1) e) AS processing,
               (SELECT count(*) FROM (SELECT FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'processing'
                                         AND j.claim_expires_at < clock LIMIT cap + 1) e) AS lapsed,
               (SELECT count(*) FROM (SELECT FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'dead'
                                       LIMIT cap + 1) e) AS dead,
               (SELECT count(*) FROM (SELECT FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'completed'
                                       LIMIT cap + 1) e) AS completed
          FROM names n
         WHERE n.name IS NOT NULL AND n.name <> '' AND (NOT alk._limits_active() OR alk._in_scope(n.name))
    ),
    counted AS MATERIALIZED (
        SELECT c.name,
               CASE WHEN c.ready > cap THEN greatest(alk._estimate_jobs(c.name, 'ready', clock), cap + 1)
                    ELSE c.ready END AS ready,
               -- Jobs waiting on their after jobs are pending and not due: scheduled.
               CASE WHEN c.scheduled > cap THEN greatest(alk._estimate_jobs(c.name, 'scheduled', clock), cap + 1)
                    ELSE c.scheduled END
               + CASE WHEN c.waiting > cap THEN greatest(alk._estimate_jobs(c.name, 'waiting', clock), cap + 1)
                      ELSE c.waiting END AS scheduled,
               CASE WHEN c.processing > cap THEN greatest(alk._estimate_jobs(c.name, 'processing', clock), cap + 1)
                    ELSE c.processing END AS processing,
               CASE WHEN c.lapsed > cap THEN greatest(alk._estimate_jobs(c.name, 'lapsed', clock), cap + 1)
                    ELSE c.lapsed END AS lapsed,
               CASE WHEN c.dead > cap THEN greatest(alk._estimate_jobs(c.name, 'dead', clock), cap + 1)
                    ELSE c.dead END AS dead,
               CASE WHEN c.completed > cap THEN greatest(alk._estimate_jobs(c.name, 'completed', clock), cap + 1)
                    ELSE c.completed END AS completed,
               coalesce(greatest(c.ready, c.scheduled, c.waiting, c.processing, c.lapsed, c.dead, c.completed) > cap,
                        false)
                 AS estimated
          FROM capped c
    )
    SELECT c.name, c.ready + c.scheduled, c.ready, c.scheduled, c.processing,
           -- Two estimates may disagree: never more lapsed than processing.
           least(c.lapsed, c.processing), c.dead,
           alk._sat_sub(clock, t.oldest_ready), t.next_run_at,
           EXISTS (SELECT FROM alk.paused_queues pq WHERE pq.queue = c.name), c.estimated, c.completed
      FROM counted c
     CROSS JOIN LATERAL (
        WITH RECURSIVE priorities(priority) AS (
            (SELECT j.priority FROM alk.jobs j WHERE j.queue = c.name AND j.state = 'pending' AND j.after_left = 0
              ORDER BY j.priority DESC LIMIT 1)
            UNION ALL
            SELECT (SELECT j.priority FROM alk.jobs j WHERE j.queue = c.name AND j.state = 'pending'
                       AND j.after_left = 0 AND j.priority < p.priority ORDER BY j.priority DESC LIMIT 1)
              FROM priorities p WHERE p.priority IS NOT NULL
        )
        SELECT min((SELECT j.run_at FROM alk.jobs j WHERE j.queue = c.name AND j.state = 'pending'
                       AND j.after_left = 0 AND j.priority = p.priority AND j.run_at <= clock ORDER BY j.run_at LIMIT 1)) AS oldest_ready,
               min((SELECT j.run_at FROM alk.jobs j WHERE j.queue = c.name AND j.state = 'pending'
                       AND j.after_left = 0 AND j.priority = p.priority AND j.run_at > clock ORDER BY j.run_at LIMIT 1)) AS next_run_at
          FROM priorities p WHERE p.priority IS NOT NULL) t
     ORDER BY c.name;
END
$$;
COMMENT ON FUNCTION alk.queue_stats(text, bigint) IS
'One row per queue (every queue holding a job, reserved outbox queues included; or only the given queue, even when '
'empty): pending (= ready + scheduled), ready (pending and due), scheduled (pending, run_at in the future, or '
'waiting on its after jobs: alk.enqueue), '
'processing (leased, lapsed included), lapsed (lease ended: claimable again), dead, oldest_ready_age_s (now minus '
'the earliest run_at of a ready job: the queue''s lag; NULL when none is ready), next_run_at (the earliest run_at '
'of a scheduled job not waiting on after jobs; NULL when none), paused (alk.pause_queue), estimated, and '
'completed (acked jobs kept by '
'alk.set_queue_retention; last, as it came last). Every count is exact unless '
'exact_limit is given: then a count stops after exact_limit + 1 index entries and, past exact_limit, is the '
'planner''s estimate (from the table''s statistics, which ANALYZE and autovacuum keep current), never below '
'exact_limit + 1, and estimated is true. The ages are exact either way. Cost: index-only scans of the partial '
'indexes, linear in the entries counted: with exact_limit at most about 6 x exact_limit per queue '
'(docs/dashboard.md has numbers). Example: SELECT * FROM alk.queue_stats(exact_limit => 10000);';

-- alk.requeue_dead(text,bigint[]): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.requeue_dead(queue text, job_ids bigint[] DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    clock bigint := alk.now();
    moved bigint;
    awaited bigint[];
BEGIN
    PERFORM alk._check_name('queue', requeue_dead.queue);
    -- A fresh life: pending and due now, every attempt spent so far refunded
    -- (attempts itself stays: its tokens stay dead), no worker, no error.
    -- The stamps and priority stay. An expiring job keeps its TTL, counted
    -- again from now (else an expired job would die again at once). A dead
    -- job whose dedup key a live job holds stays dead (that work is queued
    -- already), and of several dead jobs with one key only the first moves.
    -- Two statements rather than "job_ids IS NULL OR ...", so each keeps its
    -- index (jobs_dead for a whole queue, jobs_pkey for given ids) in a
    -- generic plan.
    IF job_ids IS NULL THEN
        WITH requeued AS (
            UPDATE alk.jobs j
               SET state = 'pending', run_at = clock, attempts_refunded = j.attempts,
                   worker_id = NULL, claimed_at = NULL, claim_expires_at = NULL,
                   last_error = NULL, died_at = NULL, purge_at = NULL,
                   expires_at = alk._sat_add(clock, alk._sat_sub(j.expires_at, j.created_at))
             WHERE j.queue = requeue_dead.queue AND j.state = 'dead'
               AND (j.dedup_key IS NULL OR (
                    NOT EXISTS (SELECT FROM alk.jobs h WHERE h.queue = j.queue AND h.dedup_key = j.dedup_key
                                                         AND h.state IN ('pending', 'processing'))
                    AND j.id = (SELECT min(d.id) FROM alk.jobs d WHERE d.queue = j.queue AND d.dedup_key = j.dedup_key
                                                                  AND d.state = 'dead')))
            RETURNING j.id, j.awaited
        )
        SELECT count(*), array_agg(m.id) FILTER (WHERE m.awaited) INTO moved, awaited FROM requeued m;
    ELSE
        WITH requeued AS (
            UPDATE alk.jobs j
               SET state = 'pending', run_at = clock, attempts_refunded = j.attempts,
                   worker_id = NULL, claimed_at = NULL, claim_expires_at = NULL,
                   last_error = NULL, died_at = NULL, purge_at = NULL,
                   expires_at = alk._sat_add(clock, alk._sat_sub(j.expires_at, j.created_at))
             WHERE j.queue = requeue_dead.queue AND j.state = 'dead' AND j.id = ANY (job_ids)
               AND (j.dedup_key IS NULL OR (
                    NOT EXISTS (SELECT FROM alk.jobs h WHERE h.queue = j.queue AND h.dedup_key = j.dedup_key
                                                         AND h.state IN ('pending', 'processing'))
                    AND j.id = (SELECT min(d.id) FROM alk.jobs d WHERE d.queue = j.queue AND d.dedup_key = j.dedup_key
                                                                  AND d.state = 'dead' AND d.id = ANY (job_ids))))
            RETURNING j.id, j.awaited
        )
        SELECT count(*), array_agg(m.id) FILTER (WHERE m.awaited) INTO moved, awaited FROM requeued m;
    END IF;
    -- The jobs enqueued after these come back too, waiting (35_after.sql).
    IF awaited IS NOT NULL THEN
        moved := moved + alk._after_revive(requeue_dead.queue, awaited);
    END IF;
    IF moved > 0 THEN
        PERFORM alk._wake(requeue_dead.queue);
    END IF;
    RETURN moved;
END
$$;
COMMENT ON FUNCTION alk.requeue_dead(text, bigint[]) IS
'Send dead jobs back to pending (completed jobs are never touched), due now, with every attempt spent so far refunded (attempts_refunded = attempts, '
'so the job has max_attempts again and no earlier fencing token becomes valid), no worker and no last_error; every '
'dead job of the queue when job_ids is NULL, else those of job_ids that are dead in this queue (others are ignored). '
'A dead job whose dedup_key a live job holds stays dead (of several with one key, the first moves). An expiring job '
'gets its TTL again from now. Dead jobs enqueued after a moved job (alk.enqueue''s after, transitively) move too and '
'wait for it again. Returns how many moved; idle workers are woken. '
'Example: SELECT alk.requeue_dead(''emails''); SELECT alk.requeue_dead(''emails'', ARRAY[41, 42]);';

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
