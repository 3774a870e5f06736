-- pyalk queue, operations on a claimed job (docs/contract.md#queue): the
-- settlement rule (alk._settle) and ack, ack_batch, settle, retry, fail,
-- heartbeat and settle_and_claim, all under the claim's token (release_jobs
-- and snooze: 55_give_back.sql).
--
-- Every statement here reads or writes live jobs only, so each says
-- slot <> 2: the planner leaves the kept slot out of its plan
-- (alk.jobs_kept, 10_table.sql; 0035).
--
-- After claim (settle_and_claim calls alk._claim). Every settlement counts
-- itself in alk.queue_counts (80_throughput.sql; the bodies reach it at run
-- time only). Landed in 0002_queue.sql; 0009 added alk._settle, settle,
-- release_jobs and settle_and_claim; changed by 0015, 0019, 0020, 0022, 0023;
-- 0025 added snooze; 0026 completed jobs and results (alk._complete); 0028
-- settling an awaited job releases or buries its waiters (alk._after_sync);
-- 0032 a settlement that frees a max_running slot wakes idle workers
-- (alk._wake_freed, 40_claim.sql); 0041 settle_and_claim wakes no idle
-- caller (0043: alk._wake_freed's caller).

-- operations on a claimed job -----------------------------------------------

-- Acks on a queue that keeps completed jobs (alk.set_queue_retention): the
-- held jobs of such queues become completed, with their result, in one
-- statement, counted as acked; the ids it completed come back, NULL for
-- none. Every ack form calls it first, and only when alk.queue_settings has
-- a row that may apply (one probe of a tiny table per call, none per job),
-- then deletes what it left as before: completed rows are no longer held.
-- outcomes NULL: all ack; results NULL: no results.
CREATE FUNCTION alk._complete(queue text, wid text, clock bigint, job_ids bigint[], attempts bigint[],
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
         WHERE j.slot <> 2 AND coalesce(f.outcome, 'ack') = 'ack' AND j.id = ANY (_complete.job_ids) AND j.id = f.id
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

-- The settlement rule, once: ack, retry and fail of claimed jobs, each under
-- the validity predicate, applied in one statement; one row per input in
-- input order with the state it led to ('acked', 'pending', 'dead') or NULL
-- when refused. A job id repeated in one batch: its first entry is applied,
-- later ones are refused. An ack on a queue that keeps completed jobs
-- (alk._complete, first) is 'acked' too: the outcome, whatever the storage.
--
-- Each statement also counts what it settled for alk.queue_throughput, in
-- the same statement (no extra one on the hot path): per queue of the rows
-- it changed (queue may be NULL: any queue), one upsert of this backend's
-- row of the current minute (alk.queue_counts: concurrent settles never
-- share a row, so never wait on each other's commit). The upsert that opens
-- a new minute prunes old rows through alk.queue_counts' insert trigger
-- (alk._prune_counts), so the retention rule lives once. Both statements
-- below count the same way, and so do alk.ack's and alk.ack_batch's.
CREATE FUNCTION alk._settle(queue text, worker_id text, job_ids bigint[], attempts bigint[], outcomes text[],
                            errs text[], delays bigint[], results jsonb[] DEFAULT NULL, wake boolean DEFAULT true)
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
    grouped boolean;
    group_queues text[];
    group_keys text[];
    waited_on boolean;
    limited boolean;
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
    -- Serial groups (38_group_turns.sql): the groups of the jobs to settle,
    -- read before the statements below delete them (a job's group never
    -- changes), given their next turns after. A queue running no grouped
    -- job pays one probe of the empty end of jobs_group_running.
    grouped := CASE WHEN _settle.queue IS NULL
        THEN EXISTS (SELECT FROM alk.jobs j WHERE j.slot <> 2 AND j.state = 'processing' AND j.group_key IS NOT NULL)
        ELSE EXISTS (SELECT FROM alk.jobs j WHERE j.slot <> 2 AND j.queue = _settle.queue AND j.state = 'processing'
                                              AND j.group_key IS NOT NULL) END;
    IF grouped THEN
        -- The jobs an ack may delete: a retried or failed job leaves by an
        -- UPDATE, whose trigger (jobs_group_left) gives its group's turns.
        SELECT array_agg(j.queue), array_agg(j.group_key) INTO group_queues, group_keys
          FROM alk.jobs j
         WHERE j.slot <> 2 AND j.id = ANY (_settle.job_ids) AND (_settle.queue IS NULL OR j.queue = _settle.queue)
           AND j.state = 'processing' AND j.group_key IS NOT NULL
           AND (all_ack OR j.id IN (SELECT o.id FROM unnest(_settle.job_ids, _settle.outcomes) AS o(id, outcome)
                                     WHERE coalesce(o.outcome, 'ack') = 'ack'));
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
             WHERE j.slot <> 2 AND j.id = ANY (_settle.job_ids) AND j.id = f.id AND (_settle.queue IS NULL OR j.queue = _settle.queue)
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
    ELSE
        RETURN QUERY
        WITH input AS (
            SELECT i.id, i.attempt, coalesce(i.outcome, 'ack') AS outcome, i.err, i.delay, i.ord
              FROM unnest(_settle.job_ids, _settle.attempts, _settle.outcomes, _settle.errs, _settle.delays)
                   WITH ORDINALITY AS i(id, attempt, outcome, err, delay, ord)
        ), first AS (
            SELECT DISTINCT ON (i.id) i.* FROM input i ORDER BY i.id, i.ord
        ), acked AS (
            DELETE FROM alk.jobs j USING first f
             WHERE j.slot <> 2 AND f.outcome = 'ack' AND j.id = ANY (_settle.job_ids) AND j.id = f.id AND (_settle.queue IS NULL OR j.queue = _settle.queue)
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
             WHERE j.slot <> 2 AND f.outcome <> 'ack' AND j.id = ANY (_settle.job_ids) AND j.id = f.id AND (_settle.queue IS NULL OR j.queue = _settle.queue)
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
    END IF;
    -- In a later statement than the settlement (RETURN QUERY keeps no
    -- awaited flag or queue), one statement probes two tables, empty unless
    -- their feature is used: alk.job_after (acked or dead: the jobs enqueued
    -- after them are released or buried, 35_after.sql) and
    -- alk.limited_queues (a freed max_running slot wakes idle workers,
    -- alk._wake_freed; not when settle_and_claim claims next: it asks after
    -- its claim).
    SELECT EXISTS (SELECT FROM alk.job_after e WHERE e.after_id = ANY (_settle.job_ids)),
           _settle.wake AND EXISTS (SELECT FROM alk.limited_queues l
                                     WHERE l.max_running IS NOT NULL
                                       AND (_settle.queue IS NULL OR l.queue = _settle.queue))
      INTO waited_on, limited;
    IF waited_on THEN
        PERFORM alk._after_sync(_settle.job_ids);
    END IF;
    IF group_queues IS NOT NULL THEN
        PERFORM alk._group_turns(group_queues, group_keys);
    END IF;
    IF limited THEN
        PERFORM alk._wake_freed(CASE WHEN _settle.queue IS NOT NULL THEN ARRAY[_settle.queue] END);
    END IF;
END
$$;
COMMENT ON FUNCTION alk._settle(text, text, bigint[], bigint[], text[], text[], bigint[], jsonb[], boolean) IS
'internal: the settlement rule (ack, retry, fail) for a batch, counted per queue for alk.queue_throughput; '
'queue NULL: any queue; results: the acks'' results, kept on queues that keep completed jobs; wake: whether a freed '
'max_running slot wakes idle workers now (false: the caller claims first and asks after)';

-- alk.ack and alk.ack_batch apply _settle's all-ack rule in one statement of
-- their own: the rule (delete under alk._holds; a repeated id's first entry
-- only) and the count (one upsert of this backend's minute row per queue, the
-- prune when it opens a minute) exactly as _settle's statements, without the
-- per-input result rows neither needs. Measured at one job, server side:
-- 147 against 218 us per ack through _settle; at 100, about 2.1 against
-- 2.7 ms per claim + ack_batch. Like _settle, each first hands the jobs of
-- queues that keep completed jobs to alk._complete.
CREATE FUNCTION alk.ack(job_id bigint, worker_id text, attempt bigint DEFAULT NULL, queue text DEFAULT NULL,
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
    acked_queue text;
    acked_group text;
    limited text[];
    any_limited boolean;
BEGIN
    IF EXISTS (SELECT FROM alk.queue_settings s WHERE ack.queue IS NULL OR s.queue = ack.queue) THEN
        -- Kept as completed, its slot is free too: the limits probe rides
        -- in the same statement (ack.queue NULL: any queue with max_running).
        SELECT alk._complete(ack.queue, wid, clock, ARRAY[ack.job_id], ARRAY[ack.attempt], NULL, ARRAY[ack.result])
               IS NOT NULL,
               EXISTS (SELECT FROM alk.limited_queues l
                        WHERE l.max_running IS NOT NULL AND (ack.queue IS NULL OR l.queue = ack.queue))
          INTO done, any_limited;
        IF done THEN
            IF any_limited THEN
                PERFORM alk._wake_freed(CASE WHEN ack.queue IS NOT NULL THEN ARRAY[ack.queue] END);
            END IF;
            RETURN true;
        END IF;
    END IF;
    WITH acked AS (
        DELETE FROM alk.jobs j
         WHERE j.slot <> 2 AND j.id = ack.job_id AND (ack.queue IS NULL OR j.queue = ack.queue)
           AND alk._holds(j, wid, ack.attempt, clock)
        RETURNING j.queue, j.awaited, j.group_key, j.under_max_running
    ), counted AS (
        INSERT INTO alk.queue_counts AS c (queue, minute, backend, acked)
        SELECT a.queue, this_minute, pg_catalog.pg_backend_pid(), 1 FROM acked a
        ON CONFLICT ON CONSTRAINT queue_counts_pkey DO UPDATE SET acked = c.acked + excluded.acked
        RETURNING c.queue
    )
    -- The job's queue when it was claimed under max_running (its row says
    -- so: no probe of alk.limited_queues for the others).
    SELECT true, a.awaited, a.queue, a.group_key, CASE WHEN a.under_max_running THEN ARRAY[a.queue] END
      INTO done, awaited, acked_queue, acked_group, limited FROM counted, acked a;
    -- Jobs enqueued after this one may run now (35_after.sql).
    IF awaited THEN
        PERFORM alk._after_sync(ARRAY[ack.job_id]);
    END IF;
    -- Its serial group's next turn (38_group_turns.sql).
    IF acked_group IS NOT NULL THEN
        PERFORM alk._group_turns(ARRAY[acked_queue], ARRAY[acked_group]);
    END IF;
    -- Its max_running slot is free: idle workers of the queue may claim.
    IF limited IS NOT NULL THEN
        PERFORM alk._wake_freed(limited);
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

CREATE FUNCTION alk.ack_batch(job_ids bigint[], worker_id text, attempts bigint[] DEFAULT NULL, queue text DEFAULT NULL)
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
    group_queues text[];
    group_keys text[];
    limited text[];
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
         WHERE j.slot <> 2 AND j.id = ANY (ack_batch.job_ids) AND j.id = f.id
           AND (ack_batch.queue IS NULL OR j.queue = ack_batch.queue)
           AND alk._holds(j, wid, f.attempt, clock)
        RETURNING j.id, j.queue, j.awaited, j.group_key, j.under_max_running
    ), counted AS (
        INSERT INTO alk.queue_counts AS c (queue, minute, backend, acked)
        SELECT a.queue, this_minute, pg_catalog.pg_backend_pid(), count(*) FROM acked a GROUP BY a.queue
        ON CONFLICT ON CONSTRAINT queue_counts_pkey DO UPDATE SET acked = c.acked + excluded.acked
        RETURNING c.queue
    )
    -- The queues whose max_running slots these acks freed: the deleted
    -- jobs' rows say so; for jobs kept as completed (gone from acked), a
    -- probe of alk.limited_queues (ack_batch.queue's, or any when NULL).
    SELECT count(*), array_agg(a.id) FILTER (WHERE a.awaited),
           array_agg(a.queue) FILTER (WHERE a.group_key IS NOT NULL),
           array_agg(a.group_key) FILTER (WHERE a.group_key IS NOT NULL),
           array_agg(DISTINCT a.queue) FILTER (WHERE a.under_max_running)
      INTO n_acked, awaited, group_queues, group_keys, limited FROM acked a;
    IF n_kept > 0 THEN
        limited := limited || ARRAY(SELECT l.queue FROM alk.limited_queues l
                                     WHERE l.max_running IS NOT NULL
                                       AND (ack_batch.queue IS NULL OR l.queue = ack_batch.queue));
    END IF;
    -- Jobs enqueued after these may run now (35_after.sql).
    IF awaited IS NOT NULL THEN
        PERFORM alk._after_sync(awaited);
    END IF;
    -- Their serial groups' next turns (38_group_turns.sql).
    IF group_queues IS NOT NULL THEN
        PERFORM alk._group_turns(group_queues, group_keys);
    END IF;
    IF cardinality(limited) > 0 THEN
        PERFORM alk._wake_freed(limited);
    END IF;
    RETURN n_acked + n_kept;
END
$$;
COMMENT ON FUNCTION alk.ack_batch(bigint[], text, bigint[], text) IS
'Acknowledge several claimed jobs in one call; returns how many were validly held (and are now deleted, or kept as '
'completed without a result when their queue keeps completed jobs). '
'attempts, when given, holds each job''s fencing token in the same order. '
'Example: SELECT alk.ack_batch(ARRAY[41, 42], ''worker-1'', ARRAY[1, 1]);';

CREATE FUNCTION alk.settle(job_ids bigint[], worker_id text, attempts bigint[] DEFAULT NULL,
                           outcomes text[] DEFAULT NULL, errs text[] DEFAULT NULL, delays bigint[] DEFAULT NULL,
                           queue text DEFAULT NULL, results jsonb[] DEFAULT NULL)
RETURNS TABLE (job_id bigint, attempt bigint, state text)
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT * FROM alk._settle($7, $2, $1, $3, $4, $5, $6, $8)
$$;
COMMENT ON FUNCTION alk.settle(bigint[], text, bigint[], text[], text[], bigint[], text, jsonb[]) IS
'Settle several claimed jobs in one call and one transaction. Arrays aligned with job_ids: attempts (fencing tokens), '
'outcomes (''ack'', ''retry'' or ''fail''; NULL: all ack), errs (the error of a retry or fail) and delays (a retry''s '
'delay; NULL: the row''s backoff curve) and results (an ack''s result, kept when the queue keeps completed jobs; '
'NULL: none). One row per job id, in input order, with the state it led to: ''acked'' (deleted, or kept as '
'completed), ''pending'' (retried), ''dead'' (failed, or retried with its attempts spent), or NULL when the claim was '
'no longer valid (nothing changed). Each entry follows alk.ack, alk.retry and alk.fail exactly. '
'Example: SELECT * FROM alk.settle(ARRAY[41, 42], ''worker-1'', ARRAY[1, 1], ARRAY[''ack'', ''retry''], '
'ARRAY[NULL, ''TimeoutError: smtp'']);';

CREATE FUNCTION alk.retry(job_id bigint, worker_id text, attempt bigint DEFAULT NULL, err text DEFAULT NULL,
                          delay bigint DEFAULT NULL, queue text DEFAULT NULL)
RETURNS boolean
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT s.state IS NOT NULL
      FROM alk._settle($6, $2, ARRAY[$1], ARRAY[$3], ARRAY['retry'], ARRAY[$4], ARRAY[$5]) s
$$;
COMMENT ON FUNCTION alk.retry(bigint, text, bigint, text, bigint, text) IS
'Give a claimed job back for another attempt: pending again, no worker, ready at now + delay, or now + '
'backoff_base_s * 2^(spent - 1) when delay is NULL (spent = attempts - attempts_refunded). With its attempts spent '
'it becomes dead with last_error = err (or ''max attempts exceeded''). False, and nothing changes, when the claim is '
'no longer valid (see alk.ack); alk.settle says which state it led to. '
'Example: SELECT alk.retry(job_id => 42, worker_id => ''worker-1'', attempt => 1, err => ''smtp timeout'');';

CREATE FUNCTION alk.fail(job_id bigint, worker_id text, attempt bigint DEFAULT NULL, err text DEFAULT NULL,
                         queue text DEFAULT NULL)
RETURNS boolean
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT s.state IS NOT NULL
      FROM alk._settle($5, $2, ARRAY[$1], ARRAY[$3], ARRAY['fail'], ARRAY[$4], NULL) s
$$;
COMMENT ON FUNCTION alk.fail(bigint, text, bigint, text, text) IS
'Fail a claimed job for good: dead with last_error = err (or ''failed''). False, and nothing changes, when the claim '
'is no longer valid (see alk.ack). Example: SELECT alk.fail(42, ''worker-1'', 1, ''bad address'');';

CREATE FUNCTION alk.heartbeat(job_id bigint, worker_id text, attempt bigint DEFAULT NULL, extend bigint DEFAULT NULL,
                              queue text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock bigint := alk.now();
    wid text := alk._name_ok('worker_id', heartbeat.worker_id, true);
BEGIN
    UPDATE alk.jobs j
       SET claim_expires_at = alk._sat_add(clock, coalesce(extend, j.visibility_timeout_s))
     WHERE j.slot <> 2 AND j.id = job_id AND (heartbeat.queue IS NULL OR j.queue = heartbeat.queue)
       AND alk._holds(j, wid, attempt, clock);
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION alk.heartbeat(bigint, text, bigint, bigint, text) IS
'Extend a claimed job''s lease to now + extend seconds (the row''s visibility_timeout_s when NULL). True when the '
'claim was valid at call time; a negative extend leaves a lapsed lease that voids the claim on the next op. '
'Example: SELECT alk.heartbeat(42, ''worker-1'', 1, 600);';

CREATE TYPE alk.settle_claim_row AS (
    kind text,
    id bigint,
    queue text,
    state text,
    payload jsonb,
    priority bigint,
    run_at bigint,
    attempts bigint,
    max_attempts bigint,
    worker_id text,
    claimed_at bigint,
    claim_expires_at bigint,
    created_at bigint,
    expires_at bigint,
    visibility_timeout_s bigint,
    backoff_base_s bigint,
    dead_letter_retention_s bigint,
    last_error text,
    died_at bigint,
    dedup_key text,
    attempts_refunded bigint,
    headers jsonb,
    result jsonb,
    completed_at bigint,
    group_key text
);
COMMENT ON TYPE alk.settle_claim_row IS
'A row of alk.settle_and_claim: kind ''settled'' (id, queue, attempts = the token given, state = what it led to or '
'NULL when refused) or ''claimed'' (a whole alk.job).';

CREATE FUNCTION alk.settle_and_claim(queue text, worker_id text, n bigint, job_ids bigint[] DEFAULT NULL,
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
      FROM alk._settle(alk._name_ok('queue', $1, false), $2, $4, $5, $6, $7, $8, $9, false) s
    UNION ALL
    SELECT 'claimed'::text, c.* FROM alk._claim(alk._name_ok('queue', $1, false), $2, $3) c
    UNION ALL
    -- Then, the claim done: a max_running slot the settlement freed and the
    -- claim left free wakes idle workers other than the caller, which claims
    -- again by itself (alk._wake_freed, which never returns NULL: no row).
    -- Only a queue with max_running calls it; the others pay this branch's
    -- probe of alk.limited_queues.
    SELECT (NULL::alk.settle_claim_row).*
      FROM alk.limited_queues l
     WHERE l.queue = $1 AND l.max_running IS NOT NULL AND cardinality($4) > 0
       AND alk._wake_freed(ARRAY[l.queue], $2) IS NULL
$$;
COMMENT ON FUNCTION alk.settle_and_claim(text, text, bigint, bigint[], bigint[], text[], text[], bigint[], jsonb[]) IS
'One call, one transaction: settle a batch of this queue''s claimed jobs exactly as alk.settle does (results '
'included), then claim up to '
'n as alk.claim does (max_running slots the settlement freed and the claim left free wake the idle workers other '
'than worker_id). Returns flat rows: first one kind = ''settled'' row per settlement in input order (id, queue, '
'attempts = the token given, state = ''acked'', ''pending'', ''dead'' or NULL when refused; other columns NULL), then '
'kind = ''claimed'' rows, whole jobs in claim order. '
'Example: SELECT kind, id, state, attempts, payload FROM alk.settle_and_claim(''emails'', ''worker-1'', 10, '
'ARRAY[41, 42], ARRAY[1, 1], ARRAY[''ack'', ''fail''], ARRAY[NULL, ''ValueError: bad address'']);';
