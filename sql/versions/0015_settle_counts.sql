-- pyalk 0015: settle_counts. Every settlement counts itself for alk.queue_throughput: alk._settle upserts this
-- backend's per-minute row of alk.queue_counts in the settling statement and prunes the queue's rows past a
-- day when it opens a new minute; alk.ack and alk.ack_batch go through alk._settle; alk._count_settled (never
-- called) is gone. Its DELETE/UPDATE also probe jobs_pkey per id (id = ANY (job_ids)): 0009's generic plan
-- walked every row the worker held (22-137 ms a call at 500 held).

-- alk._settle(text,text,bigint[],bigint[],text[],text[],bigint[]): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._settle(queue text, worker_id text, job_ids bigint[], attempts bigint[], outcomes text[],
                            errs text[], delays bigint[])
RETURNS TABLE (job_id bigint, attempt bigint, state text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    clock bigint := alk.now();
    wid text := alk._name_ok('worker_id', _settle.worker_id, true);
    k bigint := coalesce(cardinality(_settle.job_ids), 0);
    bad bigint;
    this_minute bigint := clock / 60 * 60;
    me integer := pg_catalog.pg_backend_pid();
BEGIN
    IF (_settle.attempts IS NOT NULL AND cardinality(_settle.attempts) <> k)
       OR (_settle.outcomes IS NOT NULL AND cardinality(_settle.outcomes) <> k)
       OR (_settle.errs IS NOT NULL AND cardinality(_settle.errs) <> k)
       OR (_settle.delays IS NOT NULL AND cardinality(_settle.delays) <> k) THEN
        PERFORM alk._raise('LK002', 'attempts, outcomes, errs and delays must each be NULL or have one entry per '
            || 'job id: got ' || k || ' job_ids, ' || coalesce(cardinality(_settle.attempts)::text, 'NULL')
            || ' attempts, ' || coalesce(cardinality(_settle.outcomes)::text, 'NULL') || ' outcomes, '
            || coalesce(cardinality(_settle.errs)::text, 'NULL') || ' errs and '
            || coalesce(cardinality(_settle.delays)::text, 'NULL') || ' delays');
    END IF;
    -- NULL outcomes (all ack, a batching worker's usual call): nothing to
    -- check, and no statement spent on it.
    IF _settle.outcomes IS NOT NULL THEN
        SELECT min(o.ord) INTO bad FROM unnest(_settle.outcomes) WITH ORDINALITY AS o(outcome, ord)
         WHERE o.outcome IS NULL OR o.outcome NOT IN ('ack', 'retry', 'fail');
    END IF;
    IF bad IS NOT NULL THEN
        PERFORM alk._raise('LK002', 'outcome ' || bad || ' must be ''ack'', ''retry'' or ''fail'', got '
            || alk._show(_settle.outcomes[bad]));
    END IF;
    IF k = 0 THEN
        RETURN;
    END IF;
    IF _settle.outcomes IS NULL THEN
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
            RETURNING c.queue, c.xmax = 0 AS opened
        ), pruned AS (
            DELETE FROM alk.queue_counts c
             -- A one-time filter: unless a minute was opened, no scan of any kind.
             WHERE EXISTS (SELECT FROM counted n WHERE n.opened)
               AND c.ctid = ANY (ARRAY(
                   SELECT o.ctid FROM counted n
                    CROSS JOIN LATERAL (
                       SELECT o.ctid FROM alk.queue_counts o
                        WHERE o.queue = n.queue AND o.minute < alk._sat_sub(this_minute, 86400)
                        ORDER BY o.minute LIMIT 1000
                          FOR UPDATE SKIP LOCKED) o
                    WHERE n.opened))
        )
        SELECT i.id, i.attempt, CASE WHEN a.id IS NOT NULL THEN 'acked' END
          FROM input i
          LEFT JOIN first f ON f.ord = i.ord
          LEFT JOIN acked a ON a.id = f.id
         ORDER BY i.ord;
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
        RETURNING c.queue, c.xmax = 0 AS opened
    ), pruned AS (
        DELETE FROM alk.queue_counts c
         -- A one-time filter: unless a minute was opened, no scan of any kind.
         WHERE EXISTS (SELECT FROM counted n WHERE n.opened)
           AND c.ctid = ANY (ARRAY(
               SELECT o.ctid FROM counted n
                CROSS JOIN LATERAL (
                   SELECT o.ctid FROM alk.queue_counts o
                    WHERE o.queue = n.queue AND o.minute < alk._sat_sub(this_minute, 86400)
                    ORDER BY o.minute LIMIT 1000
                      FOR UPDATE SKIP LOCKED) o
                WHERE n.opened))
    )
    SELECT i.id, i.attempt, d.state
      FROM input i
      LEFT JOIN first f ON f.ord = i.ord
      LEFT JOIN done d ON d.id = f.id
     ORDER BY i.ord;
END
$$;
COMMENT ON FUNCTION alk._settle(text, text, bigint[], bigint[], text[], text[], bigint[]) IS
'internal: the settlement rule (ack, retry, fail) for a batch, counted per queue for alk.queue_throughput; '
'queue NULL: any queue';

