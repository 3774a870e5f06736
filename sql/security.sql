-- pyalk security: roles as code (docs/security.md; the clock privilege and
-- name limits of docs/contract.md#ground-rules).
--
-- current definition; edit here, then add a version file (docs/migrations.md).
-- Landed as 0012_security.sql; the clock privilege itself (alk.clock_privilege,
-- alk.pinned_clock) lives with the clock in core.sql.
--
-- Four kinds of role, each with exactly the functions it needs, listed once
-- in alk._role_functions: reader (inspect), producer (enqueue, publish),
-- worker (claim and settle jobs, consume streams, hold locks) and admin
-- (all of that, plus cancel, sweep, trim, requeue, schedules, the
-- scheduler's leader lock and the grant functions). alk.grant_<kind>(role)
-- grants a kind's list and USAGE on the schema; alk.revoke_all(role) takes
-- everything back. pyalk creates no roles: roles are cluster-wide and
-- creating them needs CREATEROLE; the administrator creates them, pyalk
-- grants. A kind's grants are recorded (alk.role_grants), so a later version
-- that adds a function to a list re-grants it with alk._regrant().

-- The lists. A name covers every overload. Names a later version adds are
-- listed here when it lands; names not installed are skipped.
CREATE FUNCTION alk._role_functions()
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
        -- a queue's completed-job retention (0026), where its outcomes are announced (0030)
        ('reader', 'queue_retention'), ('reader', 'outcome_channel'),
        -- a queue's claim limits (0029)
        ('reader', 'queue_limits'),
        -- producer: write work and events, and look at what it wrote
        ('producer', 'enqueue'), ('producer', 'enqueue_batch'), ('producer', 'outbox_enqueue'),
        ('producer', 'outbox_enqueue_batch'), ('producer', 'publish'), ('producer', 'publish_batch'),
        ('producer', 'get_job'), ('producer', 'outbox_get_job'),
        -- wait for a job's outcome: the queue keeps it, and where it is announced (0030)
        ('producer', 'queue_retention'), ('producer', 'outcome_channel'),
        -- worker: claim and settle jobs (pyalk worker, outbox delivery),
        -- consume streams with checkpoints, hold its own locks
        ('worker', 'claim'), ('worker', 'ack'), ('worker', 'ack_batch'), ('worker', 'retry'), ('worker', 'fail'),
        ('worker', 'heartbeat'), ('worker', 'release_jobs'), ('worker', 'settle_and_claim'), ('worker', 'settle'),
        ('worker', 'snooze'),
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
        -- workers rotate the job storage as they go (0028)
        ('worker', 'rotate_jobs'),
        -- admin: everything above (alk._kind_functions adds it) and these
        ('admin', 'cancel'), ('admin', 'sweep_expired'), ('admin', 'outbox_sweep_expired'), ('admin', 'trim_to'),
        ('admin', 'requeue_dead'), ('admin', 'pause_queue'), ('admin', 'resume_queue'),
        ('admin', 'set_queue_retention'), ('admin', 'set_queue_limits'),
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

-- The installed functions a kind grants, as regprocedures.
CREATE FUNCTION alk._kind_functions(role_kind text)
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

-- Which role holds which kind, so a later version can re-grant its lists.
-- Roles by oid: a renamed role keeps its kinds, a dropped one is skipped.
CREATE TABLE alk.role_grants (
    role_oid oid NOT NULL,
    kind text NOT NULL CHECK (kind IN ('reader', 'producer', 'worker', 'admin')),
    PRIMARY KEY (role_oid, kind)
);
COMMENT ON TABLE alk.role_grants IS 'Role kinds granted with alk.grant_<kind>, by role oid (private).';

CREATE FUNCTION alk._role_oid(argument text, role_name text)
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

CREATE FUNCTION alk._grant_kind(role_name text, role_kind text)
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

CREATE FUNCTION alk.grant_reader(role text)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT alk._grant_kind($1, 'reader') $$;
COMMENT ON FUNCTION alk.grant_reader(text) IS
'Let role inspect: the clock, schema_info, get_job, list_jobs, queue_stats, next_claim_at, read_since, get_offset, '
'get_lock, get_schedule, list_schedules, cron_next, workers (what pyalk status and pyalk jobs run). Grants USAGE on '
'schema alk and EXECUTE on each; idempotent; returns how many functions it granted. The role must exist (LK002). '
'Example: SELECT alk.grant_reader(''dashboard'');';

CREATE FUNCTION alk.grant_producer(role text)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT alk._grant_kind($1, 'producer') $$;
COMMENT ON FUNCTION alk.grant_producer(text) IS
'Let role produce: enqueue, enqueue_batch, outbox_enqueue, outbox_enqueue_batch, publish, publish_batch, get_job, '
'outbox_get_job, queue_retention and outcome_channel (to wait for a job''s outcome) and the clock. Idempotent; '
'returns how many functions it granted. '
'Example: SELECT alk.grant_producer(''web_app'');';

CREATE FUNCTION alk.grant_worker(role text)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT alk._grant_kind($1, 'worker') $$;
COMMENT ON FUNCTION alk.grant_worker(text) IS
'Let role work: claim, ack, ack_batch, retry, fail, heartbeat, next_claim_at, queue_channel, get_job, list_jobs, outbox_claim, '
'read_since, read_from_consumer, save_offset, get_offset, try_lock, renew_lock, release_lock, get_lock, '
'worker_register, worker_beat, worker_deregister and the clock '
'(what pyalk worker and outbox delivery run). Idempotent; returns how many functions it granted. '
'Example: SELECT alk.grant_worker(''job_runner'');';

CREATE FUNCTION alk.grant_admin(role text)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT alk._grant_kind($1, 'admin') $$;
COMMENT ON FUNCTION alk.grant_admin(text) IS
'Let role administer: every reader, producer and worker function, plus cancel, sweep_expired, trim_to, requeue_dead, '
'request_stop, schedule, unschedule, tick, the scheduler''s leader lock and the grant functions. Not the clock privilege '
'(alk.clock_privilege(), which only its owner grants). Idempotent; returns how many functions it granted. '
'Example: SELECT alk.grant_admin(''ops'');';

CREATE FUNCTION alk.revoke_all(role text)
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

CREATE FUNCTION alk.role_grants()
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

CREATE FUNCTION alk._check_kind(kind text)
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

CREATE FUNCTION alk.role_functions(kind text)
RETURNS SETOF text
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT f::text FROM alk._kind_functions(alk._check_kind($1)) f ORDER BY 1
$$;
COMMENT ON FUNCTION alk.role_functions(text) IS
'The functions alk.grant_<kind> grants, as signatures: kind is reader, producer, worker or admin (else LK002). '
'Example: SELECT * FROM alk.role_functions(''worker'');';

-- name limits -----------------------------------------------------------------

-- Limit role to the queues, streams, locks, outboxes and schedules whose names
-- start with one of prefixes (the table and the check live in core.sql).
CREATE FUNCTION alk.limit_names(role text, prefixes text[])
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
            'LANGUAGE sql STABLE PARALLEL SAFE AS $body$ SELECT %s $body$', CASE WHEN active THEN 'true' ELSE 'false' END);
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

CREATE FUNCTION alk.name_limits()
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

-- Re-apply every recorded kind: a version that adds a function to a list
-- ends with SELECT alk._regrant(); so existing roles get it.
CREATE FUNCTION alk._regrant()
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

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
