-- pyalk queue, its tables and the rules every other part shares (docs/contract.md#queue).
--
-- sql/queue/ is the queue's current definition, cut by concern; a fresh
-- install runs its files in name order (pyalk/schema/install.py,
-- current_files), an upgrade runs the version files, and tests/migrations
-- proves both give the same catalog. Edit here, then add a version file
-- (docs/migrations.md). Order: tables, wake-ups, enqueue, claim, settle,
-- control, observe, throughput; each file's statements need only what an
-- earlier file made (PL/pgSQL bodies resolve at run time: settle's write
-- 80_throughput.sql's counters).
--
-- First because every other part reads these tables and rules. Landed in
-- 0002_queue.sql; 0009_queue.sql widened the integers and added dedup keys,
-- refunded attempts, paused_queues and idle_workers; 0012 and 0019 changed
-- alk._holds; 0026 added headers, results, completed jobs and queue_settings.

-- One table holds every job in every queue. A job is pending (waiting for its
-- run_at), processing (leased to a worker until claim_expires_at), dead
-- (kept for inspection until its retention lapses) or completed (acked on a
-- queue with a completed-job retention, kept with its result until that
-- lapses). cancel deletes; ack deletes unless the queue keeps completed jobs.
--
-- The table is partitioned by slot (docs/design.md, "Job storage"): new jobs
-- go to the current one of two rotating slots, 0 and 1; alk.rotate_jobs
-- moves the current slot's live rows into the other slot, its dead and
-- completed rows into slot 2 (jobs_kept), and empties it with TRUNCATE. A
-- claim walks the index entries its slot gathered since the last rotation,
-- not every job the queue ever ran, and TRUNCATE gives the space back even
-- while some snapshot holds VACUUM back. Every function reads and writes
-- through the parent: which slot a row sits in is the rotation's business.

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
    attempts_refunded bigint,
    headers jsonb,
    result jsonb,
    completed_at bigint,
    group_key text
);
COMMENT ON TYPE alk.job IS 'A job as every queue function returns it: the resolved row, never the enqueuer''s raw options.';

-- Which rotating slot takes new jobs, where the last rotation found the id
-- sequence (how many jobs the current slot has taken since), and the slot a
-- rotation still empties. One row, written by rotations only.
CREATE TABLE alk.job_slots (
    only_row boolean NOT NULL DEFAULT true,
    current_slot bigint NOT NULL DEFAULT 0,
    rotated_at_id bigint NOT NULL DEFAULT 0,
    rotated_at bigint,
    rotations bigint NOT NULL DEFAULT 0,
    -- The live jobs the last rotation moved into the current slot (0038):
    -- settled there, they leave entries a claim walks past as the slot's own
    -- jobs do, so they count toward the next rotation.
    moved_in bigint NOT NULL DEFAULT 0,
    CONSTRAINT job_slots_pkey PRIMARY KEY (only_row),
    CONSTRAINT job_slots_one_row CHECK (only_row),
    CONSTRAINT job_slots_rotating CHECK (current_slot IN (0, 1)),
    -- The slot a rotation still empties, a step at a time, after new jobs
    -- went to the other one (0044); NULL: none.
    draining_slot bigint,
    CONSTRAINT job_slots_draining_other CHECK (draining_slot IS NULL OR draining_slot = 1 - current_slot)
);
COMMENT ON TABLE alk.job_slots IS
'The slot of alk.jobs that takes new jobs, and the last rotation. Private: use alk.rotate_jobs.';
INSERT INTO alk.job_slots DEFAULT VALUES;

-- A restore of the extension install: CREATE EXTENSION writes the row above,
-- then pg_restore copies the dumped one (job_slots is dump data, so the slots
-- come back as the jobs sit in them: a live job holding a dedup key is in the
-- current slot, where a keyed enqueue looks). The copy replaces the row
-- rather than failing on its key. Nothing else inserts into this table.
CREATE FUNCTION alk._job_slots_replaced()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM alk.job_slots;
    RETURN NEW;
END
$$;
COMMENT ON FUNCTION alk._job_slots_replaced() IS
'internal: trigger: an insert into alk.job_slots replaces its one row (a restore copying the dumped row)';
CREATE TRIGGER job_slots_replaced BEFORE INSERT ON alk.job_slots
    FOR EACH ROW EXECUTE FUNCTION alk._job_slots_replaced();
COMMENT ON TRIGGER job_slots_replaced ON alk.job_slots IS
'A restore''s copy of the dumped row replaces the row CREATE EXTENSION wrote (alk._job_slots_replaced).';

CREATE FUNCTION alk._job_slot()
RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT s.current_slot FROM alk.job_slots s
$$;
COMMENT ON FUNCTION alk._job_slot() IS 'internal: the rotating slot of alk.jobs that takes new jobs';

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
    -- When a dead or completed row's retention ends (alk._purge_at); NULL:
    -- kept forever.
    purge_at bigint,
    -- While a live (pending or processing) job holds it, an enqueue with the
    -- same key in the same queue writes nothing (jobs_dedup). NULL: no dedup.
    dedup_key text,
    -- Claims given back (release_jobs: one; requeue_dead: all). The attempts
    -- a job has spent, which claimability, burial and backoff count, are
    -- attempts - attempts_refunded.
    attempts_refunded bigint NOT NULL DEFAULT 0,
    -- Opaque metadata that travels with the job (trace context, correlation
    -- ids): a JSON object or NULL, as enqueued.
    headers jsonb,
    -- What the ack stored, and when: completed rows only (queue_settings).
    result jsonb,
    completed_at bigint,
    -- What a pending job waits for before a claim may look at it: n > 0, as
    -- many listed after jobs (its rows in alk.job_after; 0028); -1, its
    -- serial group's turn (parked, 38_group_turns.sql; 0032); 0, nothing.
    -- Only a job at 0 is in jobs_claim_pending, so waiting jobs cost a claim
    -- nothing.
    after_left bigint NOT NULL DEFAULT 0,
    -- Some job was enqueued after this one: its ack, cancel, completion or
    -- death looks in alk.job_after (alk._after_sync); unset, it never does.
    awaited boolean NOT NULL DEFAULT false,
    -- The job's serial group (alk.set_queue_limits' max_running_per_group):
    -- at most that many (default 1) of a queue's jobs with one key run at a
    -- time. NULL: no group.
    group_key text,
    -- The partition the row sits in (alk.job_slots): 0 or 1 for the rotating
    -- slots, 2 for dead and completed rows a rotation moved out of them.
    slot bigint NOT NULL DEFAULT alk._job_slot(),
    -- Claimed while its queue had max_running (set by every claim, and by
    -- alk.set_queue_limits on the queue's processing jobs; 0032): settling
    -- it frees a slot, so the settle looks for idle workers to wake
    -- (alk._wake_freed). Unset, an ack never looks.
    under_max_running boolean NOT NULL DEFAULT false,
    -- The key holds the queue so the table can be hash-distributed by queue,
    -- and the slot because a partitioned table's key must; id leads it so ops
    -- by id (ack, retry, ...) are one probe of each slot's index.
    CONSTRAINT jobs_pkey PRIMARY KEY (id, queue, slot),
    CONSTRAINT jobs_state_known CHECK (state IN ('pending', 'processing', 'dead', 'completed')),
    CONSTRAINT jobs_queue_named CHECK (queue <> '')
    -- Cross-column rules (a processing job has a lease, a dead one died_at,
    -- a completed one completed_at)
    -- are the functions' to keep: CHECKs cost every insert and claim ~10 us
    -- each, and the table has no other writer. The SQL tests pin them.
) PARTITION BY LIST (slot);
COMMENT ON TABLE alk.jobs IS 'Every job of every queue. Private: use the alk.* functions.';
CREATE TABLE alk.jobs_0 PARTITION OF alk.jobs FOR VALUES IN (0);
COMMENT ON TABLE alk.jobs_0 IS 'Rotating slot 0 of alk.jobs (alk.rotate_jobs). Private: use the alk.* functions.';
CREATE TABLE alk.jobs_1 PARTITION OF alk.jobs FOR VALUES IN (1);
COMMENT ON TABLE alk.jobs_1 IS 'Rotating slot 1 of alk.jobs (alk.rotate_jobs). Private: use the alk.* functions.';
CREATE TABLE alk.jobs_kept PARTITION OF alk.jobs FOR VALUES IN (2);
-- Live (pending, processing) jobs are never kept: the claim, settle,
-- give-back, cancel, serial-group and keyed-enqueue statements say
-- slot <> 2, and the planner leaves this partition out of their plans, with
-- no lock, probe or executor setup for it (0035). A revived job goes back
-- to the current slot in the statement that revives it (requeue_dead,
-- alk._after_revive): the row moves out before this check could see it.
-- NOT VALID, as 0035 adds it: it binds every row written from then on, and
-- validating would scan the whole kept slot under an exclusive lock during
-- an upgrade; rotations have only ever moved dead and completed rows here.
ALTER TABLE alk.jobs_kept ADD CONSTRAINT jobs_kept_settled CHECK (state IN ('dead', 'completed')) NOT VALID;
COMMENT ON TABLE alk.jobs_kept IS
'Dead and completed jobs a rotation moved out of the rotating slots. Private: use the alk.* functions.';

