-- pyalk 0037: settle_unparks_once (issue 26, found in review). alk._settle read the serial groups of every job it
-- settled and gave them their next turns after its statements; a retried or failed job also leaves by an UPDATE
-- whose trigger (jobs_group_left) does the same, so those groups were given their turns twice. It now reads the
-- groups of the jobs an ack may delete only.

-- alk._settle(text,text,bigint[],bigint[],text[],text[],bigint[],jsonb[],boolean): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._settle(queue text, worker_id text, job_ids bigint[], attempts bigint[], outcomes text[],
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

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
