-- pyalk core: the core every mechanism stands on.
--
-- current definition; edit here, then add a version file (docs/migrations.md).
-- Landed as 0001_core.sql and 0008_schema.sql (schema_info); a fresh
-- install runs this file, an upgrade runs the version files, and
-- tests/migrations proves both give the same catalog.
--
-- The schema, the clock, the error helper, name validation and saturating
-- stamp arithmetic, and alk.schema_info (landed in 0008): the ground rules of
-- docs/contract.md#ground-rules.
--
-- Conventions every mechanism (and every version file) follows:
--   * public functions are SECURITY DEFINER with a pinned search_path, so the
--     tables stay private and EXECUTE on the functions is the whole API;
--   * every object is schema-qualified inside a body; names are data;
--   * errors are raised through alk._raise with an LK SQLSTATE.

CREATE SCHEMA IF NOT EXISTS alk;
COMMENT ON SCHEMA alk IS 'pyalk: job queues, streams, outbox, locks and a scheduler as SQL functions.';

-- Nothing in alk is usable by PUBLIC until an administrator grants it
-- (docs/security.md). Functions created later by this role start private too.
REVOKE ALL ON SCHEMA alk FROM PUBLIC;
ALTER DEFAULT PRIVILEGES IN SCHEMA alk REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;

