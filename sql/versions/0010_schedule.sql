-- pyalk 0010: schedule and lock (issue 12; the rules live in sql/schedule.sql and sql/lock.sql).
--
-- * alk.schedule / alk.schedules: priority and max_attempts become bigint,
--   the width of every other integer column and argument.
-- * alk.get_schedule and alk.get_lock return SETOF with ROWS 1: zero rows for
--   a missing row (a non-set composite comes back as one all-NULL row in
--   SELECT * FROM form). A changed result needs DROP + CREATE; EXECUTE grants
--   on the dropped functions are given back to their grantees.
-- * alk.tick: a tick past the calendar's end keeps the first unfired boundary
--   instead of leaving next_fire_at NULL.
-- * alk.scheduler_tick(owner, ttl): leadership and tick in one transaction,
--   LK004 from SQL.
-- * alk.cron_next's comment: six fields put the seconds first.
-- * alk.schema_info: breaking_since 0010 (get_lock's zero rows break the
--   one-row reads of older clients).

ALTER TABLE alk.schedules ALTER COLUMN priority TYPE bigint, ALTER COLUMN max_attempts TYPE bigint;
ALTER TYPE alk.schedule ALTER ATTRIBUTE priority TYPE bigint, ALTER ATTRIBUTE max_attempts TYPE bigint;

-- The EXECUTE grants of the two readers, to give back after the re-create.
-- Kept in a setting, not a table: an extension update script (pyalk.extension)
-- would make a temporary table a member of the extension.
SELECT pg_catalog.set_config('alk.upgrade_grants', coalesce((
    SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_array(p.proname, a.grantee::regrole::text))
      FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
     WHERE p.pronamespace = 'alk'::regnamespace AND p.proname IN ('get_lock', 'get_schedule')
       AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner), '[]')::text, false);

DROP FUNCTION alk.get_lock(text);
DROP FUNCTION alk.get_schedule(text);

