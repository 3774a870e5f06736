-- pyalk 0024: workers. The registry of running workers and stop from anywhere (issue 27): alk.worker_register,
-- alk.worker_beat, alk.worker_deregister (worker kind), alk.workers() (reader) and alk.request_stop (admin), with
-- the table alk.worker_registry and the row type alk.worker; the rules live in sql/workers.sql.

CREATE TYPE alk.worker AS (
    worker_id text,
    queue text,
    host text,
    pid bigint,
    started_at bigint,
    last_seen_at bigint,
    running bigint,
    concurrency bigint,
    version text,
    stopping boolean,
    gone boolean
);
COMMENT ON TYPE alk.worker IS
'A registered worker as alk.workers() returns it; gone is derived: silent for longer than the silence bound.';

CREATE TABLE alk.worker_registry (
    worker_id text NOT NULL,
    queue text NOT NULL,
    host text,
    pid bigint,
    started_at bigint NOT NULL,
    last_seen_at bigint NOT NULL,
    running bigint NOT NULL DEFAULT 0,
    concurrency bigint NOT NULL,
    version text,
    stopping boolean NOT NULL DEFAULT false,
    CONSTRAINT worker_registry_pkey PRIMARY KEY (worker_id)
);
COMMENT ON TABLE alk.worker_registry IS
'One row per running worker (private: alk.worker_register, alk.worker_beat, alk.workers and alk.request_stop).';

-- The two bounds -------------------------------------------------------------

CREATE FUNCTION alk._worker_silence_s()
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT 30::bigint $$;
COMMENT ON FUNCTION alk._worker_silence_s() IS
'internal: seconds without a beat after which alk.workers() shows a worker as gone (six missed beats of 5 s)';

CREATE FUNCTION alk._worker_prune_s()
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT 3600::bigint $$;
COMMENT ON FUNCTION alk._worker_prune_s() IS
'internal: seconds without a beat after which the next register or beat of any worker deletes a worker''s row';

-- Helpers ----------------------------------------------------------------------

-- Whether the session user may see a worker of this queue: every worker
-- while no role has name limits (alk._limits_active folds to false).
CREATE FUNCTION alk._worker_in_scope(queue text)
RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT NOT alk._limits_active() OR alk._in_scope(queue) $$;
COMMENT ON FUNCTION alk._worker_in_scope(text) IS
'internal: whether the session user''s name limits reach a worker of this queue (true without limits)';

