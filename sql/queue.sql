-- pyalk queue: the durable job queue (CONTRACT.md §1).
--
-- current definition; edit here, then add a version file (docs/migrations.md).
-- Landed as 0002_queue.sql and 0007_worker.sql (worker support); a fresh
-- install runs this file, an upgrade runs the version files, and
-- tests/migrations proves both give the same catalog.
--
-- One table holds every job in every queue. A job is pending (waiting for its
-- run_at), processing (leased to a worker until claim_expires_at) or dead
-- (kept for inspection until its retention lapses). ack and cancel delete.

CREATE TYPE alk.job AS (
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
    attempts_refunded bigint
);
COMMENT ON TYPE alk.job IS 'A job as every queue function returns it: the resolved row, never the enqueuer''s raw options.';

CREATE TABLE alk.jobs (
    id bigint GENERATED ALWAYS AS IDENTITY,
    queue text NOT NULL,
    state text NOT NULL DEFAULT 'pending',
    payload jsonb NOT NULL,
    priority bigint NOT NULL,
    run_at bigint NOT NULL,
    -- The fencing token: +1 per claim, never decreases, so a token once
    -- issued is never valid again (not after release_jobs or requeue_dead).
    attempts bigint NOT NULL DEFAULT 0,
    max_attempts bigint NOT NULL,
    worker_id text,
    claimed_at bigint,
    claim_expires_at bigint,
    created_at bigint NOT NULL,
    expires_at bigint,
    visibility_timeout_s bigint NOT NULL,
    backoff_base_s bigint NOT NULL,
    dead_letter_retention_s bigint,
    last_error text,
    died_at bigint,
    -- When a dead row's retention ends (alk._purge_at); NULL: kept forever.
    purge_at bigint,
    -- While a live (pending or processing) job holds it, an enqueue with the
    -- same key in the same queue writes nothing (jobs_dedup). NULL: no dedup.
    dedup_key text,
    -- Claims given back (release_jobs: one; requeue_dead: all). The attempts
    -- a job has spent, which claimability, burial and backoff count, are
    -- attempts - attempts_refunded.
    attempts_refunded bigint NOT NULL DEFAULT 0,
    -- The key holds the queue so the table can be hash-distributed by queue;
    -- id leads it so ops by id (ack, retry, ...) are one probe of one index.
    CONSTRAINT jobs_pkey PRIMARY KEY (id, queue),
    CONSTRAINT jobs_state_known CHECK (state IN ('pending', 'processing', 'dead')),
    CONSTRAINT jobs_queue_named CHECK (queue <> '')
    -- Cross-column rules (a processing job has a lease, a dead one died_at)
    -- are the functions' to keep: CHECKs cost every insert and claim ~10 us
    -- each, and the table has no other writer. The SQL tests pin them.
);
COMMENT ON TABLE alk.jobs IS 'Every job of every queue. Private: use the alk.* functions.';

-- The claim path: due pending jobs in claim order. Partial, so processing
-- and dead rows never cost a claim anything.
CREATE INDEX jobs_claim_pending ON alk.jobs (queue, priority DESC, run_at, id) WHERE state = 'pending';
-- Lapsed leases (crashed workers) are found by their deadline.
CREATE INDEX jobs_claim_lapsed ON alk.jobs (queue, claim_expires_at) WHERE state = 'processing';
-- Expiry and retention sweeps.
CREATE INDEX jobs_expiring ON alk.jobs (queue, expires_at) WHERE expires_at IS NOT NULL AND state <> 'dead';
-- Dead rows, by the end of their retention: the sweep reads only those due.
CREATE INDEX jobs_dead ON alk.jobs (queue, purge_at) WHERE state = 'dead';
-- One live job per dedup key and queue; dead rows keep their key for
-- inspection without holding it. Enqueues insert with ON CONFLICT on it, so
-- concurrent enqueues of one key leave one row, never a read-then-write race.
CREATE UNIQUE INDEX jobs_dedup ON alk.jobs (queue, dedup_key) WHERE dedup_key IS NOT NULL AND state <> 'dead';

-- Paused queues (alk.pause_queue): a claim probes this by primary key.
CREATE TABLE alk.paused_queues (
    queue text NOT NULL,
    paused_at bigint NOT NULL,
    CONSTRAINT paused_queues_pkey PRIMARY KEY (queue)
);
COMMENT ON TABLE alk.paused_queues IS 'Queues whose claims return nothing until resumed. Private: use alk.pause_queue.';

-- Workers waiting idle for a queue (alk.wait_for_jobs). Unlogged: an advert
-- lives no longer than the connection that LISTENs, and a crash loses both.
CREATE UNLOGGED TABLE alk.idle_workers (
    queue text NOT NULL,
    worker_id text NOT NULL,
    -- The advertising connection's backend pid: adverts of gone connections
    -- are cleared by the next alk.wait_for_jobs of the queue.
    pid integer NOT NULL,
    since bigint NOT NULL,
    CONSTRAINT idle_workers_pkey PRIMARY KEY (queue, worker_id)
);
COMMENT ON TABLE alk.idle_workers IS 'Workers waiting idle for a queue''s NOTIFY. Private: use alk.wait_for_jobs.';

-- A queue table drains and refills all day: vacuum it early and often so dead
-- index entries from claims and acks do not pile up between runs.
ALTER TABLE alk.jobs SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 500,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02
);

-- rules shared by several functions ------------------------------------------

-- The validity predicate of every op on a claimed job (ack, retry, fail,
-- heartbeat): processing, held by this worker, under the same claim (attempt
-- is the fencing token the claim returned; NULL skips that check), lease not
-- lapsed (claim_expires_at >= now). Inlinable (see alk.now in core.sql): it
-- becomes part of each op's WHERE clause, next to the id's index probe.
-- The state test is a function call, not the = operator, so it never proves
-- jobs_claim_lapsed's predicate: otherwise, while few rows are processing,
-- the planner walks that index (every held row and every dead entry since
-- the last vacuum, per call) instead of probing jobs_pkey by id.
CREATE FUNCTION alk._holds(job alk.jobs, worker_id text, attempt bigint, clock bigint)
RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT pg_catalog.texteq(job.state, 'processing')
       AND job.worker_id OPERATOR(pg_catalog.=) worker_id
       AND (attempt IS NULL OR job.attempts OPERATOR(pg_catalog.=) attempt)
       AND job.claim_expires_at OPERATOR(pg_catalog.>=) clock
       AND (NOT alk._limits_active() OR alk._in_scope(job.queue))
$$;
COMMENT ON FUNCTION alk._holds(alk.jobs, text, bigint, bigint) IS 'internal: the claimed-job validity predicate (name limits included: a job outside them is never held)';

-- The retention rule: a dead row is deleted once died_at <= now - retention
-- (saturating). That holds from the instant this returns on (NULL: never),
-- so the sweep can find due rows through an index instead of testing each.
CREATE FUNCTION alk._purge_at(died_at bigint, retention bigint)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN retention IS NULL OR died_at IS NULL THEN NULL
        -- sat(now - retention) never drops below the minimum, which died_at
        -- can equal only under a pinned clock: due at once.
        WHEN died_at OPERATOR(pg_catalog.=) '-9223372036854775808'::bigint THEN '-9223372036854775808'::bigint
        -- died_at + retention past the maximum: now - retention never reaches died_at.
        WHEN retention OPERATOR(pg_catalog.>) 0
         AND died_at OPERATOR(pg_catalog.>) (9223372036854775807 OPERATOR(pg_catalog.-) retention) THEN NULL
        ELSE alk._sat_add(died_at, retention)
    END
$$;
COMMENT ON FUNCTION alk._purge_at(bigint, bigint) IS
'internal: the first instant at which a row that died at died_at is past its retention, or NULL for never';

-- wake-ups --------------------------------------------------------------------