-- The claim path: due pending jobs in claim order. Partial, so processing
-- and dead rows, and pending jobs still waiting on their after jobs, never
-- cost a claim anything.
CREATE INDEX jobs_claim_pending ON alk.jobs (queue, priority DESC, run_at, id)
    WHERE state = 'pending' AND after_left = 0;
-- Pending jobs waiting on their after jobs (after_left > 0) or parked
-- (-1), by run_at: queue_stats counts them index-only (parked ones as ready
-- or scheduled, by run_at). Empty unless dependencies or groups are used.
CREATE INDEX jobs_waiting ON alk.jobs (queue, after_left, run_at) WHERE state = 'pending' AND after_left <> 0;
-- Lapsed leases (crashed workers) are found by their deadline.
CREATE INDEX jobs_claim_lapsed ON alk.jobs (queue, claim_expires_at) WHERE state = 'processing';
-- Expiry and retention sweeps.
CREATE INDEX jobs_expiring ON alk.jobs (queue, expires_at) WHERE expires_at IS NOT NULL AND state <> 'dead';
-- Dead rows, by the end of their retention: the sweep reads only those due.
CREATE INDEX jobs_dead ON alk.jobs (queue, purge_at) WHERE state = 'dead';
-- Completed rows, the same way. Its own index rather than jobs_dead widened:
-- queue_stats counts each state index-only from its own partial index, and a
-- queue without retention never writes an entry here.
CREATE INDEX jobs_completed ON alk.jobs (queue, purge_at) WHERE state = 'completed';
-- One live job per dedup key and queue; dead and completed rows keep their
-- key for inspection without holding it. Enqueues insert with ON CONFLICT on
-- it, so concurrent enqueues of one key leave one row, never a
-- read-then-write race. A partitioned table's unique index must hold the
-- slot: it is unique per slot, and one slot holds every live keyed job
-- because a keyed enqueue and a rotation never overlap (alk._rotation_lock).
CREATE UNIQUE INDEX jobs_dedup ON alk.jobs (queue, dedup_key, slot)
    WHERE dedup_key IS NOT NULL AND state IN ('pending', 'processing');

