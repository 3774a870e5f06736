-- pyalk workers: the registry of running workers, and stop from anywhere
-- (docs/contract.md#flow-control-and-operations; docs/clients.md says how a
-- worker in any language takes part).
--
-- current definition; edit here, then add a version file (docs/migrations.md).
-- Landed as 0024_workers.sql (0027: alk.cancel sends the cancel verb); a
-- fresh install runs this file, an upgrade runs the version files, and
-- tests/migrations proves both give the same catalog.
--
-- One row per running worker, written once at start (alk.worker_register)
-- and once per beat (alk.worker_beat, every few seconds), never per job: the
-- hot path (claim, ack) does not touch it. The rules, in one place:
--   * register inserts the row, or replaces it when the id is registered
--     already (a restart under the same id: started_at anew, running 0,
--     stopping reset), and returns the worker's NOTIFY channel;
--   * a beat stamps last_seen_at and running and returns stopping; NULL
--     means the row is gone (pruned or deregistered): register again;
--   * deregister removes the row (a worker that stops cleanly);
--   * a worker silent for longer than the silence bound (alk._worker_silence_s,
--     30 s: six missed beats of 5 s) shows as gone in alk.workers(); one
--     silent for longer than the prune horizon (alk._worker_prune_s, 1 hour)
--     is deleted by the next register or beat of any worker. Both bounds
--     live in those two functions and nowhere else.
--   * request_stop sets stopping and notifies the worker's channel at commit,
--     so a listening worker learns at once and a deaf one at its next beat.
--
-- The control channel: alk._channel('alk_w_', worker_id), 38 bytes whatever
-- the id, returned by register. Payload grammar: a verb, optionally a space
-- and one argument:
--     payload  := verb [ ' ' argument ]
--     'stop'                 drain and exit (request_stop sends it)
--     'cancel <job_id>'      the job was cancelled while this worker held it
--                            (alk.cancel sends it): stop its handler
-- A worker acts on the verbs it knows and ignores any other payload, so
-- later verbs never break an older worker.
--
-- Names: worker_id follows the worker-id rule (non-empty, at most 1024 bytes,
-- the prefix alk: allowed: pyalk's own workers use it); queue is a name and
-- may be reserved (an outbox relay works its backing queue alk:outbox:<name>),
-- and it obeys name limits: a limited role registers only workers of its
-- queues, and sees, beats, deregisters and stops only those.
--
-- Scale out (docs/contract.md#scale-out): a worker's row belongs with its
-- queue, so a sharded deployment routes register by its queue and the
-- other calls by their optional queue argument, as the ops by job id; the
-- control channel then fires on the partition the worker listens on for its
-- queue's wake-ups. alk.workers() orders by worker_id, the first column, so
-- a router that concatenates partitions and sorts by it gives the same rows
-- in the same order as one server.
--
-- No index on last_seen_at: a beat then updates no indexed column and stays
-- a HOT update; the prune and the listing scan a table of one row per worker.

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
'channel: LISTEN on it for ''stop'' (alk.request_stop) and ''cancel <job_id>'' (alk.cancel of a job it holds); ignore '
'other payloads. '
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

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
