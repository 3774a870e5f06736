-- pyalk 0041: settle_and_claim_wakes_others (the max_running worker row, 0.07 of unlimited). A worker under
-- max_running stays advertised idle between its claims, since each comes back short, so the freed-slot wake-up of its
-- own settle_and_claim found its advert, ran alk._wake_freed's probes and notified the worker that had just claimed:
-- 0.6-0.8 ms of a 1.1-1.9 ms call carrying 10 outcomes, measured. It now wakes only when an idle worker other than
-- the caller waits; the caller's claim, after its settle, took what it asked for. The rule lives in
-- sql/queue/50_settle.sql.

-- alk.settle_and_claim(text,text,bigint,bigint[],bigint[],text[],text[],bigint[],jsonb[]): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.settle_and_claim(queue text, worker_id text, n bigint, job_ids bigint[] DEFAULT NULL,
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
    -- claim left free wakes idle workers (alk._wake_freed, which never
    -- returns NULL: no row), if one other than the caller waits: the
    -- caller's claim, after its settle, took what it asked for (0041: a
    -- worker under max_running, advertised between claims, woke itself
    -- after each one). Only a queue with max_running gets that far; the
    -- others pay this branch's probe of alk.limited_queues.
    SELECT (NULL::alk.settle_claim_row).*
      FROM alk.limited_queues l
     WHERE l.queue = $1 AND l.max_running IS NOT NULL AND cardinality($4) > 0
       AND CASE WHEN EXISTS (SELECT FROM alk.idle_workers w WHERE w.queue = l.queue AND w.worker_id <> $2)
                THEN alk._wake_freed(ARRAY[l.queue]) IS NULL ELSE false END
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

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
