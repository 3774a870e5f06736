-- pyalk outbox: the transactional outbox (docs/contract.md#outbox).
--
-- current definition; edit here, then add a version file (docs/migrations.md).
-- Landed as 0004_outbox.sql; a fresh install runs this file, an upgrade runs the
-- version files, and tests/migrations proves both give the same catalog.
--
-- An outbox is a queue with its own name space and its own stamps: messages
-- written inside the caller's business transaction (they exist if and only if
-- it commits) and delivered afterwards, at least once, by run_once loops.
-- Outbox 'billing' is backed by the queue 'alk:outbox:billing'; the reserved
-- prefix keeps the plain queue functions away from it, and the outbox
-- functions below reach it themselves. Stamps: 60 s visibility, 5 attempts,
-- 5 s backoff base, dead rows kept forever.
--
-- The claim, get_job and sweep rules are the queue's (alk._claim,
-- alk._get_job, alk._sweep_expired in sql/queue/), called with the backing name.

-- names ---------------------------------------------------------------------

-- The backing queue of an outbox, after validating the outbox name: a
-- non-empty name outside the reserved prefix, at most 1024 bytes (the name
-- rule), so 'alk:outbox:' || name is always a storable queue name.
CREATE FUNCTION alk._outbox_queue(outbox text)
RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT 'alk:outbox:' || alk._check_name('outbox', $1)
$$;
COMMENT ON FUNCTION alk._outbox_queue(text) IS
'internal: the backing queue alk:outbox:<outbox>, LK001 unless outbox is a valid outbox name';

-- enqueue -------------------------------------------------------------------

CREATE FUNCTION alk.outbox_enqueue_batch(
    outbox text,
    payloads jsonb[],
    delay bigint DEFAULT NULL,
    run_at bigint DEFAULT NULL,
    priority bigint DEFAULT 0,
    max_attempts bigint DEFAULT 5,
    expires bigint DEFAULT NULL,
    visibility_timeout_s bigint DEFAULT 60,
    backoff_base_s bigint DEFAULT 5,
    dead_letter_retention_s bigint DEFAULT NULL,
    headers jsonb DEFAULT NULL
)
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock bigint := alk.now();
BEGIN
    RETURN QUERY SELECT * FROM alk._enqueue(alk._outbox_queue(outbox), payloads, clock,
        delay, outbox_enqueue_batch.run_at, outbox_enqueue_batch.priority, outbox_enqueue_batch.max_attempts,
        expires, outbox_enqueue_batch.visibility_timeout_s, outbox_enqueue_batch.backoff_base_s,
        outbox_enqueue_batch.dead_letter_retention_s, 60, 5, 5, outbox_enqueue_batch.headers);
END
$$;
COMMENT ON FUNCTION alk.outbox_enqueue_batch(text, jsonb[], bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, jsonb) IS
'Write several outbox messages in one call, inside the caller''s transaction; returns their job ids in input order. '
'Options as alk.outbox_enqueue; headers is one value for the whole batch, as in alk.enqueue_batch. '
'Example: SELECT * FROM alk.outbox_enqueue_batch(''billing'', ARRAY[''{"invoice": 1}'', ''{"invoice": 2}'']::jsonb[]);';

CREATE FUNCTION alk.outbox_enqueue(
    outbox text,
    payload jsonb,
    delay bigint DEFAULT NULL,
    run_at bigint DEFAULT NULL,
    priority bigint DEFAULT 0,
    max_attempts bigint DEFAULT 5,
    expires bigint DEFAULT NULL,
    visibility_timeout_s bigint DEFAULT 60,
    backoff_base_s bigint DEFAULT 5,
    dead_letter_retention_s bigint DEFAULT NULL,
    dedup_key text DEFAULT NULL,
    headers jsonb DEFAULT NULL
)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT alk._enqueue_one(alk._outbox_queue($1), $2, alk.now(), $3, $4, coalesce($5, 0), coalesce($6, 5), $7,
                            coalesce($8, 60), coalesce($9, 5), $10, $11, $12)
$$;
COMMENT ON FUNCTION alk.outbox_enqueue(text, jsonb, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, text, jsonb) IS
'Write one outbox message into the backing queue alk:outbox:<outbox>, inside the caller''s transaction (it exists '
'if and only if that transaction commits); returns its job id. Options as alk.enqueue, with the outbox stamps: '
'60 s visibility, 5 attempts, 5 s backoff base, dead rows kept forever. dedup_key: while an undelivered message of '
'this outbox holds the key, nothing is written and its id is returned. headers: as alk.enqueue''s. '
'Example: BEGIN; UPDATE invoices SET paid = true WHERE id = 7; '
'SELECT alk.outbox_enqueue(outbox => ''billing'', payload => ''{"invoice": 7}'', dedup_key => ''invoice:7''); COMMIT;';

-- claim ---------------------------------------------------------------------

CREATE FUNCTION alk.outbox_claim(outbox text, worker_id text, n bigint DEFAULT 1)
RETURNS SETOF alk.job
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT * FROM alk._claim(alk._outbox_queue($1), $2, $3)
$$;
COMMENT ON FUNCTION alk.outbox_claim(text, text, bigint) IS
'Claim up to n due messages of an outbox for delivery, exactly as alk.claim does on its backing queue '
'alk:outbox:<outbox>. Settle each with alk.ack (delivered) or alk.retry (failed: delay NULL follows the backoff curve). '
'Example: SELECT id, attempts, payload FROM alk.outbox_claim(''billing'', ''relay-1'', 10);';

-- inspection and upkeep -------------------------------------------------------

CREATE FUNCTION alk.outbox_get_job(outbox text, job_id bigint)
RETURNS SETOF alk.job
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
ROWS 1
AS $$
    SELECT * FROM alk._get_job(alk._outbox_queue($1), $2)
$$;
COMMENT ON FUNCTION alk.outbox_get_job(text, bigint) IS
'The whole row of an outbox message in any state, dead included (last_error says why); no row once it was delivered '
'(NULL as a scalar subquery). Example: SELECT state, attempts, last_error FROM alk.outbox_get_job(''billing'', 42);';

CREATE FUNCTION alk.outbox_sweep_expired(outbox text)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT alk._sweep_expired(alk._outbox_queue($1))
$$;
COMMENT ON FUNCTION alk.outbox_sweep_expired(text) IS
'alk.sweep_expired for an outbox: bury expired messages as dead (''expired'') and delete dead messages past their '
'dead_letter_retention_s. Returns how many rows it changed. Example: SELECT alk.outbox_sweep_expired(''billing'');';

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