-- Serial groups (40_claim.sql): a grouped candidate is claimable only while
-- its group has room, which the claim asks of these two, per candidate. Both
-- partial on group_key IS NOT NULL, so queues without groups never write an
-- entry. Processing jobs by group: is the group busy?
CREATE INDEX jobs_group_running ON alk.jobs (queue, group_key) WHERE state = 'processing' AND group_key IS NOT NULL;
-- Pending jobs by group in claim order: is a due job of the group ahead?
-- Jobs waiting on their after jobs or parked are never ahead
-- (alk._group_has_room).
CREATE INDEX jobs_group_pending ON alk.jobs (queue, group_key, priority DESC, run_at, id)
    WHERE state = 'pending' AND group_key IS NOT NULL AND after_left = 0;
-- Parked jobs by group in claim order (38_group_turns.sql): a group's turns
-- are found here and in jobs_group_pending.
CREATE INDEX jobs_group_parked ON alk.jobs (queue, group_key, priority DESC, run_at, id)
    WHERE state = 'pending' AND after_left = -1;

-- Paused queues (alk.pause_queue): a claim probes this by primary key.
CREATE TABLE alk.paused_queues (
    queue text NOT NULL,
    paused_at bigint NOT NULL,
    CONSTRAINT paused_queues_pkey PRIMARY KEY (queue)
);
COMMENT ON TABLE alk.paused_queues IS 'Queues whose claims return nothing until resumed. Private: use alk.pause_queue.';