-- alk.cron_next(text,bigint,text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.cron_next(spec text, after bigint, tz text DEFAULT 'UTC')
RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c alk._cron := alk._cron_parse(spec);
    zone text := alk._cron_tz(tz);
BEGIN
    PERFORM alk._check_not_null('after', after);
    RETURN alk._cron_next(c, after, zone);
END
$$;
COMMENT ON FUNCTION alk.cron_next(text, bigint, text) IS
'The first fire of a cron spec strictly after `after` (unix seconds), evaluated in the IANA time zone tz (default UTC; '
'NULL means UTC), exactly as croniter answers. Specs: 5 fields (minute hour day-of-month month day-of-week), or 6 '
'with the seconds field first (second minute hour day-of-month month day-of-week: croniter''s '
'second_at_beginning=True), ranges, steps, lists, month and day names, @yearly @annually @monthly @weekly @daily @midnight @hourly, '
'and @every <n><s|m|h|d> (the multiples of the period since the unix epoch, whatever the zone). NULL when no fire exists '
'up to 9999-12-31T23:59:59Z. LK003 for a spec or zone it cannot read. '
'Example: SELECT alk.cron_next(''30 9 * * mon-fri'', 1700000000, ''Europe/Berlin'');';

-- alk.get_lock(text): changed or new in the current files
CREATE FUNCTION alk.get_lock(name text)
RETURNS SETOF alk.lock
LANGUAGE sql STABLE SECURITY DEFINER ROWS 1
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT l.name, l.owner, l.acquired_at, l.expires_at
      FROM alk.locks l
     WHERE l.name = alk._check_name('name', $1, true)
$$;
COMMENT ON FUNCTION alk.get_lock(text) IS
'The lock as stored (reserved names included, for inspection): one row, or none when nobody took it or it was '
'released (as a scalar, (SELECT alk.get_lock(name)) is then NULL). A row with expires_at <= alk.now() is expired: '
'free for the next try_lock. '
'Example: SELECT *, expires_at <= alk.now() AS expired FROM alk.get_lock(''nightly-report'');';

-- alk.get_schedule(text): changed or new in the current files
CREATE FUNCTION alk.get_schedule(name text)
RETURNS SETOF alk.schedule
LANGUAGE plpgsql STABLE SECURITY DEFINER ROWS 1
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM alk._check_name('name', get_schedule.name);
    RETURN QUERY
        SELECT s.name, s.spec, s.queue, s.priority, s.max_attempts, s.expires, s.payload, s.tz, s.next_fire_at
          FROM alk.schedules s WHERE s.name = get_schedule.name;
END
$$;
COMMENT ON FUNCTION alk.get_schedule(text) IS
'The schedule `name` (name, spec, queue, priority, max_attempts, expires, payload, tz, next_fire_at): one row, or '
'none when there is no such schedule (as a scalar, (SELECT alk.get_schedule(name)) is then NULL). '
'Example: SELECT * FROM alk.get_schedule(''nightly-report'');';

-- alk.schedule(text,text,text,bigint,bigint,bigint,jsonb,text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.schedule(
    name text,
    spec text,
    queue text,
    priority bigint DEFAULT 0,
    max_attempts bigint DEFAULT 3,
    expires bigint DEFAULT NULL,
    payload jsonb DEFAULT NULL,
    tz text DEFAULT 'UTC'
)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    clock bigint := alk.now();
    c alk._cron;
    zone text;
    v_priority bigint;
    v_max_attempts bigint;
    old record;
    next_at bigint;
BEGIN
    PERFORM alk._check_name('name', name);
    PERFORM alk._check_name('queue', queue);
    c := alk._cron_parse(spec);
    zone := alk._cron_tz(tz);
    v_priority := coalesce(priority, 0);
    v_max_attempts := coalesce(max_attempts, 3);
    -- Registering the same spec in the same zone again (an application that
    -- registers its schedules at every start) keeps the pending boundary, so
    -- a boundary that came due before the next tick still fires. A new spec
    -- or zone starts from now.
    SELECT s.cron, s.tz, s.next_fire_at INTO old
      FROM alk.schedules s WHERE s.name = name FOR UPDATE;
    IF FOUND AND old.cron IS NOT DISTINCT FROM c AND old.tz = zone AND old.next_fire_at IS NOT NULL THEN
        next_at := old.next_fire_at;
    ELSE
        next_at := alk._cron_next(c, clock, zone);
    END IF;
    INSERT INTO alk.schedules AS s (name, spec, tz, queue, priority, max_attempts, expires, payload,
                                    next_fire_at, cron, created_at, updated_at)
    VALUES (name, spec, zone, queue, v_priority, v_max_attempts, expires, payload, next_at, c, clock, clock)
    ON CONFLICT ON CONSTRAINT schedules_pkey DO UPDATE
       SET spec = excluded.spec, tz = excluded.tz, queue = excluded.queue, priority = excluded.priority,
           max_attempts = excluded.max_attempts, expires = excluded.expires, payload = excluded.payload,
           next_fire_at = excluded.next_fire_at, cron = excluded.cron, updated_at = excluded.updated_at;
    RETURN next_at;
END
$$;
COMMENT ON FUNCTION alk.schedule(text, text, text, bigint, bigint, bigint, jsonb, text) IS
'Register or replace the schedule `name`: every fire of `spec` (see alk.cron_next) in zone tz enqueues one job into '
'`queue` with the given priority, max_attempts and expires (a TTL from the tick that enqueues it) over the plain-queue '
'stamps (300 s visibility, 3 attempts, 5 s backoff base, dead rows kept). Returns the next fire time (NULL: never). '
'Replacing with the same spec and zone keeps the pending boundary; a new spec or zone counts from now. '
'Example: SELECT alk.schedule(''nightly-report'', ''0 2 * * *'', ''reports'', payload => ''{"kind": "daily"}'', tz => ''Europe/Berlin'');';

-- alk.scheduler_tick(text,bigint): changed or new in the current files
CREATE FUNCTION alk.scheduler_tick(owner text, ttl bigint)
RETURNS TABLE (schedule_name text, queue text, fire_at bigint, job_id bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    holder record;
BEGIN
    IF NOT alk._try_lock('alk:scheduler', scheduler_tick.owner, scheduler_tick.ttl) THEN
        SELECT l.owner, l.expires_at INTO holder FROM alk.locks l WHERE l.name = 'alk:scheduler';
        PERFORM alk._raise('LK004', 'scheduler leadership: ' || alk._show(scheduler_tick.owner)
            || ' does not hold the lease alk:scheduler (' || alk._show(holder.owner) || ' holds it until '
            || holder.expires_at || '); nothing fired');
    END IF;
    RETURN QUERY SELECT t.schedule_name, t.queue, t.fire_at, t.job_id FROM alk.tick() t;
END
$$;
COMMENT ON FUNCTION alk.scheduler_tick(text, bigint) IS
'The leader''s tick, in one transaction: take or renew the lease alk:scheduler for owner until now + ttl seconds '
'(free, expired, or already owner''s), then alk.tick() at alk.now(); returns what alk.tick returns. While another '
'owner holds the lease: LK004, and nothing fires. Call it more often than every ttl seconds to stay the leader; '
'several callers (processes, pg_cron) with their own owners elect one. owner NULL or empty is LK001; ttl NULL or '
'<= 0 is LK002. Example: SELECT * FROM alk.scheduler_tick(''host-a:4242'', 30);';

-- alk.schema_info(): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.schema_info(OUT version text, OUT breaking_since text)
RETURNS record
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT (SELECT max(v.version_num)::text FROM alk.alembic_version v), '0010'::text
$$;
COMMENT ON FUNCTION alk.schema_info() IS
'The installed schema version and breaking_since, the newest version that older clients cannot run on. '
'A client that knows versions up to K may run when breaking_since <= K; it needs pyalk migrate when version is '
'older than what it uses. Example: SELECT * FROM alk.schema_info();';

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
'alk.scheduler_tick for one leader among several callers. Example: SELECT * FROM alk.tick();';

DO $$
DECLARE
    g jsonb;
BEGIN
    FOR g IN SELECT * FROM pg_catalog.jsonb_array_elements(pg_catalog.current_setting('alk.upgrade_grants')::jsonb) LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION alk.%I(text) TO %s', g ->> 0, g ->> 1);
    END LOOP;
    PERFORM pg_catalog.set_config('alk.upgrade_grants', '', false);
END
$$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