-- alk.ack(bigint,text,bigint,text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.ack(job_id bigint, worker_id text, attempt bigint DEFAULT NULL, queue text DEFAULT NULL)
RETURNS boolean
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    -- The settlement rule's all-ack path, so an ack is counted like any other.
    SELECT s.state IS NOT NULL FROM alk._settle($4, $2, ARRAY[$1], ARRAY[$3], NULL, NULL, NULL) s
$$;
COMMENT ON FUNCTION alk.ack(bigint, text, bigint, text) IS
'Acknowledge a claimed job: it is deleted. False, and nothing changes, unless the job is processing, held by worker_id '
'under claim attempt (the fencing token the claim returned; NULL skips that check) and its lease has not lapsed '
'(claim_expires_at >= now). worker_id follows the name rule (LK001). queue is optional routing for sharded deployments. '
'Example: SELECT alk.ack(job_id => 42, worker_id => ''worker-1'', attempt => 1);';

-- alk.ack_batch(bigint[],text,bigint[],text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.ack_batch(job_ids bigint[], worker_id text, attempts bigint[] DEFAULT NULL, queue text DEFAULT NULL)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT count(s.state) FROM alk._settle($4, $2, $1, $3, NULL, NULL, NULL) s
$$;
COMMENT ON FUNCTION alk.ack_batch(bigint[], text, bigint[], text) IS
'Acknowledge several claimed jobs in one call; returns how many were validly held (and are now deleted). '
'attempts, when given, holds each job''s fencing token in the same order. '
'Example: SELECT alk.ack_batch(ARRAY[41, 42], ''worker-1'', ARRAY[1, 1]);';

-- alk.queue_throughput(text,bigint,bigint): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.queue_throughput(queue text DEFAULT NULL, since bigint DEFAULT NULL, bucket_s bigint DEFAULT 60)
RETURNS SETOF alk.throughput
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    clock bigint := alk.now();
    only_queue text := queue_throughput.queue;
    width bigint := bucket_s;
    first_bucket bigint;
BEGIN
    IF only_queue IS NOT NULL THEN
        PERFORM alk._check_name('queue', only_queue, true);
    END IF;
    IF width IS NULL OR width < 60 OR width % 60 <> 0 THEN
        PERFORM alk._raise('LK002', 'bucket_s must be a positive multiple of 60, got ' || coalesce(width::text, 'NULL'));
    END IF;
    first_bucket := coalesce(since, alk._sat_sub(clock, 3600));
    -- Saturating: since may be any bigint (a boundary argument), width too.
    first_bucket := alk._sat_sub(first_bucket, CASE WHEN first_bucket % width < 0 THEN first_bucket % width + width
                                                    ELSE first_bucket % width END);
    IF (clock::numeric - first_bucket) / width > 10080 THEN
        PERFORM alk._raise('LK002', 'since and bucket_s ask for more than 10080 buckets: widen bucket_s');
    END IF;
    -- Every bucket from since to now, zeros included, for every queue that
    -- has a counter in the window: a chart needs no gap filling.
    RETURN QUERY
    WITH names AS (
        SELECT DISTINCT c.queue FROM alk.queue_counts c
         WHERE (only_queue IS NULL OR c.queue = only_queue) AND c.minute >= first_bucket
        UNION
        SELECT only_queue WHERE only_queue IS NOT NULL
    ), buckets AS (
        SELECT b AS bucket_at FROM pg_catalog.generate_series(first_bucket, clock, width) b
    )
    SELECT n.queue, b.bucket_at,
           coalesce(sum(c.acked), 0)::bigint, coalesce(sum(c.retried), 0)::bigint, coalesce(sum(c.dead), 0)::bigint
      FROM names n CROSS JOIN buckets b
      LEFT JOIN alk.queue_counts c
        ON c.queue = n.queue AND c.minute >= b.bucket_at AND c.minute < alk._sat_add(b.bucket_at, width)
     GROUP BY n.queue, b.bucket_at
     ORDER BY n.queue, b.bucket_at;
END
$$;
COMMENT ON FUNCTION alk.queue_throughput(text, bigint, bigint) IS
'Jobs settled per time bucket (acked, retried, dead) of one queue or of every queue with a count in the window, '
'from since (default: an hour ago) to now in buckets of bucket_s seconds (a multiple of 60), zeros included. '
'Counted by the settle functions (ack, ack_batch, settle, retry, fail, settle_and_claim), once per call: acked, '
'retried (pending again) and dead (failed, or retried with its attempts spent). Jobs a claim buries (out of attempts '
'after lapsed leases, or expired) and sweeps are not settlements and are not counted: alk.queue_stats shows the '
'dead. Counters are kept a day. '
'Example: SELECT bucket_at, acked FROM alk.queue_throughput(''emails'', bucket_s => 300);';

-- alk._count_settled(text,text,bigint) is gone from the current files
DROP FUNCTION alk._count_settled(text,text,bigint);

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