-- Raise a pyalk error. Usable inside expressions (returns anyelement-free
-- boolean so CASE branches can call it).
CREATE FUNCTION alk._raise(code text, message text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = code, MESSAGE = message;
END
$$;
COMMENT ON FUNCTION alk._raise(text, text) IS 'internal: raise an LK error with the given SQLSTATE and message';

-- Quote a caller's value for an error message, cut to a readable length.
CREATE FUNCTION alk._show(value text)
RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE
        WHEN value IS NULL THEN 'NULL'
        WHEN pg_catalog.length(value) > 80
            THEN pg_catalog.quote_literal(pg_catalog.left(value, 80)) || '... (' || pg_catalog.length(value) || ' characters)'
        ELSE pg_catalog.quote_literal(value)
    END
$$;
COMMENT ON FUNCTION alk._show(text) IS 'internal: a value quoted and shortened for an error message';

-- The clock: integer unix seconds. A session may pin it for tests and
-- replays with SET alk.now = '<integer>'; RESET (or an empty value) unpins.
-- Pinning is a privilege (landed in 0012_security.sql): EXECUTE on
-- alk.clock_privilege(), which the administrator grants (docs/security.md).
--
-- Hot-path helpers (alk.now and the saturating arithmetic below) are plain
-- SQL expressions with no SET clause, so the planner inlines them into the
-- calling statement: a SET clause would cost a call per use. They cannot be
-- redirected by a caller's search_path: every function and operator in them
-- is written pg_catalog-qualified (a test checks this).
--
-- An inlined expression needs EXECUTE on every function it names, for the
-- caller of SELECT alk.now() too: so the unpinned branch names pg_catalog
-- functions only, and everything a pinned clock needs (the privilege check,
-- the parse, the errors) sits in alk.pinned_clock, a public SECURITY DEFINER
-- function every grant list carries. The unpinned hot path is one setting
-- read and the wall clock, as before.

-- The clock privilege: EXECUTE on this function. A grant rather than a
-- role pyalk creates: roles are cluster-wide (a migration creating one
-- collides across databases and fails without CREATEROLE on managed
-- services), while a grant lives in this database, follows GRANT/REVOKE,
-- role membership and pg_dump, and vanishes with a dropped role.
CREATE FUNCTION alk.clock_privilege()
RETURNS boolean
LANGUAGE sql IMMUTABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT true $$;
COMMENT ON FUNCTION alk.clock_privilege() IS
'The clock privilege: a role with EXECUTE on this function may pin the clock (SET alk.now) and tick at an instant '
'later than the clock; every other role gets LK005. Calling it just returns true. '
'Example: GRANT EXECUTE ON FUNCTION alk.clock_privilege() TO replay_tool;';

-- Who holds it: the session user. Inside SECURITY DEFINER bodies
-- current_user is the owner, so it cannot name the caller; session_user is
-- the role that logged in, which SET ROLE does not change. SET ROLE only
-- narrows a session to a role it may RESET back from, so a login role that
-- holds the privilege keeps it under SET ROLE, and one that does not cannot
-- gain it (only a superuser session can SET SESSION AUTHORIZATION).
CREATE FUNCTION alk._has_clock_privilege()
RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.has_function_privilege(session_user, 'alk.clock_privilege()'::regprocedure, 'EXECUTE')
$$;
COMMENT ON FUNCTION alk._has_clock_privilege() IS
'internal: whether the session user holds the clock privilege (EXECUTE on alk.clock_privilege())';

CREATE FUNCTION alk._require_clock_privilege(what text)
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

CREATE FUNCTION alk.pinned_clock()
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

CREATE FUNCTION alk.now()
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

-- Name limits (landed in 0012_security.sql): a role may be limited to the
-- queues, streams, locks, outboxes and schedules whose names start with one
-- of its prefixes, so teams can share a database. The limits are rows of a
-- private table, managed by alk.limit_names (an admin's function): a custom
-- setting would not do, anyone can SET one. The caller is the session user,
-- as for the clock privilege. A role without rows is unrestricted; while no
-- role has any, the checks are planned away (alk._limits_active).
CREATE TABLE alk.name_limits (
    role_oid oid NOT NULL,
    prefix text NOT NULL,
    PRIMARY KEY (role_oid, prefix)
);
COMMENT ON TABLE alk.name_limits IS 'Name prefixes a role is limited to, by role oid (private; alk.limit_names manages it).';

-- Whether any name limit exists, as a constant the planner folds: while it
-- says false (no role is limited) the checks below vanish from every plan,
-- so a database without limits pays nothing. alk.limit_names rewrites the
-- body when the first limit appears or the last one goes; replacing a
-- function invalidates the cached plans that inlined it, in every session.
-- Inlinable, like alk.now: no SET clause and nothing to resolve. STABLE, not
-- IMMUTABLE: the planner pre-evaluates an IMMUTABLE call and records no
-- dependency on the function, so a session's cached plans (an ack's, with
-- alk._holds inlined) kept the old answer after alk.limit_names; a STABLE
-- one is inlined instead, which records it and still folds to a constant.
CREATE FUNCTION alk._limits_active()
RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT false $$;
COMMENT ON FUNCTION alk._limits_active() IS
'internal: whether any name limit exists (rewritten by alk.limit_names; constant-folded by the planner)';

-- Whether the session user may use name. An outbox's backing queue
-- alk:outbox:<name> counts as the outbox's name; other reserved names
-- (alk:scheduler) are outside every limit.
CREATE FUNCTION alk._in_scope(name text)
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

-- Name rule: non-empty text of at most 1024 bytes; the prefix alk: is
-- reserved for pyalk's own names unless the caller is pyalk itself
-- (reserved_ok). Names lead index keys, and a btree entry stops at 2704
-- bytes: the cap turns what would be a raw "index row size" failure deep in
-- an insert into an LK001 naming the argument, with room for pyalk's
-- prefixes (alk:outbox:<name>).
CREATE FUNCTION alk._check_name(argument text, value text, reserved_ok boolean DEFAULT false)
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

-- The name rule as an inlinable expression for hot paths: valid names pass
-- through at the cost of three comparisons folded into the caller's
-- statement; anything else goes to alk._check_name, which raises the LK001
-- that names the argument. STABLE like _check_name (which reads the name
-- limits): an IMMUTABLE wrapper of a STABLE call is never inlined, and each
-- use ran as a function call of its own.
CREATE FUNCTION alk._name_ok(argument text, value text, reserved_ok boolean)
RETURNS text
LANGUAGE sql STABLE
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

-- Saturating bigint arithmetic: stamp sums never raise "bigint out of range"
-- and never poison a row; the result is clamped to the bigint domain.
-- Inlinable (see alk.now): no SET clause, every operator qualified.
CREATE FUNCTION alk._sat_add(a bigint, b bigint)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN b OPERATOR(pg_catalog.>) 0
         AND a OPERATOR(pg_catalog.>) (9223372036854775807 OPERATOR(pg_catalog.-) b)
            THEN 9223372036854775807
        WHEN b OPERATOR(pg_catalog.<) 0
         AND a OPERATOR(pg_catalog.<) ('-9223372036854775808'::bigint OPERATOR(pg_catalog.-) b)
            THEN '-9223372036854775808'::bigint
        ELSE a OPERATOR(pg_catalog.+) b
    END
$$;
COMMENT ON FUNCTION alk._sat_add(bigint, bigint) IS 'internal: a + b clamped to the bigint range (NULL if either is NULL)';

CREATE FUNCTION alk._sat_sub(a bigint, b bigint)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN b OPERATOR(pg_catalog.<) 0
         AND a OPERATOR(pg_catalog.>) (9223372036854775807 OPERATOR(pg_catalog.+) b)
            THEN 9223372036854775807
        WHEN b OPERATOR(pg_catalog.>) 0
         AND a OPERATOR(pg_catalog.<) ('-9223372036854775808'::bigint OPERATOR(pg_catalog.+) b)
            THEN '-9223372036854775808'::bigint
        ELSE a OPERATOR(pg_catalog.-) b
    END
$$;
COMMENT ON FUNCTION alk._sat_sub(bigint, bigint) IS 'internal: a - b clamped to the bigint range (NULL if either is NULL)';

-- base * 2^exponent, clamped; exponent < 0 counts as 0. Off the hot path
-- (retry only), so it keeps the usual pinned search_path.
CREATE FUNCTION alk._sat_mul_pow2(base bigint, exponent bigint)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE
        WHEN base IS NULL OR exponent IS NULL THEN NULL
        WHEN base = 0 THEN 0
        WHEN exponent >= 63 THEN CASE WHEN base > 0 THEN 9223372036854775807 ELSE -9223372036854775808 END
        ELSE least(greatest(
                 base::numeric * (1::bigint << greatest(exponent, 0)::integer)::numeric,
                 -9223372036854775808::numeric), 9223372036854775807::numeric)::bigint
    END
$$;
COMMENT ON FUNCTION alk._sat_mul_pow2(bigint, bigint) IS 'internal: base * 2^exponent clamped to the bigint range';

-- NOTIFY channel names: prefix || the first 32 hex digits of sha256(name as
-- UTF-8). Inlinable (see alk.now): every enqueue that wakes a worker computes
-- one, and a SET clause would cost a call frame each time. The name is
-- so a channel is short and fixed-length whatever the name (the
-- limit is 63 bytes), and each queue or stream has its own. sha256 rather
-- than md5: servers in FIPS mode refuse md5.
CREATE FUNCTION alk._channel(prefix text, name text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT prefix OPERATOR(pg_catalog.||) pg_catalog.left(pg_catalog.encode(
        pg_catalog.sha256(pg_catalog.convert_to(name, 'UTF8')), 'hex'), 32)
$$;
COMMENT ON FUNCTION alk._channel(text, text) IS 'internal: a NOTIFY channel name for a queue or stream name';

-- Argument checks shared by every mechanism.
CREATE FUNCTION alk._check_int4(argument text, value bigint)
RETURNS integer
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF value IS NOT NULL AND (value < -2147483648 OR value > 2147483647) THEN
        PERFORM alk._raise('LK002', argument || ' must be between -2147483648 and 2147483647, got ' || value);
    END IF;
    RETURN value::integer;
END
$$;
COMMENT ON FUNCTION alk._check_int4(text, bigint) IS 'internal: LK002 unless value fits a 32-bit integer column';

CREATE FUNCTION alk._check_not_null(argument text, value anyelement)
RETURNS anyelement
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF value IS NULL THEN
        PERFORM alk._raise('LK002', argument || ' must not be NULL');
    END IF;
    RETURN value;
END
$$;
COMMENT ON FUNCTION alk._check_not_null(text, anyelement) IS 'internal: LK002 when a required argument is SQL NULL';

-- The payload rule of every enqueue and publish form: payloads are JSON
-- values, never SQL NULL (a JSON null is 'null'::jsonb).
CREATE FUNCTION alk._check_payloads(payloads jsonb[])
RETURNS jsonb[]
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    null_at integer;
BEGIN
    IF payloads IS NULL THEN
        PERFORM alk._raise('LK002', 'payloads must be an array of JSON values, got NULL');
    END IF;
    null_at := pg_catalog.array_position(payloads, NULL);
    IF null_at IS NOT NULL THEN
        PERFORM alk._raise('LK002', CASE WHEN pg_catalog.cardinality(payloads) = 1
            THEN 'payload must be a JSON value, got SQL NULL'
            ELSE 'payload ' || null_at || ' is SQL NULL' END || '; a JSON null is ''null''::jsonb');
    END IF;
    RETURN payloads;
END
$$;
COMMENT ON FUNCTION alk._check_payloads(jsonb[]) IS 'internal: LK002 unless payloads is an array of JSON values without SQL NULLs';

-- schema version (0008, breaking since 0010) -----------------------------------------------------
--
-- The schema says which version it is, so a client can check at
-- connect that it can run on it (docs/migrations.md, "Compatibility").
--
-- alk.schema_info() returns the installed version and the newest version
-- that broke older clients. A version file that changes a function's
-- signature or result in a way an older pyalk would misread replaces this
-- function with its own number as breaking_since; every other version leaves
-- it alone. A client that knows versions up to K runs on a schema whose
-- breaking_since <= K, and asks for `pyalk migrate` when the schema is older
-- than the version it needs.

CREATE FUNCTION alk.schema_info(OUT version text, OUT breaking_since text)
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

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