-- Per-queue settings (alk.set_queue_retention). A row exists only while a
-- setting differs from its default, so an ack probes an empty table unless
-- some queue keeps completed jobs.
CREATE TABLE alk.queue_settings (
    queue text NOT NULL,
    -- Seconds an acked job stays as completed (> 0; 0, the default, is no row).
    completed_s bigint NOT NULL,
    CONSTRAINT queue_settings_pkey PRIMARY KEY (queue)
);
COMMENT ON TABLE alk.queue_settings IS
'Per-queue settings that differ from the defaults (completed-job retention). Private: use alk.set_queue_retention.';

-- Dependencies (alk.enqueue's after; 0028): one row per waiting job and job
-- it waits for, in the same queue. A row goes when the job waited for is
-- acked, cancelled, completed or purged (alk._after_sync), and stays while
-- it is dead, so requeue_dead brings the waiting job back still waiting.
-- Empty unless dependencies are used: every probe of it is then one index
-- probe of an empty table.
CREATE TABLE alk.job_after (
    -- The job waited for.
    after_id bigint NOT NULL,
    -- The waiting job.
    job_id bigint NOT NULL,
    queue text NOT NULL,
    CONSTRAINT job_after_pkey PRIMARY KEY (after_id, job_id)
);
COMMENT ON TABLE alk.job_after IS 'Which job waits for which (alk.enqueue''s after). Private: use alk.enqueue.';
-- Per-queue limits (alk.set_queue_limits). A row exists only while some
-- limit is set, so a claim of a queue without limits costs one probe of an
-- empty (or tiny) table; a queue with a row is claimed under its lock
-- (alk._claim_budget).
CREATE TABLE alk.limited_queues (
    queue text NOT NULL,
    -- Each NULL (no limit) or > 0; rate and rate_period_s set together.
    max_running bigint,
    rate bigint,
    rate_period_s bigint,
    max_running_per_group bigint,
    CONSTRAINT limited_queues_pkey PRIMARY KEY (queue)
);
COMMENT ON TABLE alk.limited_queues IS
'Per-queue claim limits (max running, rate, per-group running). Private: use alk.set_queue_limits.';

-- The rate window of each rate-limited queue: a fixed window opened by the
-- first claim after the previous one ended, lasting rate_period_s seconds,
-- and the claims made in it. Written by claims of rate-limited queues only
-- (under the queue's claim lock); no other queue ever touches it.
CREATE TABLE alk.queue_rate_windows (
    queue text NOT NULL,
    started_at bigint NOT NULL,
    claims bigint NOT NULL,
    CONSTRAINT queue_rate_windows_pkey PRIMARY KEY (queue)
);
COMMENT ON TABLE alk.queue_rate_windows IS
'The current rate window of each rate-limited queue: when it opened and how many claims it has had. Private.';

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

-- A slot drains and refills all day: vacuum it early and often so dead
-- index entries from claims and acks do not pile up between rotations.
-- (Storage parameters are the partitions', not the parent's.)
ALTER TABLE alk.jobs_0 SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 500,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02
);
ALTER TABLE alk.jobs_1 SET (
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

-- Headers are a JSON object or SQL NULL: callers test the cheap case inline
-- and call this only to raise.
CREATE FUNCTION alk._check_headers(headers jsonb)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF headers IS NOT NULL AND pg_catalog.jsonb_typeof(headers) <> 'object' THEN
        PERFORM alk._raise('LK002', 'headers must be a JSON object or NULL, got '
            || pg_catalog.jsonb_typeof(headers) || ' ' || alk._show(headers::text));
    END IF;
    RETURN headers;
END
$$;
COMMENT ON FUNCTION alk._check_headers(jsonb) IS 'internal: LK002 unless headers is a JSON object or NULL';