CREATE FUNCTION alk._worker_channel(worker_id text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT alk._channel('alk_w_', worker_id) $$;
COMMENT ON FUNCTION alk._worker_channel(text) IS 'internal: the control channel of a worker id (no name check)';

-- Delete the rows of workers silent past the prune horizon. SKIP LOCKED: a
-- row another session is writing (its own beat, a concurrent prune) is left
-- for the next one, so no register or beat ever waits on another.
CREATE FUNCTION alk._prune_workers(clock bigint)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    pruned bigint;
BEGIN
    DELETE FROM alk.worker_registry w
     WHERE w.worker_id = ANY (ARRAY(
         SELECT o.worker_id FROM alk.worker_registry o
          WHERE o.last_seen_at < alk._sat_sub(clock, alk._worker_prune_s())
            FOR UPDATE SKIP LOCKED));
    GET DIAGNOSTICS pruned = ROW_COUNT;
    RETURN pruned;
END
$$;
COMMENT ON FUNCTION alk._prune_workers(bigint) IS
'internal: delete the registry rows silent for longer than the prune horizon at clock; returns how many went';

CREATE FUNCTION alk._check_count(argument text, value bigint, least_value bigint)
RETURNS bigint
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF value IS NULL OR value < least_value THEN
        PERFORM alk._raise('LK002', argument || ' must be a number of at least ' || least_value || ', got '
            || coalesce(value::text, 'NULL'));
    END IF;
    RETURN value;
END
$$;
COMMENT ON FUNCTION alk._check_count(text, bigint, bigint) IS
'internal: LK002 unless value is a count of at least least_value (NULL refused)';

-- The optional routing argument of beat, deregister and request_stop.
CREATE FUNCTION alk._check_optional_queue(queue text)
RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT CASE WHEN queue IS NULL THEN NULL ELSE alk._check_name('queue', queue, true) END $$;
COMMENT ON FUNCTION alk._check_optional_queue(text) IS
'internal: NULL, or queue when it is a valid name (reserved allowed; else LK001, or LK005 outside name limits)';

CREATE FUNCTION alk._check_label(argument text, value text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF pg_catalog.octet_length(value) > 1024 THEN
        PERFORM alk._raise('LK002', argument || ' must be at most 1024 bytes long, got '
            || pg_catalog.octet_length(value) || ' bytes: ' || alk._show(value));
    END IF;
    RETURN value;
END
$$;
COMMENT ON FUNCTION alk._check_label(text, text) IS
'internal: LK002 unless value (a free-form label such as a host or version; NULL allowed) is at most 1024 bytes';

-- register ---------------------------------------------------------------------

CREATE FUNCTION alk.worker_register(worker_id text, queue text, host text, pid bigint, concurrency bigint,
                                    version text)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock bigint := alk.now();
    wid text := alk._check_name('worker_id', worker_register.worker_id, true);
    queue_name text := alk._check_name('queue', worker_register.queue, true);
    host_label text := alk._check_label('host', worker_register.host);
    version_label text := alk._check_label('version', worker_register.version);
    slots bigint := alk._check_count('concurrency', worker_register.concurrency, 1);
    registered text;
BEGIN
    IF worker_register.pid < 0 THEN
        PERFORM alk._raise('LK002', 'pid must be NULL or at least 0, got ' || worker_register.pid);
    END IF;
    PERFORM alk._prune_workers(clock);
    -- A restart under the same id replaces the row: a new life, not a beat.
    -- The row of a queue outside the caller's name limits is not its to take.
    INSERT INTO alk.worker_registry AS w
           (worker_id, queue, host, pid, started_at, last_seen_at, running, concurrency, version, stopping)
    VALUES (wid, queue_name, host_label, worker_register.pid, clock, clock, 0, slots, version_label, false)
    ON CONFLICT ON CONSTRAINT worker_registry_pkey DO UPDATE
       SET queue = excluded.queue, host = excluded.host, pid = excluded.pid, started_at = excluded.started_at,
           last_seen_at = excluded.last_seen_at, running = 0, concurrency = excluded.concurrency,
           version = excluded.version, stopping = false
     WHERE alk._worker_in_scope(w.queue)
    RETURNING w.worker_id INTO registered;
    IF registered IS NULL THEN
        PERFORM alk._raise('LK005', 'worker_id ' || alk._show(wid) || ' is registered for a queue outside the names '
            || 'role ' || alk._show(session_user::text) || ' may use');
    END IF;
    RETURN alk._worker_channel(wid);
END
$$;
COMMENT ON FUNCTION alk.worker_register(text, text, text, bigint, bigint, text) IS
'Register a running worker: one row in the registry that alk.workers() lists, replacing the row of the same '
'worker_id (a restart: started_at and last_seen_at now, running 0, stopping false). Returns the worker''s control '
'channel: LISTEN on it for ''stop'' (alk.request_stop) and, later, ''cancel <job_id>''; ignore other payloads. '
'worker_id follows the worker-id rule and queue the name rule, reserved names allowed (LK001); concurrency must be '
'at least 1, pid NULL or at least 0, host and version NULL or at most 1024 bytes (LK002); nothing is written on an '
'error. Also deletes the rows of workers silent for longer than an hour. '
'Example: LISTEN on the result of SELECT alk.worker_register(''w-1'', ''emails'', ''web-3'', 4242, 8, ''node-alk 1.2'');';

-- beat -------------------------------------------------------------------------

CREATE FUNCTION alk.worker_beat(worker_id text, running bigint, queue text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock bigint := alk.now();
    wid text := alk._check_name('worker_id', worker_beat.worker_id, true);
    held bigint := alk._check_count('running', worker_beat.running, 0);
    only_queue text := alk._check_optional_queue(worker_beat.queue);
    stop_asked boolean;
BEGIN
    UPDATE alk.worker_registry w
       SET last_seen_at = clock, running = held
     WHERE w.worker_id = wid AND (only_queue IS NULL OR w.queue = only_queue)
       AND alk._worker_in_scope(w.queue)
    RETURNING w.stopping INTO stop_asked;
    PERFORM alk._prune_workers(clock);
    RETURN stop_asked;
END
$$;
COMMENT ON FUNCTION alk.worker_beat(text, bigint, text) IS
'A registered worker''s beat, every few seconds (5 s keeps it well inside the 30 s silence bound): stamps '
'last_seen_at and running (the jobs it holds now, at least 0, else LK002) and returns stopping: true means drain and '
'exit (alk.request_stop asked); NULL means the row is gone (pruned or deregistered): register again. queue is '
'optional routing for sharded deployments (a row of another queue counts as gone). Also deletes the rows of workers silent for longer than an hour. '
'Example: SELECT alk.worker_beat(''w-1'', running => 3);';

-- deregister -------------------------------------------------------------------

CREATE FUNCTION alk.worker_deregister(worker_id text, queue text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    wid text := alk._check_name('worker_id', worker_deregister.worker_id, true);
    only_queue text := alk._check_optional_queue(worker_deregister.queue);
BEGIN
    DELETE FROM alk.worker_registry w
     WHERE w.worker_id = wid AND (only_queue IS NULL OR w.queue = only_queue) AND alk._worker_in_scope(w.queue);
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION alk.worker_deregister(text, text) IS
'Remove a worker''s row, as it exits: true if it was registered. queue is optional routing for sharded deployments. '
'Example: SELECT alk.worker_deregister(''w-1'');';

-- workers ----------------------------------------------------------------------

CREATE FUNCTION alk.workers()
RETURNS SETOF alk.worker
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock bigint := alk.now();
BEGIN
    RETURN QUERY
    SELECT w.worker_id, w.queue, w.host, w.pid, w.started_at, w.last_seen_at, w.running, w.concurrency, w.version,
           w.stopping, w.last_seen_at < alk._sat_sub(clock, alk._worker_silence_s())
      FROM alk.worker_registry w
     WHERE alk._worker_in_scope(w.queue)
     ORDER BY w.worker_id;
END
$$;
COMMENT ON FUNCTION alk.workers() IS
'Every registered worker, by worker_id: worker_id, queue, host, pid, started_at, last_seen_at (its last '
'beat), running (jobs it held then), concurrency, version (its client''s), stopping (alk.request_stop asked) and '
'gone (no beat for more than 30 s: it died or lost the database; its row is deleted after an hour). A role with '
'name limits sees the workers of its queues only. Reads only. Example: SELECT worker_id, queue, running, gone '
'FROM alk.workers();';

-- request_stop -----------------------------------------------------------------

CREATE FUNCTION alk.request_stop(worker_id text, queue text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    wid text := alk._check_name('worker_id', request_stop.worker_id, true);
    only_queue text := alk._check_optional_queue(request_stop.queue);
BEGIN
    UPDATE alk.worker_registry w SET stopping = true
     WHERE w.worker_id = wid AND (only_queue IS NULL OR w.queue = only_queue) AND alk._worker_in_scope(w.queue);
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    -- Sent again on a repeated request: harmless, and it reaches a worker
    -- that was not listening the first time.
    PERFORM pg_catalog.pg_notify(alk._worker_channel(wid), 'stop');
    RETURN true;
END
$$;
COMMENT ON FUNCTION alk.request_stop(text, text) IS
'Ask a registered worker to stop: sets its stopping flag and, at commit, notifies its control channel (the one '
'alk.worker_register returned) with the payload ''stop''. The worker stops claiming, finishes or hands back what it '
'holds within its grace and exits; a worker not listening learns at its next beat. True if the worker was '
'registered (false, nothing sent, otherwise). queue is optional routing for sharded deployments. Example: SELECT alk.request_stop(''w-1'');';

-- security: the role lists carry the new functions, and the grant functions' comments name them.

CREATE OR REPLACE FUNCTION alk._role_functions()
RETURNS TABLE (kind text, function_name text)
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT l.kind, l.function_name FROM (VALUES
        -- every kind: the clock and the schema check a client runs at connect
        ('base', 'now'), ('base', 'pinned_clock'), ('base', 'schema_info'),
        -- reader: inspection only (pyalk status, pyalk jobs, dashboards)
        ('reader', 'get_job'), ('reader', 'list_jobs'), ('reader', 'queue_stats'), ('reader', 'next_claim_at'),
        ('reader', 'outbox_get_job'), ('reader', 'read_since'), ('reader', 'get_offset'),
        ('reader', 'stream_channel'), ('reader', 'get_lock'), ('reader', 'get_schedule'),
        ('reader', 'list_schedules'), ('reader', 'cron_next'),
        -- the dashboard's and exporter's reads (0011)
        ('reader', 'browse_jobs'), ('reader', 'browse_events'), ('reader', 'stream_stats'),
        ('reader', 'stream_consumer_lag'), ('reader', 'queue_throughput'), ('reader', 'schedule_overview'),
        ('reader', 'list_locks'),
        -- the registry of running workers (0024)
        ('reader', 'workers'),
        -- producer: write work and events, and look at what it wrote
        ('producer', 'enqueue'), ('producer', 'enqueue_batch'), ('producer', 'outbox_enqueue'),
        ('producer', 'outbox_enqueue_batch'), ('producer', 'publish'), ('producer', 'publish_batch'),
        ('producer', 'get_job'), ('producer', 'outbox_get_job'),
        -- worker: claim and settle jobs (pyalk worker, outbox delivery),
        -- consume streams with checkpoints, hold its own locks
        ('worker', 'claim'), ('worker', 'ack'), ('worker', 'ack_batch'), ('worker', 'retry'), ('worker', 'fail'),
        ('worker', 'heartbeat'), ('worker', 'release_jobs'), ('worker', 'settle_and_claim'), ('worker', 'settle'),
        -- idle workers advertise themselves so enqueues wake them (docs/design.md)
        ('worker', 'wait_for_jobs'), ('worker', 'wake_fence'), ('worker', 'stop_waiting'),
        ('worker', 'next_claim_at'), ('worker', 'queue_channel'), ('worker', 'get_job'),
        -- pyalk worker checks the queue name with list_jobs(queue, n => 1) before it starts
        ('worker', 'list_jobs'),
        ('worker', 'outbox_claim'), ('worker', 'outbox_get_job'),
        ('worker', 'read_since'), ('worker', 'read_from_consumer'), ('worker', 'save_offset'),
        ('worker', 'get_offset'), ('worker', 'stream_channel'),
        ('worker', 'try_lock'), ('worker', 'renew_lock'), ('worker', 'release_lock'), ('worker', 'get_lock'),
        -- a running worker keeps its row in the registry (0024)
        ('worker', 'worker_register'), ('worker', 'worker_beat'), ('worker', 'worker_deregister'),
        -- admin: everything above (alk._kind_functions adds it) and these
        ('admin', 'cancel'), ('admin', 'sweep_expired'), ('admin', 'outbox_sweep_expired'), ('admin', 'trim_to'),
        ('admin', 'requeue_dead'), ('admin', 'pause_queue'), ('admin', 'resume_queue'),
        ('admin', 'schedule'), ('admin', 'unschedule'), ('admin', 'tick'), ('admin', 'scheduler_tick'),
        -- stop a worker from anywhere (0024)
        ('admin', 'request_stop'),
        -- the scheduler's leader loop holds the reserved lock alk:scheduler
        ('admin', '_try_lock'), ('admin', '_renew_lock'), ('admin', '_release_lock'),
        ('admin', 'grant_reader'), ('admin', 'grant_producer'), ('admin', 'grant_worker'), ('admin', 'grant_admin'),
        ('admin', 'revoke_all'), ('admin', 'role_grants'), ('admin', 'role_functions'),
        ('admin', 'limit_names'), ('admin', 'name_limits')
    ) AS l(kind, function_name)
$$;
COMMENT ON FUNCTION alk._role_functions() IS
'internal: the function names each role kind gets (base goes to every kind; admin also gets every other kind''s)';

COMMENT ON FUNCTION alk.grant_reader(text) IS
'Let role inspect: the clock, schema_info, get_job, list_jobs, queue_stats, next_claim_at, read_since, get_offset, '
'get_lock, get_schedule, list_schedules, cron_next, workers (what pyalk status and pyalk jobs run). Grants USAGE on '
'schema alk and EXECUTE on each; idempotent; returns how many functions it granted. The role must exist (LK002). '
'Example: SELECT alk.grant_reader(''dashboard'');';

COMMENT ON FUNCTION alk.grant_worker(text) IS
'Let role work: claim, ack, ack_batch, retry, fail, heartbeat, next_claim_at, queue_channel, get_job, list_jobs, outbox_claim, '
'read_since, read_from_consumer, save_offset, get_offset, try_lock, renew_lock, release_lock, get_lock, '
'worker_register, worker_beat, worker_deregister and the clock '
'(what pyalk worker and outbox delivery run). Idempotent; returns how many functions it granted. '
'Example: SELECT alk.grant_worker(''job_runner'');';

COMMENT ON FUNCTION alk.grant_admin(text) IS
'Let role administer: every reader, producer and worker function, plus cancel, sweep_expired, trim_to, requeue_dead, '
'request_stop, schedule, unschedule, tick, the scheduler''s leader lock and the grant functions. Not the clock privilege '
'(alk.clock_privilege(), which only its owner grants). Idempotent; returns how many functions it granted. '
'Example: SELECT alk.grant_admin(''ops'');';

-- Roles granted a kind before this version get its new functions.
SELECT alk._regrant();

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