-- A queue's channel is alk._channel('alk_q_', queue): 38 bytes whatever the
-- name, one per queue so a worker hears only its own. The payload is empty, so PostgreSQL folds the notifications of one
-- transaction into one; NOTIFY is delivered at commit, and a rolled-back
-- enqueue wakes nobody. Inlinable (no SET clause), like alk._channel.
--
-- Who is notified (docs/design.md, "Wake-ups"): NOTIFY serialises the
-- commits of notifying transactions on one instance-wide lock, so an enqueue
-- notifies only while a worker's advert is visible to it, and the enqueue
-- that sees it consumes it: about one NOTIFY per idle period.
-- A worker LISTENs, commits its advert (alk.wait_for_jobs), then reads the
-- transactions in progress (alk.wake_fence) and claims, and again once each
-- of them has ended. An enqueue inserts first, then in a later statement (a
-- newer snapshot) deletes every advert of the queue it can lock (FOR UPDATE
-- SKIP LOCKED: no enqueue queues behind another for an advert) and notifies
-- if it took any. An enqueue that saw adverts but could take none (each held
-- by another transaction) waits for those holders, at most 20 ms
-- (alk._wake_held): a holder that commits covers it, so it does not notify;
-- a holder that rolls back gives the advert back, which it then takes and
-- notifies; a holder still open after the wait (an app's transaction that
-- consumed the advert and goes on) makes it notify, and its session then
-- notifies at once for that holder. Once a deletion has committed, later
-- enqueues see no advert and do not notify. A notified worker's advert is
-- gone: it advertises again and takes a new fence before it waits again,
-- every time, even when its claim came back empty. No wake-up is lost, for
-- an enqueue E:
-- * E took an advert, or an advert's holder rolled back or outlasted the
--   wait: E notifies at its commit;
-- * E saw an advert held by H, and H committed: H had not ended when E's
--   statement began, so H committed after E's insert. H is an enqueue (or
--   release, requeue), which notifies at that commit; or the worker itself
--   (alk.wait_for_jobs, which takes a fence after it commits, or
--   alk.stop_waiting, after which it claims before it waits again); or
--   alk.wait_for_jobs clearing the advert of a connection that is gone.
--   In each case the worker takes a fence or claims after a moment at which
--   E was in progress: the case below;
-- * E saw none because it had not committed in E's snapshot (the worker's
--   advert, or its advertising again): E had inserted, so it was in progress
--   at that commit, hence in the fence or ended before the claim after it;
-- * E saw none because a committed enqueue had deleted it: that enqueue's
--   notification reaches the worker, who advertises again after E's
--   statement began: the case above.
-- The price: an enqueue that meets a held advert waits for its holder's
-- commit (mostly its WAL flush) instead of taking the notify lock itself.
-- Outside READ COMMITTED a statement sees the transaction's first snapshot,
-- which may predate the advert, and a locking read of a row changed since
-- would fail the enqueue: such enqueues always notify and take no advert.
CREATE FUNCTION alk._queue_channel(queue text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT alk._channel('alk_q_', $1)
$$;
COMMENT ON FUNCTION alk._queue_channel(text) IS 'internal: the NOTIFY channel of a queue (no name check)';

CREATE FUNCTION alk.queue_channel(queue text)
RETURNS text
LANGUAGE sql IMMUTABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    -- Reserved names are accepted: an outbox relay may listen to its backing
    -- queue alk:outbox:<name>; a channel name reveals nothing.
    SELECT alk._queue_channel(alk._check_name('queue', $1, true))
$$;
COMMENT ON FUNCTION alk.queue_channel(text) IS
'The LISTEN channel of a queue: ''alk_q_'' and the first 32 hex digits of sha256(queue as UTF-8), a 38-byte '
'identifier whatever the name. A worker that waits idle (alk.wait_for_jobs) is notified there at the commit of '
'the first enqueue, release or requeue of the queue that commits after the advert (it consumes the advert: one '
'notification per idle period; advertise again before waiting again), and by alk.resume_queue; with an empty '
'payload: on wake-up, claim. Example: SELECT alk.queue_channel(''emails''); then LISTEN "<that channel>";';

CREATE FUNCTION alk._wake_held(queue text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
-- The longest wait for a holder: a durable commit under load, well below
-- deadlock_timeout, so a cycle through a holder ends here, not in 40P01.
SET lock_timeout = '20ms'
AS $$
DECLARE
    held tid[];
    holders text[];
BEGIN
    -- Called by a wake-up step whose locking read skipped every advert of
    -- the queue: true when each holder committed (it covers the caller, see
    -- the protocol above), false when the caller must notify.
    SELECT coalesce(pg_catalog.array_agg(v.ctid), '{}'),
           coalesce(pg_catalog.array_agg(v.xmax::text) FILTER (WHERE v.xmax::text <> '0'), '{}')
      INTO held, holders
      FROM alk.idle_workers v WHERE v.queue = _wake_held.queue;
    IF cardinality(held) = 0 THEN
        RETURN true;  -- deleted by holders that committed since the skip
    END IF;
    -- A holder that outlasted this session's last wait is an open
    -- transaction: do not wait for it again.
    IF holders && pg_catalog.string_to_array(pg_catalog.current_setting('alk.wake_slow_holders', true), ',') THEN
        RETURN false;
    END IF;
    BEGIN
        -- Waits for each holder: a row that comes back was given back by a
        -- rollback (or is a new advert): take it, and the caller notifies.
        DELETE FROM alk.idle_workers w
         WHERE w.ctid = ANY (ARRAY(SELECT v.ctid FROM alk.idle_workers v
                                    WHERE v.ctid = ANY (held) AND v.queue = _wake_held.queue FOR UPDATE));
        RETURN NOT FOUND;
    EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
        PERFORM pg_catalog.set_config('alk.wake_slow_holders', pg_catalog.array_to_string(holders, ','), false);
        RETURN false;
    END;
END
$$;
COMMENT ON FUNCTION alk._wake_held(text) IS
'internal: wait (at most 20 ms) for the holders of the queue''s adverts; true when each committed, false when the '
'caller must notify (a holder rolled back or stayed open)';

CREATE FUNCTION alk._wake(queue text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- Called in a statement after the insert (see above): a fresh snapshot
    -- under READ COMMITTED. alk._enqueue and alk._enqueue_one write this
    -- check out inline (no call frame per enqueue): change all three.
    -- Consume every advert of the queue that no one else holds (SKIP LOCKED:
    -- enqueues never wait for each other here); notify if any was visible.
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM pg_catalog.pg_notify(alk._queue_channel(_wake.queue), '');
    ELSIF EXISTS (SELECT FROM alk.idle_workers w WHERE w.queue = _wake.queue) THEN
        DELETE FROM alk.idle_workers w
         WHERE w.ctid = ANY (ARRAY(SELECT v.ctid FROM alk.idle_workers v WHERE v.queue = _wake.queue
                                     FOR UPDATE SKIP LOCKED));
        -- Took one: notify. Saw only adverts others hold: their holders'
        -- commits cover us; alk._wake_held waits briefly to know they commit.
        IF FOUND OR NOT alk._wake_held(_wake.queue) THEN
            PERFORM pg_catalog.pg_notify(alk._queue_channel(_wake.queue), '');
        END IF;
    END IF;
END
$$;
COMMENT ON FUNCTION alk._wake(text) IS
'internal: consume the queue''s idle adverts and notify its channel when one is visible (always above READ COMMITTED)';

CREATE FUNCTION alk.wait_for_jobs(queue text, worker_id text)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q text := alk._name_ok('queue', wait_for_jobs.queue, true);
    wid text := alk._name_ok('worker_id', wait_for_jobs.worker_id, true);
BEGIN
    -- Adverts of connections that are gone only cost notifies; clear them
    -- here, off the hot path. Never wait on a row lock: an advert locked by
    -- an enqueue is being consumed by it (SKIP LOCKED throughout).
    DELETE FROM alk.idle_workers w
     WHERE w.ctid = ANY (ARRAY(
            SELECT v.ctid FROM alk.idle_workers v
             WHERE v.queue = q
               AND v.pid NOT IN (SELECT a.pid FROM pg_catalog.pg_stat_get_activity(NULL) a WHERE a.pid IS NOT NULL)
               FOR UPDATE SKIP LOCKED));
    UPDATE alk.idle_workers w SET pid = pg_catalog.pg_backend_pid(), since = alk.now()
     WHERE w.ctid = ANY (ARRAY(SELECT v.ctid FROM alk.idle_workers v WHERE v.queue = q AND v.worker_id = wid
                                 FOR UPDATE SKIP LOCKED));
    -- A row we could not lock is an enqueue's to delete: it notifies at its
    -- commit (the caller advertises again then), or it rolls back and the
    -- advert stays. Inserting beside it would wait for that enqueue.
    IF NOT FOUND AND NOT EXISTS (SELECT FROM alk.idle_workers v WHERE v.queue = q AND v.worker_id = wid) THEN
        INSERT INTO alk.idle_workers AS w (queue, worker_id, pid, since)
        VALUES (q, wid, pg_catalog.pg_backend_pid(), alk.now())
        ON CONFLICT ON CONSTRAINT idle_workers_pkey DO NOTHING;
    END IF;
    RETURN alk._queue_channel(q);
END
$$;
COMMENT ON FUNCTION alk.wait_for_jobs(text, text) IS
'Advertise worker_id as waiting idle on queue, so the next enqueue notifies the queue''s channel (returned) and '
'consumes the advert. The protocol: LISTEN on the channel first; call this in its own transaction; then '
'fence := alk.wake_fence(); claim; when the claim is empty, wait for a notification, and meanwhile poll '
'fence := alk.wake_fence(fence) on a short timer, claiming again whenever it shrinks (an enqueue that was in flight '
'has ended). After every notification the advert is gone: claim, and before waiting again call this again and take '
'a new fence, even when the claim was empty. Call alk.stop_waiting once busy again. '
'Example: LISTEN "alk_q_..."; SELECT alk.wait_for_jobs(''emails'', ''worker-1''); SELECT alk.wake_fence(); '
'-- claim; wait; on a notification: claim, then SELECT alk.wait_for_jobs(''emails'', ''worker-1''); again';

CREATE FUNCTION alk.wake_fence(in_progress bigint[] DEFAULT NULL)
RETURNS bigint[]
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    -- NULL: the ids of every transaction in progress now. Else: those of
    -- in_progress that have not ended, as this statement's snapshot sees it
    -- (so a claim after it sees what they committed).
    SELECT coalesce(pg_catalog.array_agg(x.id ORDER BY x.id), '{}')
      FROM (SELECT t.xid::text::bigint AS id
              FROM pg_catalog.pg_snapshot_xip(pg_catalog.pg_current_snapshot()) AS t(xid)
             WHERE $1 IS NULL
            UNION ALL
            SELECT f.id FROM pg_catalog.unnest($1) AS f(id)
             WHERE NOT pg_catalog.pg_visible_in_snapshot(f.id::text::xid8, pg_catalog.pg_current_snapshot())) x
$$;
COMMENT ON FUNCTION alk.wake_fence(bigint[]) IS
'The idle worker''s fence (see alk.wait_for_jobs): with NULL, the ids of the transactions in progress now (call it '
'after the advert committed, before the next claim); given a fence, the part of it still in progress. An empty '
'array: every enqueue that could have missed the advert has ended and a claim after this call sees its jobs. '
'Example: SELECT alk.wake_fence(); SELECT alk.wake_fence(ARRAY[1234, 1240]);';

CREATE FUNCTION alk.stop_waiting(queue text, worker_id text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q text := alk._name_ok('queue', stop_waiting.queue, true);
    wid text := alk._name_ok('worker_id', stop_waiting.worker_id, true);
BEGIN
    -- SKIP LOCKED: an advert an enqueue holds is being consumed by it; a
    -- busy worker never waits for an enqueuer's commit.
    DELETE FROM alk.idle_workers w
     WHERE w.ctid = ANY (ARRAY(SELECT v.ctid FROM alk.idle_workers v WHERE v.queue = q AND v.worker_id = wid
                                 FOR UPDATE SKIP LOCKED));
    RETURN FOUND OR EXISTS (SELECT FROM alk.idle_workers v WHERE v.queue = q AND v.worker_id = wid);
END
$$;
COMMENT ON FUNCTION alk.stop_waiting(text, text) IS
'Withdraw the idle advert of alk.wait_for_jobs (an enqueue that consumed it has already): enqueues stop notifying '
'for this worker. Never waits for an enqueue. True if it was advertised. '
'A busy system has no adverts, so its enqueues never notify. Example: SELECT alk.stop_waiting(''emails'', ''worker-1'');';

-- enqueue -------------------------------------------------------------------

-- The one implementation behind every enqueue form (plain, batch, outbox,
-- scheduler): resolves the ready time, expiry and stamps against one clock
-- reading, inserts, and notifies the queue's channel. The caller has validated the queue name; stamp
-- defaults come from the caller so the outbox can resolve its own set.
CREATE FUNCTION alk._enqueue(
    queue text,
    payloads jsonb[],
    clock bigint,
    delay bigint,
    run_at bigint,
    priority bigint,
    max_attempts bigint,
    expires bigint,
    visibility_timeout_s bigint,
    backoff_base_s bigint,
    dead_letter_retention_s bigint,
    default_visibility_timeout_s bigint,
    default_max_attempts bigint,
    default_backoff_base_s bigint
)
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    -- delay wins over run_at; neither means "now".
    v_run_at bigint := CASE
        WHEN delay IS NOT NULL THEN alk._sat_add(clock, delay)
        WHEN run_at IS NOT NULL THEN run_at
        ELSE clock END;
BEGIN
    -- alk._check_payloads raises; call it only when the cheap test fails.
    IF payloads IS NULL OR pg_catalog.array_position(payloads, NULL) IS NOT NULL THEN
        PERFORM alk._check_payloads(payloads);
    END IF;
    IF cardinality(payloads) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH inserted AS (
        INSERT INTO alk.jobs (queue, payload, priority, run_at, max_attempts, created_at, expires_at,
                              visibility_timeout_s, backoff_base_s, dead_letter_retention_s)
        SELECT queue, p.payload, coalesce(priority, 0), v_run_at, coalesce(max_attempts, default_max_attempts),
               clock, alk._sat_add(clock, expires), coalesce(visibility_timeout_s, default_visibility_timeout_s),
               coalesce(backoff_base_s, default_backoff_base_s), dead_letter_retention_s
        FROM unnest(payloads) WITH ORDINALITY AS p(payload, ord)
        ORDER BY p.ord
        RETURNING alk.jobs.id
    )
    -- Identity values are drawn in insertion order, so id order is input order.
    SELECT inserted.id FROM inserted ORDER BY inserted.id;
    -- alk._wake's check, written out here: the hot path pays no call frame
    -- for it (the protocol in the wake-ups section above). A later statement
    -- than the insert: a fresh snapshot under READ COMMITTED. The EXISTS
    -- keeps a busy queue (no adverts) to one index probe, no lock.
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM pg_catalog.pg_notify(alk._queue_channel(_enqueue.queue), '');
    ELSIF EXISTS (SELECT FROM alk.idle_workers w WHERE w.queue = _enqueue.queue) THEN
        DELETE FROM alk.idle_workers w
         WHERE w.ctid = ANY (ARRAY(SELECT v.ctid FROM alk.idle_workers v WHERE v.queue = _enqueue.queue
                                     FOR UPDATE SKIP LOCKED));
        -- Took one: notify. Saw only adverts others hold: their holders'
        -- commits cover us; alk._wake_held waits briefly to know they commit.
        IF FOUND OR NOT alk._wake_held(_enqueue.queue) THEN
            PERFORM pg_catalog.pg_notify(alk._queue_channel(_enqueue.queue), '');
        END IF;
    END IF;
END
$$;
COMMENT ON FUNCTION alk._enqueue(text, jsonb[], bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint) IS
'internal: insert jobs with resolved stamps and wake idle workers; the batch forms and the scheduler call it';

-- One job, optionally deduplicated: every single-job enqueue form calls it
-- with resolved stamps and a validated queue name.
CREATE FUNCTION alk._enqueue_one(
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
    p_dedup_key text
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
    IF p_dedup_key IS NULL THEN
        INSERT INTO alk.jobs (queue, payload, priority, run_at, max_attempts, created_at, expires_at,
                              visibility_timeout_s, backoff_base_s, dead_letter_retention_s)
        VALUES (p_queue, p_payload, p_priority,
                CASE WHEN p_delay IS NOT NULL THEN alk._sat_add(p_clock, p_delay)
                     WHEN p_run_at IS NOT NULL THEN p_run_at ELSE p_clock END,
                p_max_attempts, p_clock, alk._sat_add(p_clock, p_expires),
                p_visibility_timeout_s, p_backoff_base_s, p_dead_letter_retention_s)
        RETURNING alk.jobs.id INTO v_id;
    ELSE
        PERFORM alk._name_ok('dedup_key', p_dedup_key, true);
        LOOP
            -- The unique index decides: a concurrent enqueue of the same key
            -- waits for ours (or we for it) and then does nothing.
            INSERT INTO alk.jobs (queue, payload, priority, run_at, max_attempts, created_at, expires_at,
                                  visibility_timeout_s, backoff_base_s, dead_letter_retention_s, dedup_key)
            VALUES (p_queue, p_payload, p_priority,
                    CASE WHEN p_delay IS NOT NULL THEN alk._sat_add(p_clock, p_delay)
                         WHEN p_run_at IS NOT NULL THEN p_run_at ELSE p_clock END,
                    p_max_attempts, p_clock, alk._sat_add(p_clock, p_expires),
                    p_visibility_timeout_s, p_backoff_base_s, p_dead_letter_retention_s, p_dedup_key)
            ON CONFLICT (queue, dedup_key) WHERE dedup_key IS NOT NULL AND state <> 'dead' DO NOTHING
            RETURNING alk.jobs.id INTO v_id;
            EXIT WHEN v_id IS NOT NULL;
            -- Held: return the holder's id and write nothing (no wake-up
            -- either). Should the holder have gone since, insert again.
            SELECT j.id INTO v_id FROM alk.jobs j
             WHERE j.queue = p_queue AND j.dedup_key = p_dedup_key AND j.state <> 'dead';
            IF v_id IS NOT NULL THEN
                RETURN v_id;
            END IF;
        END LOOP;
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
COMMENT ON FUNCTION alk._enqueue_one(text, jsonb, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, text) IS
'internal: insert one job with resolved stamps (or return the live holder of its dedup key) and wake idle workers';

CREATE FUNCTION alk.enqueue(
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
    dedup_key text DEFAULT NULL
)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT alk._enqueue_one(alk._name_ok('queue', $1, false), $2, alk.now(), $3, $4, coalesce($5, 0),
                            coalesce($6, 3), $7, coalesce($8, 300), coalesce($9, 5), $10, $11)
$$;
COMMENT ON FUNCTION alk.enqueue(text, jsonb, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, text) IS
'Enqueue one job; returns its id. Ready time: delay (seconds from now) wins over run_at (absolute unix seconds); '
'neither means now. expires is a TTL in seconds from now. Stamps default to 300 s visibility, 3 attempts, 5 s backoff base, '
'dead rows kept forever. dedup_key: while a live (pending or processing) job of this queue holds the key, nothing is '
'written and that job''s id is returned; NULL: no dedup. '
'Example: SELECT alk.enqueue(queue => ''emails'', payload => ''{"to": 1}'', delay => 30, dedup_key => ''welcome:1'');';

CREATE FUNCTION alk.enqueue_batch(
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
    dedup_keys text[] DEFAULT NULL
)
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock bigint := alk.now();
    q text := alk._name_ok('queue', enqueue_batch.queue, false);
BEGIN
    IF dedup_keys IS NULL THEN
        RETURN QUERY SELECT * FROM alk._enqueue(q, payloads, clock,
            delay, enqueue_batch.run_at, enqueue_batch.priority, enqueue_batch.max_attempts,
            expires, enqueue_batch.visibility_timeout_s, enqueue_batch.backoff_base_s,
            enqueue_batch.dead_letter_retention_s, 300, 3, 5);
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
            enqueue_batch.dead_letter_retention_s, dedup_keys[i]);
    END LOOP;
END
$$;
COMMENT ON FUNCTION alk.enqueue_batch(text, jsonb[], bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, text[]) IS
'Enqueue several jobs in one call with the same options; returns their ids in input order. dedup_keys, when given, '
'holds one key (or NULL) per payload, with alk.enqueue''s rule: a key held by a live job, or by an earlier payload of '
'the same batch, writes nothing and returns the holder''s id. '
'Example: SELECT * FROM alk.enqueue_batch(''emails'', ARRAY[''{"to": 1}'', ''{"to": 2}'']::jsonb[], priority => 5);';

-- claim ---------------------------------------------------------------------

-- The claim rule, once: alk.claim and the outbox's claim call it with a
-- validated queue name (plain or reserved).
CREATE FUNCTION alk._claim(queue text, worker_id text, n bigint)
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
              WHERE j.queue = _claim.queue AND j.state = 'pending'
              ORDER BY j.priority DESC LIMIT 1)
            UNION ALL
            SELECT (SELECT j.priority FROM alk.jobs j
                     WHERE j.queue = _claim.queue AND j.state = 'pending' AND j.priority < p.priority
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
                 WHERE j.queue = _claim.queue AND j.state = 'pending'
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
            UPDATE alk.jobs j
               SET state = 'dead', died_at = clock,
                   purge_at = alk._purge_at(clock, j.dead_letter_retention_s),
                   last_error = CASE WHEN j.attempts - j.attempts_refunded >= j.max_attempts
                                     THEN 'max attempts exceeded' ELSE 'expired' END
             WHERE j.id = ANY (dead) AND j.queue = _claim.queue;
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
                   c.attempts_refunded
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

CREATE FUNCTION alk.claim(queue text, worker_id text, n bigint DEFAULT 1)
RETURNS SETOF alk.job
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT * FROM alk._claim(alk._name_ok('queue', $1, false), $2, $3)
$$;
COMMENT ON FUNCTION alk.claim(text, text, bigint) IS
'Claim up to n due jobs for worker_id, in order priority DESC, run_at, id. Each claimed job is processing, '
'leased until now + visibility_timeout_s, with attempts + 1 (the fencing token for ack/retry/fail/heartbeat). '
'Due jobs out of attempts (attempts - attempts_refunded >= max_attempts) or past expiry become dead instead. '
'n <= 0 claims nothing; a paused queue (alk.pause_queue) claims nothing. '
'Example: SELECT id, attempts, payload FROM alk.claim(''emails'', ''worker-1'', 10);';

-- operations on a claimed job -----------------------------------------------

-- The settlement rule, once: ack, retry and fail of claimed jobs, each under
-- the validity predicate, applied in one statement; one row per input in
-- input order with the state it led to ('acked', 'pending', 'dead') or NULL
-- when refused. A job id repeated in one batch: its first entry is applied,
-- later ones are refused.
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
                            errs text[], delays bigint[])
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
        RETURNING c.queue
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

-- alk.ack and alk.ack_batch apply _settle's all-ack rule in one statement of
-- their own: the rule (delete under alk._holds; a repeated id's first entry
-- only) and the count (one upsert of this backend's minute row per queue, the
-- prune when it opens a minute) exactly as _settle's statements, without the
-- per-input result rows neither needs. Measured at one job, server side:
-- 147 against 218 us per ack through _settle; at 100, about 2.1 against
-- 2.7 ms per claim + ack_batch.
CREATE FUNCTION alk.ack(job_id bigint, worker_id text, attempt bigint DEFAULT NULL, queue text DEFAULT NULL)
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
BEGIN
    WITH acked AS (
        DELETE FROM alk.jobs j
         WHERE j.id = ack.job_id AND (ack.queue IS NULL OR j.queue = ack.queue)
           AND alk._holds(j, wid, ack.attempt, clock)
        RETURNING j.queue
    ), counted AS (
        INSERT INTO alk.queue_counts AS c (queue, minute, backend, acked)
        SELECT a.queue, this_minute, pg_catalog.pg_backend_pid(), 1 FROM acked a
        ON CONFLICT ON CONSTRAINT queue_counts_pkey DO UPDATE SET acked = c.acked + excluded.acked
        RETURNING c.queue
    )
    SELECT true INTO done FROM counted;
    RETURN done IS NOT NULL;
END
$$;
COMMENT ON FUNCTION alk.ack(bigint, text, bigint, text) IS
'Acknowledge a claimed job: it is deleted. False, and nothing changes, unless the job is processing, held by worker_id '
'under claim attempt (the fencing token the claim returned; NULL skips that check) and its lease has not lapsed '
'(claim_expires_at >= now). worker_id follows the name rule (LK001). queue is optional routing for sharded deployments. '
'Example: SELECT alk.ack(job_id => 42, worker_id => ''worker-1'', attempt => 1);';

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
BEGIN
    IF ack_batch.attempts IS NOT NULL AND cardinality(ack_batch.attempts) <> coalesce(cardinality(ack_batch.job_ids), 0) THEN
        -- _settle raises the LK002 that names the arrays.
        PERFORM alk._settle(ack_batch.queue, ack_batch.worker_id, ack_batch.job_ids, ack_batch.attempts, NULL, NULL, NULL);
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
        RETURNING j.queue
    ), counted AS (
        INSERT INTO alk.queue_counts AS c (queue, minute, backend, acked)
        SELECT a.queue, this_minute, pg_catalog.pg_backend_pid(), count(*) FROM acked a GROUP BY a.queue
        ON CONFLICT ON CONSTRAINT queue_counts_pkey DO UPDATE SET acked = c.acked + excluded.acked
        RETURNING c.queue
    )
    SELECT count(*) INTO n_acked FROM acked;
    RETURN n_acked;
END
$$;
COMMENT ON FUNCTION alk.ack_batch(bigint[], text, bigint[], text) IS
'Acknowledge several claimed jobs in one call; returns how many were validly held (and are now deleted). '
'attempts, when given, holds each job''s fencing token in the same order. '
'Example: SELECT alk.ack_batch(ARRAY[41, 42], ''worker-1'', ARRAY[1, 1]);';

CREATE FUNCTION alk.settle(job_ids bigint[], worker_id text, attempts bigint[] DEFAULT NULL,
                           outcomes text[] DEFAULT NULL, errs text[] DEFAULT NULL, delays bigint[] DEFAULT NULL,
                           queue text DEFAULT NULL)
RETURNS TABLE (job_id bigint, attempt bigint, state text)
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT * FROM alk._settle($7, $2, $1, $3, $4, $5, $6)
$$;
COMMENT ON FUNCTION alk.settle(bigint[], text, bigint[], text[], text[], bigint[], text) IS
'Settle several claimed jobs in one call and one transaction. Arrays aligned with job_ids: attempts (fencing tokens), '
'outcomes (''ack'', ''retry'' or ''fail''; NULL: all ack), errs (the error of a retry or fail) and delays (a retry''s '
'delay; NULL: the row''s backoff curve). One row per job id, in input order, with the state it led to: ''acked'' '
'(deleted), ''pending'' (retried), ''dead'' (failed, or retried with its attempts spent), or NULL when the claim was '
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
     WHERE j.id = job_id AND (heartbeat.queue IS NULL OR j.queue = heartbeat.queue)
       AND alk._holds(j, wid, attempt, clock);
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION alk.heartbeat(bigint, text, bigint, bigint, text) IS
'Extend a claimed job''s lease to now + extend seconds (the row''s visibility_timeout_s when NULL). True when the '
'claim was valid at call time; a negative extend leaves a lapsed lease that voids the claim on the next op. '
'Example: SELECT alk.heartbeat(42, ''worker-1'', 1, 600);';

CREATE FUNCTION alk.release_jobs(job_ids bigint[], worker_id text, attempts bigint[], queue text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock bigint := alk.now();
    wid text := alk._name_ok('worker_id', release_jobs.worker_id, true);
    released bigint;
    queues text[];
BEGIN
    IF attempts IS NOT NULL AND cardinality(attempts) <> cardinality(job_ids) THEN
        PERFORM alk._raise('LK002', 'attempts must have one entry per job id: got ' || cardinality(job_ids)
            || ' job_ids and ' || cardinality(attempts) || ' attempts');
    END IF;
    -- Pending again at its place in claim order (run_at kept), with the
    -- claim's attempt refunded; attempts itself stays, so the token the
    -- claim issued is dead for good.
    WITH r AS (
        UPDATE alk.jobs j
           SET state = 'pending', worker_id = NULL, claimed_at = NULL, claim_expires_at = NULL,
               attempts_refunded = j.attempts_refunded + 1
          FROM unnest(release_jobs.job_ids, release_jobs.attempts) AS w(id, attempt)
         WHERE j.id = w.id AND (release_jobs.queue IS NULL OR j.queue = release_jobs.queue)
           AND alk._holds(j, wid, w.attempt, clock)
        RETURNING j.queue
    )
    SELECT count(*), array_agg(DISTINCT r.queue) INTO released, queues FROM r;
    PERFORM alk._wake(q.name) FROM unnest(queues) AS q(name);
    RETURN released;
END
$$;
COMMENT ON FUNCTION alk.release_jobs(bigint[], text, bigint[], text) IS
'Give claimed jobs that never started back at once: pending, due at their old place in claim order, without spending '
'an attempt (attempts_refunded + 1). attempts holds each job''s fencing token (NULL: skip that check); the validity '
'predicate of alk.ack applies and the token stays invalid for good (the next claim issues attempts + 1). Returns how '
'many were released. Example: SELECT alk.release_jobs(ARRAY[41, 42], ''worker-1'', ARRAY[1, 1]);';

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
    attempts_refunded bigint
);
COMMENT ON TYPE alk.settle_claim_row IS
'A row of alk.settle_and_claim: kind ''settled'' (id, queue, attempts = the token given, state = what it led to or '
'NULL when refused) or ''claimed'' (a whole alk.job).';

CREATE FUNCTION alk.settle_and_claim(queue text, worker_id text, n bigint, job_ids bigint[] DEFAULT NULL,
                                     attempts bigint[] DEFAULT NULL, outcomes text[] DEFAULT NULL,
                                     errs text[] DEFAULT NULL, delays bigint[] DEFAULT NULL)
RETURNS SETOF alk.settle_claim_row
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    -- Append runs its branches in order: every settlement is applied before
    -- the claim looks, all in the caller's one transaction.
    SELECT 'settled'::text, s.job_id, $1, s.state, NULL::jsonb, NULL::bigint, NULL::bigint, s.attempt,
           NULL::bigint, NULL::text, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint,
           NULL::bigint, NULL::bigint, NULL::text, NULL::bigint, NULL::text, NULL::bigint
      FROM alk._settle(alk._name_ok('queue', $1, false), $2, $4, $5, $6, $7, $8) s
    UNION ALL
    SELECT 'claimed'::text, c.* FROM alk._claim(alk._name_ok('queue', $1, false), $2, $3) c
$$;
COMMENT ON FUNCTION alk.settle_and_claim(text, text, bigint, bigint[], bigint[], text[], text[], bigint[]) IS
'One call, one transaction: settle a batch of this queue''s claimed jobs exactly as alk.settle does, then claim up to '
'n as alk.claim does. Returns flat rows: first one kind = ''settled'' row per settlement in input order (id, queue, '
'attempts = the token given, state = ''acked'', ''pending'', ''dead'' or NULL when refused; other columns NULL), then '
'kind = ''claimed'' rows, whole jobs in claim order. '
'Example: SELECT kind, id, state, attempts, payload FROM alk.settle_and_claim(''emails'', ''worker-1'', 10, '
'ARRAY[41, 42], ARRAY[1, 1], ARRAY[''ack'', ''fail''], ARRAY[NULL, ''ValueError: bad address'']);';

-- operations by id --------------------------------------------------------

CREATE FUNCTION alk.cancel(queue text, job_id bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM alk._check_name('queue', cancel.queue);
    DELETE FROM alk.jobs j WHERE j.queue = cancel.queue AND j.id = job_id AND j.state <> 'dead';
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION alk.cancel(text, bigint) IS
'Delete a pending or processing job whatever its lease; true if a row went. Dead jobs stay for inspection. '
'Example: SELECT alk.cancel(''emails'', 42);';

CREATE FUNCTION alk._get_job(queue text, job_id bigint)
RETURNS SETOF alk.job
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
ROWS 1
AS $$
    SELECT j.id, j.queue, j.state, j.payload, j.priority, j.run_at, j.attempts, j.max_attempts, j.worker_id,
           j.claimed_at, j.claim_expires_at, j.created_at, j.expires_at, j.visibility_timeout_s,
           j.backoff_base_s, j.dead_letter_retention_s, j.last_error, j.died_at, j.dedup_key,
           j.attempts_refunded
      FROM alk.jobs j WHERE j.queue = $1 AND j.id = $2
$$;
COMMENT ON FUNCTION alk._get_job(text, bigint) IS 'internal: get_job for an already validated queue name';

-- A set of at most one row rather than a composite: a missing job is zero
-- rows in SELECT * FROM form (pgx's ErrNoRows, an empty rows array in Node)
-- and NULL as a scalar subquery, never a row of NULL fields.
CREATE FUNCTION alk.get_job(queue text, job_id bigint)
RETURNS SETOF alk.job
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
ROWS 1
AS $$
    SELECT * FROM alk._get_job(alk._name_ok('queue', $1, false), $2)
$$;
COMMENT ON FUNCTION alk.get_job(text, bigint) IS
'The whole job row in any state, dead included; no row when there is no such job (NULL as a scalar subquery). '
'Example: SELECT * FROM alk.get_job(''emails'', 42); SELECT (SELECT alk.get_job(''emails'', 42)) IS NULL;';

CREATE FUNCTION alk._sweep_expired(queue text)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock bigint := alk.now();
    expired bigint;
    purged bigint;
BEGIN
    -- Waiting rows past expiry, and processing rows past expiry whose lease
    -- lapsed; a row with a valid lease is left to its owner.
    UPDATE alk.jobs j
       SET state = 'dead', last_error = 'expired', died_at = clock,
           purge_at = alk._purge_at(clock, j.dead_letter_retention_s)
     WHERE j.queue = _sweep_expired.queue
       AND j.expires_at IS NOT NULL AND j.expires_at <= clock
       AND (j.state = 'pending' OR (j.state = 'processing' AND j.claim_expires_at < clock));
    GET DIAGNOSTICS expired = ROW_COUNT;
    -- Dead rows past their retention.
    DELETE FROM alk.jobs j
     WHERE j.queue = _sweep_expired.queue
       AND j.state = 'dead'
       AND j.purge_at <= clock;
    GET DIAGNOSTICS purged = ROW_COUNT;
    RETURN expired + purged;
END
$$;
COMMENT ON FUNCTION alk._sweep_expired(text) IS 'internal: sweep_expired for an already validated queue name';

CREATE FUNCTION alk.sweep_expired(queue text)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN alk._sweep_expired(alk._check_name('queue', queue));
END
$$;
COMMENT ON FUNCTION alk.sweep_expired(text) IS
'Bury expired waiting jobs (and expired jobs whose lease lapsed) as dead with ''expired'', and delete dead jobs whose '
'died_at <= now - dead_letter_retention_s. Returns how many rows it changed. Example: SELECT alk.sweep_expired(''emails'');';

-- what a worker needs: observability and redrive (0007, docs/worker.md) ------
--
-- Wake-ups, sleeping exactly long enough, observability and redrive:
--   * alk.next_claim_at(queue): when alk.claim can next return a row;
--   * alk.queue_stats(queue): counts by state, lag and next due time;
--   * alk.list_jobs(queue, state, n, after_id): inspection, paged by id;
--   * alk.requeue_dead(queue, job_ids): dead jobs back to pending.
--
-- Wake-ups are the queue's own (above): every enqueue notifies
-- alk.queue_channel(queue) at commit. These add what a worker does
-- with them: when to claim next, stats, inspection and redrive.

-- next_claim_at -------------------------------------------------------------

CREATE FUNCTION alk.next_claim_at(queue text)
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
          WHERE j.queue = next_claim_at.queue AND j.state = 'pending'
          ORDER BY j.priority DESC LIMIT 1)
        UNION ALL
        SELECT (SELECT j.priority FROM alk.jobs j
                 WHERE j.queue = next_claim_at.queue AND j.state = 'pending' AND j.priority < p.priority
                 ORDER BY j.priority DESC LIMIT 1)
          FROM priorities p WHERE p.priority IS NOT NULL
    )
    SELECT min((SELECT j.run_at FROM alk.jobs j
                 WHERE j.queue = next_claim_at.queue AND j.state = 'pending' AND j.priority = p.priority
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

-- queue_stats ---------------------------------------------------------------

CREATE TYPE alk.queue_stat AS (
    queue text,
    pending bigint,
    ready bigint,
    scheduled bigint,
    processing bigint,
    lapsed bigint,
    dead bigint,
    oldest_ready_age_s bigint,
    next_run_at bigint,
    paused boolean,
    estimated boolean
);
COMMENT ON TYPE alk.queue_stat IS 'One queue''s row of alk.queue_stats.';

CREATE FUNCTION alk._estimate_jobs(queue text, kind text, clock bigint)
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
                'WHERE j.queue = $1 AND j.state = ''pending'' AND j.run_at <= $2' INTO plan USING queue, clock;
    WHEN 'scheduled' THEN
        EXECUTE 'EXPLAIN (FORMAT JSON) SELECT FROM alk.jobs j '
                'WHERE j.queue = $1 AND j.state = ''pending'' AND j.run_at > $2' INTO plan USING queue, clock;
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
    END CASE;
    RETURN round((plan -> 0 -> 'Plan' ->> 'Plan Rows')::numeric)::bigint;
END
$$;
COMMENT ON FUNCTION alk._estimate_jobs(text, text, bigint) IS
'internal: the planner''s estimate of how many of a queue''s jobs are ready, scheduled, processing, lapsed or dead '
'(alk.queue_stats past its exact_limit)';

CREATE FUNCTION alk.queue_stats(queue text DEFAULT NULL, exact_limit bigint DEFAULT NULL)
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
    -- Every row is in exactly one of the three partial indexes (pending,
    -- processing, dead), and each leads with the queue: the queue names come
    -- from a loose scan of the three (three index probes per queue, whatever
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
            (SELECT j.queue FROM alk.jobs j WHERE j.state = 'pending' AND j.queue > n.name ORDER BY j.queue LIMIT 1),
            (SELECT j.queue FROM alk.jobs j WHERE j.state = 'processing' AND j.queue > n.name
              ORDER BY j.queue LIMIT 1),
            (SELECT j.queue FROM alk.jobs j WHERE j.state = 'dead' AND j.queue > n.name ORDER BY j.queue LIMIT 1))
          FROM names n WHERE n.name IS NOT NULL AND only_queue IS NULL
    ),
    -- MATERIALIZED: inlined, each count would run once per mention below.
    capped AS MATERIALIZED (
        SELECT n.name,
               (SELECT count(*) FROM (SELECT FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'pending'
                                         AND j.run_at <= clock LIMIT cap + 1) e) AS ready,
               (SELECT count(*) FROM (SELECT FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'pending'
                                         AND j.run_at > clock LIMIT cap + 1) e) AS scheduled,
               (SELECT count(*) FROM (SELECT FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'processing'
                                       LIMIT cap + 1) e) AS processing,
               (SELECT count(*) FROM (SELECT FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'processing'
                                         AND j.claim_expires_at < clock LIMIT cap + 1) e) AS lapsed,
               (SELECT count(*) FROM (SELECT FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'dead'
                                       LIMIT cap + 1) e) AS dead
          FROM names n
         WHERE n.name IS NOT NULL AND n.name <> '' AND (NOT alk._limits_active() OR alk._in_scope(n.name))
    ),
    counted AS MATERIALIZED (
        SELECT c.name,
               CASE WHEN c.ready > cap THEN greatest(alk._estimate_jobs(c.name, 'ready', clock), cap + 1)
                    ELSE c.ready END AS ready,
               CASE WHEN c.scheduled > cap THEN greatest(alk._estimate_jobs(c.name, 'scheduled', clock), cap + 1)
                    ELSE c.scheduled END AS scheduled,
               CASE WHEN c.processing > cap THEN greatest(alk._estimate_jobs(c.name, 'processing', clock), cap + 1)
                    ELSE c.processing END AS processing,
               CASE WHEN c.lapsed > cap THEN greatest(alk._estimate_jobs(c.name, 'lapsed', clock), cap + 1)
                    ELSE c.lapsed END AS lapsed,
               CASE WHEN c.dead > cap THEN greatest(alk._estimate_jobs(c.name, 'dead', clock), cap + 1)
                    ELSE c.dead END AS dead,
               coalesce(greatest(c.ready, c.scheduled, c.processing, c.lapsed, c.dead) > cap, false) AS estimated
          FROM capped c
    )
    SELECT c.name, c.ready + c.scheduled, c.ready, c.scheduled, c.processing,
           -- Two estimates may disagree: never more lapsed than processing.
           least(c.lapsed, c.processing), c.dead,
           alk._sat_sub(clock, t.oldest_ready), t.next_run_at,
           EXISTS (SELECT FROM alk.paused_queues pq WHERE pq.queue = c.name), c.estimated
      FROM counted c
     CROSS JOIN LATERAL (
        WITH RECURSIVE priorities(priority) AS (
            (SELECT j.priority FROM alk.jobs j WHERE j.queue = c.name AND j.state = 'pending'
              ORDER BY j.priority DESC LIMIT 1)
            UNION ALL
            SELECT (SELECT j.priority FROM alk.jobs j WHERE j.queue = c.name AND j.state = 'pending'
                       AND j.priority < p.priority ORDER BY j.priority DESC LIMIT 1)
              FROM priorities p WHERE p.priority IS NOT NULL
        )
        SELECT min((SELECT j.run_at FROM alk.jobs j WHERE j.queue = c.name AND j.state = 'pending'
                       AND j.priority = p.priority AND j.run_at <= clock ORDER BY j.run_at LIMIT 1)) AS oldest_ready,
               min((SELECT j.run_at FROM alk.jobs j WHERE j.queue = c.name AND j.state = 'pending'
                       AND j.priority = p.priority AND j.run_at > clock ORDER BY j.run_at LIMIT 1)) AS next_run_at
          FROM priorities p WHERE p.priority IS NOT NULL) t
     ORDER BY c.name;
END
$$;
COMMENT ON FUNCTION alk.queue_stats(text, bigint) IS
'One row per queue (every queue holding a job, reserved outbox queues included; or only the given queue, even when '
'empty): pending (= ready + scheduled), ready (pending and due), scheduled (pending, run_at in the future), '
'processing (leased, lapsed included), lapsed (lease ended: claimable again), dead, oldest_ready_age_s (now minus '
'the earliest run_at of a ready job: the queue''s lag; NULL when none is ready), next_run_at (the earliest run_at '
'of a scheduled job; NULL when none), paused (alk.pause_queue) and estimated. Every count is exact unless '
'exact_limit is given: then a count stops after exact_limit + 1 index entries and, past exact_limit, is the '
'planner''s estimate (from the table''s statistics, which ANALYZE and autovacuum keep current), never below '
'exact_limit + 1, and estimated is true. The ages are exact either way. Cost: index-only scans of the partial '
'indexes, linear in the entries counted: with exact_limit at most about 5 x exact_limit per queue '
'(docs/dashboard.md has numbers). Example: SELECT * FROM alk.queue_stats(exact_limit => 10000);';

-- list_jobs -----------------------------------------------------------------

CREATE FUNCTION alk.list_jobs(queue text, state text DEFAULT NULL, n bigint DEFAULT 100, after_id bigint DEFAULT NULL)
RETURNS SETOF alk.job
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
BEGIN
    PERFORM alk._check_name('queue', list_jobs.queue);
    IF state IS NOT NULL AND state NOT IN ('pending', 'processing', 'dead') THEN
        PERFORM alk._raise('LK002', 'state must be pending, processing, dead or NULL, got ' || alk._show(state));
    END IF;
    -- An extent: n <= 0 (or NULL) lists nothing, never "all rows".
    IF n IS NULL OR n <= 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT j.id, j.queue, j.state, j.payload, j.priority, j.run_at, j.attempts, j.max_attempts, j.worker_id,
           j.claimed_at, j.claim_expires_at, j.created_at, j.expires_at, j.visibility_timeout_s,
           j.backoff_base_s, j.dead_letter_retention_s, j.last_error, j.died_at, j.dedup_key,
           j.attempts_refunded
      FROM alk.jobs j
     WHERE j.queue = list_jobs.queue
       AND (state IS NULL OR j.state = state)
       AND j.id > coalesce(after_id, -9223372036854775808)
     ORDER BY j.id
     LIMIT n;
END
$$;
COMMENT ON FUNCTION alk.list_jobs(text, text, bigint, bigint) IS
'Up to n jobs of a queue in id order, optionally only one state (pending, processing or dead), after the id '
'after_id (keyset paging: pass the last id you saw). Whole rows, as alk.get_job returns them. n <= 0 lists nothing. '
'Example: SELECT id, attempts, last_error, died_at FROM alk.list_jobs(''emails'', state => ''dead'', n => 20);';

-- requeue_dead --------------------------------------------------------------

CREATE FUNCTION alk.requeue_dead(queue text, job_ids bigint[] DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    clock bigint := alk.now();
    moved bigint;
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
        UPDATE alk.jobs j
           SET state = 'pending', run_at = clock, attempts_refunded = j.attempts,
               worker_id = NULL, claimed_at = NULL, claim_expires_at = NULL,
               last_error = NULL, died_at = NULL, purge_at = NULL,
               expires_at = alk._sat_add(clock, alk._sat_sub(j.expires_at, j.created_at))
         WHERE j.queue = requeue_dead.queue AND j.state = 'dead'
           AND (j.dedup_key IS NULL OR (
                NOT EXISTS (SELECT FROM alk.jobs h WHERE h.queue = j.queue AND h.dedup_key = j.dedup_key
                                                     AND h.state <> 'dead')
                AND j.id = (SELECT min(d.id) FROM alk.jobs d WHERE d.queue = j.queue AND d.dedup_key = j.dedup_key
                                                              AND d.state = 'dead')));
    ELSE
        UPDATE alk.jobs j
           SET state = 'pending', run_at = clock, attempts_refunded = j.attempts,
               worker_id = NULL, claimed_at = NULL, claim_expires_at = NULL,
               last_error = NULL, died_at = NULL, purge_at = NULL,
               expires_at = alk._sat_add(clock, alk._sat_sub(j.expires_at, j.created_at))
         WHERE j.queue = requeue_dead.queue AND j.state = 'dead' AND j.id = ANY (job_ids)
           AND (j.dedup_key IS NULL OR (
                NOT EXISTS (SELECT FROM alk.jobs h WHERE h.queue = j.queue AND h.dedup_key = j.dedup_key
                                                     AND h.state <> 'dead')
                AND j.id = (SELECT min(d.id) FROM alk.jobs d WHERE d.queue = j.queue AND d.dedup_key = j.dedup_key
                                                              AND d.state = 'dead' AND d.id = ANY (job_ids))));
    END IF;
    GET DIAGNOSTICS moved = ROW_COUNT;
    IF moved > 0 THEN
        PERFORM alk._wake(requeue_dead.queue);
    END IF;
    RETURN moved;
END
$$;
COMMENT ON FUNCTION alk.requeue_dead(text, bigint[]) IS
'Send dead jobs back to pending, due now, with every attempt spent so far refunded (attempts_refunded = attempts, '
'so the job has max_attempts again and no earlier fencing token becomes valid), no worker and no last_error; every '
'dead job of the queue when job_ids is NULL, else those of job_ids that are dead in this queue (others are ignored). '
'A dead job whose dedup_key a live job holds stays dead (of several with one key, the first moves). An expiring job '
'gets its TTL again from now. Returns how many moved; idle workers are woken. '
'Example: SELECT alk.requeue_dead(''emails''); SELECT alk.requeue_dead(''emails'', ARRAY[41, 42]);';

-- pause and resume ------------------------------------------------------------

CREATE FUNCTION alk.pause_queue(queue text)
RETURNS boolean
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH paused AS (
        INSERT INTO alk.paused_queues (queue, paused_at)
        VALUES (alk._name_ok('queue', $1, false), alk.now())
        ON CONFLICT (queue) DO NOTHING
        RETURNING 1
    )
    SELECT EXISTS (SELECT FROM paused)
$$;
COMMENT ON FUNCTION alk.pause_queue(text) IS
'Pause a queue: its claims (alk.claim, alk.settle_and_claim) return nothing and alk.next_claim_at is NULL until '
'alk.resume_queue; enqueue, ack, retry, fail, heartbeat and sweeps work as usual. True when it was not paused. '
'Example: SELECT alk.pause_queue(''emails'');';

CREATE FUNCTION alk.resume_queue(queue text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q text := alk._name_ok('queue', resume_queue.queue, false);
BEGIN
    DELETE FROM alk.paused_queues p WHERE p.queue = q;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    -- Every listener of the queue: idle workers claim again at commit.
    PERFORM pg_catalog.pg_notify(alk._queue_channel(q), '');
    RETURN true;
END
$$;
COMMENT ON FUNCTION alk.resume_queue(text) IS
'Resume a paused queue and notify its channel at commit, so waiting workers claim again. True when it was paused. '
'Example: SELECT alk.resume_queue(''emails'');';

-- browse_jobs ---------------------------------------------------------------

CREATE TYPE alk.job_brief AS (
    id bigint,
    queue text,
    state text,
    priority bigint,
    run_at bigint,
    attempts bigint,
    max_attempts bigint,
    worker_id text,
    claimed_at bigint,
    claim_expires_at bigint,
    created_at bigint,
    expires_at bigint,
    last_error text,
    died_at bigint,
    payload_preview text,
    payload_bytes bigint
);
COMMENT ON TYPE alk.job_brief IS
'A job as a listing shows it: the alk.job columns but the payload, which is cut to payload_preview (its JSON text) '
'with payload_bytes its full size; last_error is cut to the same length.';

-- One page of one state in claim order. The key (priority DESC, run_at, id)
-- mixes directions, which a row comparison cannot express, so the page after
-- a key is two index ranges: the rest of the key's priority, then the lower
-- priorities. Both walk jobs_claim_pending in order for pending rows; the
-- other states have no index in that order and are sorted (bounded by the
-- queue's rows in that state).
CREATE FUNCTION alk._browse_jobs(queue text, state text, n bigint, after_priority bigint, after_run_at bigint,
                                 after_id bigint, preview_chars bigint)
RETURNS SETOF alk.job_brief
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT b.* FROM (
        (SELECT j.id, j.queue, j.state, j.priority::bigint, j.run_at, j.attempts::bigint, j.max_attempts::bigint,
                j.worker_id, j.claimed_at, j.claim_expires_at, j.created_at, j.expires_at,
                pg_catalog.left(j.last_error, preview_chars::integer), j.died_at,
                pg_catalog.left(j.payload::text, preview_chars::integer),
                pg_catalog.octet_length(j.payload::text)::bigint
           FROM alk.jobs j
          WHERE j.queue = _browse_jobs.queue AND j.state = _browse_jobs.state
            AND _browse_jobs.after_priority IS NULL
          ORDER BY j.priority DESC, j.run_at, j.id
          LIMIT _browse_jobs.n)
        UNION ALL
        (SELECT j.id, j.queue, j.state, j.priority::bigint, j.run_at, j.attempts::bigint, j.max_attempts::bigint,
                j.worker_id, j.claimed_at, j.claim_expires_at, j.created_at, j.expires_at,
                pg_catalog.left(j.last_error, preview_chars::integer), j.died_at,
                pg_catalog.left(j.payload::text, preview_chars::integer),
                pg_catalog.octet_length(j.payload::text)::bigint
           FROM alk.jobs j
          WHERE j.queue = _browse_jobs.queue AND j.state = _browse_jobs.state
            AND j.priority = _browse_jobs.after_priority AND (j.run_at, j.id) > (_browse_jobs.after_run_at, _browse_jobs.after_id)
          ORDER BY j.priority DESC, j.run_at, j.id
          LIMIT _browse_jobs.n)
        UNION ALL
        (SELECT j.id, j.queue, j.state, j.priority::bigint, j.run_at, j.attempts::bigint, j.max_attempts::bigint,
                j.worker_id, j.claimed_at, j.claim_expires_at, j.created_at, j.expires_at,
                pg_catalog.left(j.last_error, preview_chars::integer), j.died_at,
                pg_catalog.left(j.payload::text, preview_chars::integer),
                pg_catalog.octet_length(j.payload::text)::bigint
           FROM alk.jobs j
          WHERE j.queue = _browse_jobs.queue AND j.state = _browse_jobs.state
            AND j.priority < _browse_jobs.after_priority
          ORDER BY j.priority DESC, j.run_at, j.id
          LIMIT _browse_jobs.n)
    ) b
    ORDER BY b.priority DESC, b.run_at, b.id
    LIMIT _browse_jobs.n
$$;
COMMENT ON FUNCTION alk._browse_jobs(text, text, bigint, bigint, bigint, bigint, bigint) IS
'internal: one keyset page of one state of a queue in claim order';

CREATE FUNCTION alk.browse_jobs(queue text, state text DEFAULT 'pending', n bigint DEFAULT 50,
                                after_priority bigint DEFAULT NULL, after_run_at bigint DEFAULT NULL,
                                after_id bigint DEFAULT NULL, preview_chars bigint DEFAULT 200)
RETURNS SETOF alk.job_brief
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
BEGIN
    -- Read-only, so reserved names (outbox backing queues) are accepted.
    PERFORM alk._check_name('queue', browse_jobs.queue, true);
    IF state IS NULL OR state NOT IN ('pending', 'processing', 'dead') THEN
        PERFORM alk._raise('LK002', 'state must be pending, processing or dead, got ' || alk._show(state));
    END IF;
    IF (after_priority IS NULL) <> (after_run_at IS NULL) OR (after_priority IS NULL) <> (after_id IS NULL) THEN
        PERFORM alk._raise('LK002', 'after_priority, after_run_at and after_id go together (the last row''s key), '
            || 'got ' || coalesce(after_priority::text, 'NULL') || ', ' || coalesce(after_run_at::text, 'NULL')
            || ', ' || coalesce(after_id::text, 'NULL'));
    END IF;
    IF preview_chars IS NULL OR preview_chars < 0 OR preview_chars > 1000000 THEN
        PERFORM alk._raise('LK002', 'preview_chars must be 0 to 1000000, got ' || coalesce(preview_chars::text, 'NULL'));
    END IF;
    -- An extent: n <= 0 (or NULL) lists nothing, never "all rows".
    IF n IS NULL OR n <= 0 THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM alk._browse_jobs(browse_jobs.queue, state, n, after_priority, after_run_at, after_id,
                                               preview_chars);
END
$$;
COMMENT ON FUNCTION alk.browse_jobs(text, text, bigint, bigint, bigint, bigint, bigint) IS
'Up to n jobs of one state (pending, processing or dead) of a queue, in claim order (priority DESC, run_at, id), '
'after the key (after_priority, after_run_at, after_id) of the last row you saw: keyset paging, no OFFSET. Payloads '
'and last_error come cut to preview_chars characters, with payload_bytes the full size (alk.get_job has the whole '
'row). Pending rows are read from the claim index in order; processing and dead rows are sorted. n <= 0 lists '
'nothing. Example: SELECT id, priority, run_at, payload_preview FROM alk.browse_jobs(''emails'', ''pending'', 20); '
'then the next page: SELECT * FROM alk.browse_jobs(''emails'', ''pending'', 20, after_priority => 0, '
'after_run_at => 1700000000, after_id => 41);';

-- throughput ----------------------------------------------------------------

-- Settled jobs per queue and minute, one row per (queue, minute, backend),
-- written by alk._settle (every ack, ack_batch, settle, retry, fail and
-- settle_and_claim) in the settling statement itself. The backend's pid is
-- unique among live sessions, so two workers never update the same row: a
-- settle holds its row's lock until its commit, and with one row per backend
-- nobody waits for another's WAL flush. A backend touches its row once per
-- settle call and queue (once per batch, never per job), and the rows per
-- hour are bounded by queues x 60 x connections that settled. A queue's rows
-- past a day go when any backend opens a new minute of that queue.
CREATE TABLE alk.queue_counts (
    queue text NOT NULL,
    minute bigint NOT NULL,
    backend integer NOT NULL,
    acked bigint NOT NULL DEFAULT 0,
    retried bigint NOT NULL DEFAULT 0,
    dead bigint NOT NULL DEFAULT 0,
    CONSTRAINT queue_counts_pkey PRIMARY KEY (queue, minute, backend)
) WITH (fillfactor = 70);
COMMENT ON TABLE alk.queue_counts IS
'Settled jobs per queue, minute and backend, for alk.queue_throughput. Private: use the alk.* functions.';

-- Retention, once for every settle statement: a new row is a minute opened
-- for a queue (once a minute per backend and queue; an upsert that only adds
-- to its row fires nothing). It drops that queue's rows past a day, gone
-- backends' too, at most 1000 a time in queue_counts_pkey order, skipping
-- rows another backend's prune has locked (nobody waits).
CREATE FUNCTION alk._prune_counts()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM alk.queue_counts c
     WHERE c.ctid = ANY (ARRAY(
         SELECT o.ctid FROM alk.queue_counts o
          WHERE o.queue = NEW.queue AND o.minute < alk._sat_sub(NEW.minute, 86400)
          ORDER BY o.minute LIMIT 1000
            FOR UPDATE SKIP LOCKED));
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION alk._prune_counts() IS
'internal: alk.queue_counts'' insert trigger: drop the queue''s counter rows past a day (at most 1000, skip locked)';
CREATE TRIGGER queue_counts_prune AFTER INSERT ON alk.queue_counts FOR EACH ROW EXECUTE FUNCTION alk._prune_counts();

CREATE TYPE alk.throughput AS (
    queue text,
    bucket_at bigint,
    acked bigint,
    retried bigint,
    dead bigint
);
COMMENT ON TYPE alk.throughput IS 'One queue''s settled jobs in one time bucket, as alk.queue_throughput returns them.';

CREATE FUNCTION alk.queue_throughput(queue text DEFAULT NULL, since bigint DEFAULT NULL, bucket_s bigint DEFAULT 60)
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

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
