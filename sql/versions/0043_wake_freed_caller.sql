-- pyalk 0043: wake_freed_caller (0041's rule, at its depth). 0041 kept settle_and_claim's caller from waking itself
-- with a probe of alk.idle_workers written in front of alk._wake_freed, which probes the same adverts first thing.
-- alk._wake_freed now takes the caller and leaves its advert out of its own probes; settle_and_claim passes its
-- worker_id and the probe in front of it goes. Same behaviour, one probe. The rule lives in sql/queue/40_claim.sql.

-- alk._wake_freed(text[],text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._wake_freed(queues text[], caller text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock bigint := alk.now();
    q text;
    woke boolean := false;
BEGIN
    -- Nobody sleeps (a busy system): nothing to wake, one probe. A statement
    -- of its own: inside the one below the planner ran the costlier tests
    -- first.
    IF NOT EXISTS (SELECT FROM alk.idle_workers w WHERE (queues IS NULL OR w.queue = ANY (queues))
                                                    AND w.worker_id IS DISTINCT FROM caller) THEN
        RETURN false;
    END IF;
    FOR q IN
        SELECT l.queue FROM alk.limited_queues l
         WHERE l.max_running IS NOT NULL AND (queues IS NULL OR l.queue = ANY (queues))
           -- Someone sleeps, a slot is free, and a due job waits for it.
           AND EXISTS (SELECT FROM alk.idle_workers w WHERE w.queue = l.queue AND w.worker_id IS DISTINCT FROM caller)
           AND (SELECT count(*) FROM (SELECT FROM alk.jobs j
                                       WHERE j.slot <> 2 AND j.queue = l.queue AND j.state = 'processing'
                                         AND j.claim_expires_at >= clock LIMIT l.max_running) r) < l.max_running
           AND alk._due_pending(l.queue, clock)
    LOOP
        PERFORM alk._wake(q);
        woke := true;
    END LOOP;
    RETURN woke;
END
$$;
COMMENT ON FUNCTION alk._wake_freed(text[], text) IS
'internal: after a settle of jobs of these queues (NULL: any), wake the idle workers of each that has max_running, '
'a free slot and a due job, unless the only idle one is caller (settle_and_claim''s worker); true when one was woken';

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

-- alk._wake_freed(text[]) is gone from the current files
DROP FUNCTION alk._wake_freed(text[]);

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
