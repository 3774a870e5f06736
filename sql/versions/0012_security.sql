-- pyalk 0012: security. The clock is a privilege, roles are code.
--
-- 1. alk.now() named a private helper in its inlined expression, so a role
--    granted only the public functions could not read the clock (permission
--    denied for function _clock_setting_invalid). The unpinned branch now
--    names pg_catalog functions only; a pinned clock goes through
--    alk.pinned_clock, public and SECURITY DEFINER.
-- 2. Pinning the clock (SET alk.now) and ticking later than the clock are
--    the clock privilege: EXECUTE on alk.clock_privilege() (LK005 otherwise).
-- 3. Roles as code: alk.grant_reader/producer/worker/admin(role) and
--    alk.revoke_all(role), with the lists in alk._role_functions.
-- 4. Name limits: alk.limit_names(role, prefixes) keeps a role to the
--    queues, streams, locks, outboxes and schedules under its prefixes;
--    alk._check_name enforces them (LK005), alk._holds treats a job outside
--    them as not held, queue_stats() and list_schedules() filter by them.

-- Written from the current files with tools/sqlversion.py diff; the tables by
-- hand. Function bodies are checked when called, not here: the blocks come in
-- name order, and some name functions created further down (alk.now names
-- alk.pinned_clock).
SET LOCAL check_function_bodies = off;

CREATE TABLE alk.name_limits (
    role_oid oid NOT NULL,
    prefix text NOT NULL,
    PRIMARY KEY (role_oid, prefix)
);
COMMENT ON TABLE alk.name_limits IS 'Name prefixes a role is limited to, by role oid (private; alk.limit_names manages it).';

CREATE TABLE alk.role_grants (
    role_oid oid NOT NULL,
    kind text NOT NULL CHECK (kind IN ('reader', 'producer', 'worker', 'admin')),
    PRIMARY KEY (role_oid, kind)
);
COMMENT ON TABLE alk.role_grants IS 'Role kinds granted with alk.grant_<kind>, by role oid (private).';

-- alk._check_kind(text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._check_kind(kind text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF kind IS NULL OR kind NOT IN ('reader', 'producer', 'worker', 'admin') THEN
        PERFORM alk._raise('LK002', 'kind must be reader, producer, worker or admin, got ' || alk._show(kind));
    END IF;
    RETURN kind;
END
$$;
COMMENT ON FUNCTION alk._check_kind(text) IS 'internal: LK002 unless kind is reader, producer, worker or admin';

-- alk._check_name(text,text,boolean): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._check_name(argument text, value text, reserved_ok boolean DEFAULT false)
RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF value IS NULL OR value = '' THEN
        PERFORM alk._raise('LK001', argument || ' must be a non-empty name, got ' || alk._show(value));
    END IF;
    IF pg_catalog.octet_length(value) > 1024 THEN
        PERFORM alk._raise('LK001', argument || ' must be at most 1024 bytes long, got '
            || pg_catalog.octet_length(value) || ' bytes: ' || alk._show(value));
    END IF;
    IF NOT reserved_ok AND pg_catalog.starts_with(value, 'alk:') THEN
        PERFORM alk._raise('LK001', argument || ' ' || alk._show(value) || ' uses the reserved prefix ''alk:''');
    END IF;
    -- Names of things (not worker ids, owners, consumers) obey name limits.
    IF alk._limits_active() AND argument IN ('queue', 'stream', 'name', 'outbox') AND NOT alk._in_scope(value) THEN
        PERFORM alk._raise('LK005', argument || ' ' || alk._show(value) || ' is outside the names role '
            || alk._show(session_user::text) || ' may use (its prefixes: '
            || (SELECT pg_catalog.string_agg(alk._show(l.prefix), ', ' ORDER BY l.prefix) FROM alk.name_limits l
                 WHERE l.role_oid = pg_catalog.to_regrole(pg_catalog.quote_ident(session_user))::oid) || ')');
    END IF;
    RETURN value;
END
$$;
COMMENT ON FUNCTION alk._check_name(text, text, boolean) IS 'internal: LK001 unless value is a non-empty name of at most 1024 bytes outside the reserved alk: prefix; LK005 when a queue, stream, lock, outbox or schedule name is outside the session user''s name limits';

-- alk._grant_kind(text,text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._grant_kind(role_name text, role_kind text)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    target oid := alk._role_oid('role', role_name);
    f regprocedure;
    granted bigint := 0;
BEGIN
    -- format %I: the role name is an identifier, never spliced raw.
    EXECUTE pg_catalog.format('GRANT USAGE ON SCHEMA alk TO %I', role_name);
    FOR f IN SELECT k FROM alk._kind_functions(role_kind) k LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %I', f, role_name);
        granted := granted + 1;
    END LOOP;
    INSERT INTO alk.role_grants (role_oid, kind) VALUES (target, role_kind) ON CONFLICT DO NOTHING;
    RETURN granted;
END
$$;
COMMENT ON FUNCTION alk._grant_kind(text, text) IS 'internal: grant role kind role_kind''s functions and USAGE on alk';

-- alk._has_clock_privilege(): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._has_clock_privilege()
RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.has_function_privilege(session_user, 'alk.clock_privilege()'::regprocedure, 'EXECUTE')
$$;
COMMENT ON FUNCTION alk._has_clock_privilege() IS
'internal: whether the session user holds the clock privilege (EXECUTE on alk.clock_privilege())';

-- alk._holds(alk.jobs,text,bigint,bigint): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._holds(job alk.jobs, worker_id text, attempt bigint, clock bigint)
RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT job.state OPERATOR(pg_catalog.=) 'processing'
       AND job.worker_id OPERATOR(pg_catalog.=) worker_id
       AND (attempt IS NULL OR job.attempts OPERATOR(pg_catalog.=) attempt)
       AND job.claim_expires_at OPERATOR(pg_catalog.>=) clock
       AND (NOT alk._limits_active() OR alk._in_scope(job.queue))
$$;
COMMENT ON FUNCTION alk._holds(alk.jobs, text, bigint, bigint) IS 'internal: the claimed-job validity predicate (name limits included: a job outside them is never held)';

-- alk._in_scope(text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._in_scope(name text)
RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(bool_or(starts_with(
               CASE WHEN starts_with(name, 'alk:outbox:') THEN substr(name, 12) ELSE name END, l.prefix)
               AND NOT (starts_with(name, 'alk:') AND NOT starts_with(name, 'alk:outbox:'))), true)
      FROM alk.name_limits l
     WHERE l.role_oid = to_regrole(quote_ident(session_user))::oid
$$;
COMMENT ON FUNCTION alk._in_scope(text) IS
'internal: whether the session user may use name (true for a role without name limits)';

-- alk._kind_functions(text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._kind_functions(role_kind text)
RETURNS SETOF regprocedure
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT DISTINCT p.oid::regprocedure
      FROM alk._role_functions() f
      JOIN pg_catalog.pg_proc p ON p.proname = f.function_name AND p.pronamespace = 'alk'::regnamespace
     WHERE f.kind = 'base' OR f.kind = role_kind OR role_kind = 'admin'
$$;
COMMENT ON FUNCTION alk._kind_functions(text) IS 'internal: the installed functions role kind role_kind is granted';

-- alk._limits_active(): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._limits_active()
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT false $$;
COMMENT ON FUNCTION alk._limits_active() IS
'internal: whether any name limit exists (rewritten by alk.limit_names; constant-folded by the planner)';

-- alk._regrant(): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._regrant()
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    g record;
    granted bigint := 0;
BEGIN
    FOR g IN SELECT r.rolname::text AS role_name, rg.kind FROM alk.role_grants rg
               JOIN pg_catalog.pg_roles r ON r.oid = rg.role_oid LOOP
        granted := granted + alk._grant_kind(g.role_name, g.kind);
    END LOOP;
    RETURN granted;
END
$$;
COMMENT ON FUNCTION alk._regrant() IS 'internal: re-grant every recorded role kind its current list (after a version adds functions)';

-- alk._require_clock_privilege(text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._require_clock_privilege(what text)
RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT alk._has_clock_privilege() THEN
        PERFORM alk._raise('LK005', what || ' needs the clock privilege, which role ' || alk._show(session_user::text)
            || ' does not hold (an administrator grants it: GRANT EXECUTE ON FUNCTION alk.clock_privilege() TO '
            || pg_catalog.quote_ident(session_user::text) || ')');
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION alk._require_clock_privilege(text) IS
'internal: LK005 naming what was refused unless the session user holds the clock privilege';

-- alk._role_functions(): changed or new in the current files
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
        -- admin: everything above (alk._kind_functions adds it) and these
        ('admin', 'cancel'), ('admin', 'sweep_expired'), ('admin', 'outbox_sweep_expired'), ('admin', 'trim_to'),
        ('admin', 'requeue_dead'), ('admin', 'pause_queue'), ('admin', 'resume_queue'),
        ('admin', 'schedule'), ('admin', 'unschedule'), ('admin', 'tick'), ('admin', 'scheduler_tick'),
        -- the scheduler's leader loop holds the reserved lock alk:scheduler
        ('admin', '_try_lock'), ('admin', '_renew_lock'), ('admin', '_release_lock'),
        ('admin', 'grant_reader'), ('admin', 'grant_producer'), ('admin', 'grant_worker'), ('admin', 'grant_admin'),
        ('admin', 'revoke_all'), ('admin', 'role_grants'), ('admin', 'role_functions'),
        ('admin', 'limit_names'), ('admin', 'name_limits')
    ) AS l(kind, function_name)
$$;
COMMENT ON FUNCTION alk._role_functions() IS
'internal: the function names each role kind gets (base goes to every kind; admin also gets every other kind''s)';

-- alk._role_oid(text,text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._role_oid(argument text, role_name text)
RETURNS oid
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    found oid;
BEGIN
    SELECT r.oid INTO found FROM pg_catalog.pg_roles r WHERE r.rolname = role_name;
    IF found IS NULL THEN
        PERFORM alk._raise('LK002', argument || ' must name an existing role (exactly, case included), got '
            || alk._show(role_name));
    END IF;
    RETURN found;
END
$$;
COMMENT ON FUNCTION alk._role_oid(text, text) IS 'internal: the oid of the role named exactly role_name, or LK002';

-- alk.clock_privilege(): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.clock_privilege()
RETURNS boolean
LANGUAGE sql IMMUTABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT true $$;
COMMENT ON FUNCTION alk.clock_privilege() IS
'The clock privilege: a role with EXECUTE on this function may pin the clock (SET alk.now) and tick at an instant '
'later than the clock; every other role gets LK005. Calling it just returns true. '
'Example: GRANT EXECUTE ON FUNCTION alk.clock_privilege() TO replay_tool;';

-- alk.grant_admin(text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.grant_admin(role text)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT alk._grant_kind($1, 'admin') $$;
COMMENT ON FUNCTION alk.grant_admin(text) IS
'Let role administer: every reader, producer and worker function, plus cancel, sweep_expired, trim_to, requeue_dead, '
'schedule, unschedule, tick, the scheduler''s leader lock and the grant functions. Not the clock privilege '
'(alk.clock_privilege(), which only its owner grants). Idempotent; returns how many functions it granted. '
'Example: SELECT alk.grant_admin(''ops'');';

-- alk.grant_producer(text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.grant_producer(role text)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT alk._grant_kind($1, 'producer') $$;
COMMENT ON FUNCTION alk.grant_producer(text) IS
'Let role produce: enqueue, enqueue_batch, outbox_enqueue, outbox_enqueue_batch, publish, publish_batch, get_job, '
'outbox_get_job and the clock. Idempotent; returns how many functions it granted. '
'Example: SELECT alk.grant_producer(''web_app'');';

-- alk.grant_reader(text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.grant_reader(role text)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT alk._grant_kind($1, 'reader') $$;
COMMENT ON FUNCTION alk.grant_reader(text) IS
'Let role inspect: the clock, schema_info, get_job, list_jobs, queue_stats, next_claim_at, read_since, get_offset, '
'get_lock, get_schedule, list_schedules, cron_next (what pyalk status and pyalk jobs run). Grants USAGE on schema alk '
'and EXECUTE on each; idempotent; returns how many functions it granted. The role must exist (LK002). '
'Example: SELECT alk.grant_reader(''dashboard'');';

-- alk.grant_worker(text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.grant_worker(role text)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT alk._grant_kind($1, 'worker') $$;
COMMENT ON FUNCTION alk.grant_worker(text) IS
'Let role work: claim, ack, ack_batch, retry, fail, heartbeat, next_claim_at, queue_channel, get_job, list_jobs, outbox_claim, '
'read_since, read_from_consumer, save_offset, get_offset, try_lock, renew_lock, release_lock, get_lock and the clock '
'(what pyalk worker and outbox delivery run). Idempotent; returns how many functions it granted. '
'Example: SELECT alk.grant_worker(''job_runner'');';

-- alk.limit_names(text,text[]): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.limit_names(role text, prefixes text[])
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    target oid := alk._role_oid('role', limit_names.role);
    prefix text;
    active boolean;
BEGIN
    FOREACH prefix IN ARRAY coalesce(prefixes, ARRAY[]::text[]) LOOP
        IF prefix IS NULL OR prefix = '' OR starts_with(prefix, 'alk:') OR octet_length(prefix) > 1024 THEN
            PERFORM alk._raise('LK002', 'prefixes must be non-empty names of at most 1024 bytes outside the reserved '
                || 'prefix ''alk:'', got ' || alk._show(prefix));
        END IF;
    END LOOP;
    DELETE FROM alk.name_limits l WHERE l.role_oid = target;
    INSERT INTO alk.name_limits (role_oid, prefix)
        SELECT DISTINCT target, p FROM unnest(prefixes) AS p;
    -- Switch the checks on with the first limit and off after the last one
    -- (sql/core.sql, alk._limits_active); CREATE OR REPLACE keeps its
    -- comment and grants.
    active := EXISTS (SELECT 1 FROM alk.name_limits);
    IF active IS DISTINCT FROM alk._limits_active() THEN
        EXECUTE pg_catalog.format('CREATE OR REPLACE FUNCTION alk._limits_active() RETURNS boolean '
            'LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $body$ SELECT %s $body$', CASE WHEN active THEN 'true' ELSE 'false' END);
    END IF;
    RETURN (SELECT count(*) FROM alk.name_limits l WHERE l.role_oid = target);
END
$$;
COMMENT ON FUNCTION alk.limit_names(text, text[]) IS
'Limit role to the queues, streams, locks, outboxes and schedules whose names start with one of prefixes (replacing '
'its earlier limits); NULL or an empty array lifts them. Every function that takes such a name refuses another with '
'LK005; job operations by id (ack, retry, fail, heartbeat) treat a job of another queue as not held; queue_stats() '
'and list_schedules() show only names in reach. Applies to the session user (the login role). Returns how many '
'prefixes are in force. Example: SELECT alk.limit_names(''team_a_worker'', ARRAY[''team-a.'']);';

-- alk.list_schedules(): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.list_schedules()
RETURNS SETOF alk.schedule
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT s.name, s.spec, s.queue, s.priority, s.max_attempts, s.expires, s.payload, s.tz, s.next_fire_at
      FROM alk.schedules s
     WHERE NOT alk._limits_active() OR alk._in_scope(s.name)
     ORDER BY s.name
$$;
COMMENT ON FUNCTION alk.list_schedules() IS
'Every schedule, by name. Example: SELECT name, spec, tz, next_fire_at FROM alk.list_schedules();';

-- alk.name_limits(): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.name_limits()
RETURNS TABLE (role text, prefix text)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(r.rolname::text, l.role_oid::text), l.prefix
      FROM alk.name_limits l LEFT JOIN pg_catalog.pg_roles r ON r.oid = l.role_oid
     ORDER BY 1, 2
$$;
COMMENT ON FUNCTION alk.name_limits() IS
'Every name limit: the role and a prefix it may use (alk.limit_names sets them). '
'Example: SELECT * FROM alk.name_limits();';

-- alk.now(): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.now()
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$
    SELECT CASE
        WHEN pg_catalog.current_setting('alk.now', true) IS NULL
          OR pg_catalog.current_setting('alk.now', true) OPERATOR(pg_catalog.=) ''
            THEN pg_catalog.floor(pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()))::bigint
        ELSE alk.pinned_clock()
    END
$$;
COMMENT ON FUNCTION alk.now() IS
'The clock every alk function reads once per call: integer unix seconds. '
'SET alk.now = ''1700000000'' pins it for the session (tests, replays), for roles with the clock privilege '
'(alk.clock_privilege(); others get LK005); RESET alk.now unpins. '
'Example: SELECT alk.now();';

-- alk.pinned_clock(): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.pinned_clock()
RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    setting text := pg_catalog.current_setting('alk.now', true);
BEGIN
    IF setting IS NULL OR setting = '' THEN
        RETURN NULL;
    END IF;
    PERFORM alk._require_clock_privilege('SET alk.now (pinning the clock)');
    -- Nested, not AND: the numeric cast must only see digits.
    IF setting ~ '^\s*[-+]?[0-9]{1,18}\s*$' THEN
        RETURN setting::bigint;
    ELSIF setting ~ '^\s*[-+]?[0-9]{19}\s*$' THEN
        IF setting::numeric BETWEEN -9223372036854775808 AND 9223372036854775807 THEN
            RETURN setting::bigint;
        END IF;
    END IF;
    PERFORM alk._raise('LK002', 'setting alk.now must hold an integer number of unix seconds in the bigint range, got '
        || alk._show(setting));
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION alk.pinned_clock() IS
'The instant SET alk.now pins for this session, or NULL when the clock is not pinned. LK005 when the session user '
'lacks the clock privilege (alk.clock_privilege()), LK002 when the setting is not a bigint. alk.now() calls it '
'whenever the setting is not empty, so every role that reads the clock needs EXECUTE on it (every grant list '
'carries it). Example: SELECT alk.pinned_clock();';

-- alk.queue_stats(text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.queue_stats(queue text DEFAULT NULL)
RETURNS SETOF alk.queue_stat
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    clock bigint := alk.now();
    only_queue text := queue_stats.queue;
BEGIN
    IF only_queue IS NOT NULL THEN
        -- Read-only, so reserved names (outbox backing queues) are accepted.
        PERFORM alk._check_name('queue', only_queue, true);
    END IF;
    -- Every row is in exactly one of the three partial indexes (pending,
    -- processing, dead), and each leads with the queue: the queue names come
    -- from a loose scan of the three (three index probes per queue, whatever
    -- the row count), and each count is an index-only scan of one queue's
    -- entries in one of them. Nothing reads the heap but for pages the
    -- visibility map does not yet know to be all-visible.
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
    )
    SELECT n.name, p.pending, p.ready, p.pending - p.ready, r.processing, r.lapsed, d.dead,
           alk._sat_sub(clock, p.oldest_ready), p.next_run_at,
           EXISTS (SELECT FROM alk.paused_queues pq WHERE pq.queue = n.name)
      FROM names n
     CROSS JOIN LATERAL (
        SELECT count(*) AS pending,
               count(*) FILTER (WHERE j.run_at <= clock) AS ready,
               min(j.run_at) FILTER (WHERE j.run_at <= clock) AS oldest_ready,
               min(j.run_at) FILTER (WHERE j.run_at > clock) AS next_run_at
          FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'pending') p
     CROSS JOIN LATERAL (
        SELECT count(*) AS processing,
               count(*) FILTER (WHERE j.claim_expires_at < clock) AS lapsed
          FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'processing') r
     CROSS JOIN LATERAL (
        SELECT count(*) AS dead
          FROM alk.jobs j WHERE j.queue = n.name AND j.state = 'dead') d
     WHERE n.name IS NOT NULL AND n.name <> '' AND (NOT alk._limits_active() OR alk._in_scope(n.name))
     ORDER BY n.name;
END
$$;
COMMENT ON FUNCTION alk.queue_stats(text) IS
'One row per queue (every queue holding a job, reserved outbox queues included; or only the given queue, even when '
'empty): pending (= ready + scheduled), ready (pending and due), scheduled (pending, run_at in the future), '
'processing (leased, lapsed included), lapsed (lease ended: claimable again), dead, oldest_ready_age_s (now minus '
'the earliest run_at of a ready job: the queue''s lag; NULL when none is ready) and next_run_at (the earliest run_at '
'of a scheduled job; NULL when none) and paused (alk.pause_queue). Cost: index-only scans of the partial indexes, linear in the rows counted '
'(docs/worker.md has numbers). Example: SELECT * FROM alk.queue_stats();';

-- alk.revoke_all(text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.revoke_all(role text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    target oid := alk._role_oid('role', revoke_all.role);
BEGIN
    -- The owner's rights are what every SECURITY DEFINER function runs with.
    IF target = (SELECT n.nspowner FROM pg_catalog.pg_namespace n WHERE n.nspname = 'alk') THEN
        PERFORM alk._raise('LK002', 'role ' || alk._show(revoke_all.role)
            || ' owns schema alk: revoking its rights would stop every alk function');
    END IF;
    EXECUTE pg_catalog.format('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM %I', revoke_all.role);
    EXECUTE pg_catalog.format('REVOKE USAGE ON SCHEMA alk FROM %I', revoke_all.role);
    DELETE FROM alk.role_grants g WHERE g.role_oid = target;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION alk.revoke_all(text) IS
'Take back everything pyalk granted role: EXECUTE on every alk function (the clock privilege included) and USAGE on '
'the schema; true if role held a kind granted by alk.grant_<kind>. The schema''s owner is refused (LK002). '
'Example: SELECT alk.revoke_all(''web_app'');';

-- alk.role_functions(text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.role_functions(kind text)
RETURNS SETOF text
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT f::text FROM alk._kind_functions(alk._check_kind($1)) f ORDER BY 1
$$;
COMMENT ON FUNCTION alk.role_functions(text) IS
'The functions alk.grant_<kind> grants, as signatures: kind is reader, producer, worker or admin (else LK002). '
'Example: SELECT * FROM alk.role_functions(''worker'');';

-- alk.role_grants(): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.role_grants()
RETURNS TABLE (role text, kind text)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT r.rolname::text, g.kind FROM alk.role_grants g JOIN pg_catalog.pg_roles r ON r.oid = g.role_oid
     ORDER BY r.rolname, g.kind
$$;
COMMENT ON FUNCTION alk.role_grants() IS
'Which role holds which kind (granted with alk.grant_<kind>), by role name. '
'Example: SELECT * FROM alk.role_grants();';

-- alk.tick(bigint): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.tick(now bigint DEFAULT alk.now())
RETURNS TABLE (schedule_name text, queue text, fire_at bigint, job_id bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    clock bigint := coalesce(tick.now, alk.now());
    cap integer := alk._tick_catch_up_cap();
    due record;
    fires bigint[];
    next_at bigint;
    ids bigint[];
BEGIN
    -- A tick later than the clock fires boundaries before they are due: the
    -- clock privilege's (sql/core.sql). At or before the clock is anyone's.
    IF tick.now > alk.now() THEN
        PERFORM alk._require_clock_privilege('alk.tick at ' || tick.now || ', later than the clock,');
    END IF;
    -- Lock the due schedules; a concurrent tick skips them, and one that
    -- comes after sees their advanced next_fire_at. So each boundary is
    -- enqueued once, and all of this is one transaction: a failure leaves
    -- neither jobs nor advanced schedules behind.
    FOR due IN
        SELECT s.name, s.queue, s.priority, s.max_attempts, s.expires, s.payload, s.tz, s.cron, s.next_fire_at
          FROM alk.schedules s
         WHERE s.next_fire_at <= clock
         ORDER BY s.name
           FOR UPDATE OF s SKIP LOCKED
    LOOP
        fires := ARRAY[]::bigint[];
        next_at := due.next_fire_at;
        WHILE next_at <= clock AND cardinality(fires) < cap LOOP
            fires := fires || next_at;
            next_at := alk._cron_next(due.cron, next_at, due.tz);
        END LOOP;
        IF next_at <= clock THEN
            -- Over the cap: the rest of the backlog is skipped, to the first
            -- boundary after now. A tick past the calendar's end (after
            -- 9999-12-31T23:59:59Z, e.g. at the bigint maximum) has none to
            -- skip to: then the schedule keeps its first unfired boundary, so
            -- no tick turns a live schedule off.
            next_at := coalesce(alk._cron_next(due.cron, clock, due.tz), next_at);
        END IF;
        -- The plain-queue stamps with the schedule's over them; every job
        -- of the tick is ready at the tick's instant.
        ids := ARRAY(
            SELECT e.id FROM alk._enqueue(due.queue,
                ARRAY(SELECT jsonb_build_object('schedule', due.name, 'fire_at', f.at, 'payload', due.payload)
                        FROM unnest(fires) WITH ORDINALITY AS f(at, ord) ORDER BY f.ord),
                clock, NULL, NULL, due.priority, due.max_attempts, due.expires, NULL, NULL, NULL, 300, 3, 5) AS e(id));
        UPDATE alk.schedules s SET next_fire_at = next_at WHERE s.name = due.name;
        RETURN QUERY
            SELECT due.name, due.queue, f.at, f.id
              FROM unnest(fires, ids) WITH ORDINALITY AS f(at, id, ord)
             ORDER BY f.ord;
    END LOOP;
END
$$;
COMMENT ON FUNCTION alk.tick(bigint) IS
'Fire every due schedule: for each boundary <= now (default: the clock) enqueue one job whose payload is '
'{"schedule": name, "fire_at": boundary, "payload": the schedule''s payload}, at most 100 per schedule per tick '
'(the oldest first; the rest of a longer backlog is skipped), then move the schedule to its first boundary after the '
'last one fired, or after now when the cap cut it short. A tick past 9999-12-31T23:59:59Z, where no boundary after '
'now exists, leaves the schedule at its first unfired boundary instead: a tick never disables a schedule. '
'Concurrent ticks never fire a boundary twice. Returns one row per job. Call it every few seconds, or use '
'alk.scheduler_tick for one leader among several callers. An instant later than the clock needs the clock '
'privilege (alk.clock_privilege(); else LK005). Example: SELECT * FROM alk.tick();';

-- alk._clock_setting_invalid(text) is gone from the current files
DROP FUNCTION alk._clock_setting_invalid(text);

-- alk._name_ok(text,text,boolean): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._name_ok(argument text, value text, reserved_ok boolean)
RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE
        WHEN value OPERATOR(pg_catalog.<>) ''
         AND pg_catalog.octet_length(value) OPERATOR(pg_catalog.<=) 1024
         AND (reserved_ok OR NOT pg_catalog.starts_with(value, 'alk:'))
         -- While any role has name limits, every name goes through the full
         -- check; otherwise this folds away (alk._limits_active is a constant).
         AND NOT alk._limits_active()
            THEN value
        ELSE alk._check_name(argument, value, reserved_ok)
    END
$$;
COMMENT ON FUNCTION alk._name_ok(text, text, boolean) IS 'internal: value when it is a valid name, else the LK001 of alk._check_name (inlinable)';

SET LOCAL check_function_bodies = on;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
