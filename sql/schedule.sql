-- pyalk schedule: the scheduler (docs/contract.md#scheduler): a cron engine in
-- SQL, named schedules, and tick, which turns due boundaries into jobs.
--
-- current definition; edit here, then add a version file (docs/migrations.md).
-- Landed as 0006_schedule.sql; a fresh install runs this file, an upgrade runs the
-- version files, and tests/migrations proves both give the same catalog.
--
-- The cron engine answers what croniter 7 (day_or=True, and
-- second_at_beginning=True for 6 fields) answers for the same spec, instant
-- and zone, DST transitions included; docs/schedule.md lists the few
-- deliberate differences. A spec is parsed once into alk._cron (a next-value
-- table per field) and stored on its schedule row, so tick never re-parses.
-- (A later version that changes alk._cron or the parser must re-parse the
-- stored specs: UPDATE alk.schedules SET cron = alk._cron_parse(spec).)
--
-- How the next fire is found (the same steps as croniter's):
--   1. Read `after` as wall-clock time in the zone and search field by field
--      (month, day, hour, minute, second) for the first matching wall time
--      strictly after it. Wall times are "local seconds": the unix seconds a
--      UTC clock would show at that wall time, so calendar arithmetic is
--      plain integer arithmetic.
--   2. Map that wall time back to an instant. A repeated wall time (fall
--      back) takes its first occurrence if that is still after `after`, else
--      its second. A wall time that does not exist (spring forward) moves
--      forward in whole minutes to the first that exists, unless the hour
--      field is `*` (or the moved time is not after `after`): then the search
--      continues with the next match after the gap.
--   3. When the offset at the answer differs from the offset at `after`, also
--      search from `after` read in the answer's offset, and keep the earlier
--      of the two if it is a valid later instant. This is what fires a
--      repeated wall time twice.
--   When day-of-month and day-of-week are both restricted, a day matches
--   either (croniter's day_or): steps 1-3 run once per field and the earlier
--   answer wins.

-- The parsed form ----------------------------------------------------------

-- Each field is a next-value table indexed by the field's own values
-- (minutes[0:59], hours[0:23], doms[1:31], months[1:12], dows[0:6],
-- seconds[0:59]): entry x is the smallest allowed value >= x, or NULL when
-- none is, which means "wrap to the next hour, day, month, year or week".
CREATE TYPE alk._cron AS (
    every_s bigint,        -- @every period in seconds; the fields are then NULL
    seconds integer[],     -- NULL for 5-field specs (minute resolution)
    minutes integer[],
    hours integer[],
    doms integer[],
    months integer[],
    dows integer[],
    dom_star boolean,      -- day-of-month unrestricted (croniter's '*')
    dow_star boolean,      -- day-of-week unrestricted
    hour_star boolean,     -- every hour allowed: decides the DST-gap rule
    dom_feasible boolean   -- some allowed day-of-month occurs in some allowed month
);
COMMENT ON TYPE alk._cron IS 'internal: a parsed cron spec (next-value tables per field), stored on each schedule';

CREATE TYPE alk.schedule AS (
    name text,
    spec text,
    queue text,
    priority bigint,
    max_attempts bigint,
    expires bigint,
    payload jsonb,
    tz text,
    next_fire_at bigint
);
COMMENT ON TYPE alk.schedule IS 'A schedule as alk.get_schedule and alk.list_schedules return it; next_fire_at NULL means it never fires again.';

CREATE TABLE alk.schedules (
    name text NOT NULL,
    spec text NOT NULL,
    tz text NOT NULL,
    queue text NOT NULL,
    priority bigint NOT NULL,
    max_attempts bigint NOT NULL,
    expires bigint,
    payload jsonb,
    next_fire_at bigint,
    cron alk._cron NOT NULL,
    created_at bigint NOT NULL,
    updated_at bigint NOT NULL,
    CONSTRAINT schedules_pkey PRIMARY KEY (name),
    CONSTRAINT schedules_name_named CHECK (name <> ''),
    CONSTRAINT schedules_queue_named CHECK (queue <> '')
);
COMMENT ON TABLE alk.schedules IS 'Every registered schedule with its parsed spec and next boundary. Private: use the alk.* functions.';

-- tick finds due schedules by their next boundary.
CREATE INDEX schedules_due ON alk.schedules (next_fire_at) WHERE next_fire_at IS NOT NULL;

-- Parsing ------------------------------------------------------------------

-- LK003 for one field of a spec: "spec '<spec>': <field> field '<expr>': <problem>".
CREATE FUNCTION alk._cron_bad(spec text, field text, expr text, problem text)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM alk._raise('LK003', 'spec ' || alk._show(spec) || ': ' || field || ' field ' || alk._show(expr) || ': ' || problem);
    RETURN false;
END
$$;
COMMENT ON FUNCTION alk._cron_bad(text, text, text, text) IS 'internal: LK003 naming the spec, the field and its text';

-- One value of a field: a number or (month, day-of-week) a name. Day-of-week
-- 7 is Sunday, as in croniter. Range checks are the caller's.
CREATE FUNCTION alk._cron_value(spec text, field text, expr text, token text)
RETURNS integer
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    folded text := lower(token);
    position integer;
    v integer;
BEGIN
    IF token ~ '^[0-9]+$' THEN
        -- Leading zeros are fine; anything past 1000000 is out of every range.
        v := least(token::numeric, 1000000)::integer;
        RETURN CASE WHEN field = 'day-of-week' AND v = 7 THEN 0 ELSE v END;
    END IF;
    IF field = 'month' THEN
        position := array_position(ARRAY['jan', 'feb', 'mar', 'apr', 'may', 'jun',
                                         'jul', 'aug', 'sep', 'oct', 'nov', 'dec'], folded);
        IF position IS NOT NULL THEN
            RETURN position;
        END IF;
    ELSIF field = 'day-of-week' THEN
        position := array_position(ARRAY['sun', 'mon', 'tue', 'wed', 'thu', 'fri', 'sat'], folded);
        IF position IS NOT NULL THEN
            RETURN position - 1;
        END IF;
    END IF;
    IF folded ~ '^[hr]($|\()' OR (field IN ('day-of-month', 'day-of-week') AND folded ~ '^[0-9]*[lw][0-9]*$') THEN
        PERFORM alk._cron_bad(spec, field, expr, alk._show(token)
            || ' is a croniter extension (L, W, #, H, R) that pyalk does not support');
    END IF;
    PERFORM alk._cron_bad(spec, field, expr, alk._show(token) || ' is not a number'
        || CASE field WHEN 'month' THEN ' or a month name (jan-dec)'
                      WHEN 'day-of-week' THEN ' or a day name (sun-sat)' ELSE '' END);
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION alk._cron_value(text, text, text, text) IS 'internal: one cron field value (number or name), LK003 otherwise';

CREATE FUNCTION alk._cron_step(spec text, field text, expr text, token text)
RETURNS integer
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    step numeric := token::numeric;
BEGIN
    IF step = 0 THEN
        PERFORM alk._cron_bad(spec, field, expr, 'step 0 must be positive');
    END IF;
    -- A step wider than every field keeps only its start; 1000 behaves alike.
    RETURN least(step, 1000)::integer;
END
$$;
COMMENT ON FUNCTION alk._cron_step(text, text, text, text) IS 'internal: a cron step (a positive whole number), LK003 otherwise';

-- One field, read the way croniter reads each comma-separated element:
--   *            every value                 a-b/s   a to b in steps of s
--   */s          first to last value by s    a/s     a to the last value by s
--   a            one value                   a-b     with a > b it wraps around
-- with croniter's two quirks: a range written with equal ends ('5-5',
-- '5-5/s') is the whole field (then stepped), and a wrapping range restarts
-- one past where modular arithmetic would ('50-10/7' on minutes is 50,57,5).
-- Every value must land in lo..hi, or the spec is refused.
-- Returns the field's next-value table, whether a '*' (or '?') stands in it,
-- and how many values it allows (hi - lo + 1 for a star).
CREATE FUNCTION alk._cron_field(spec text, field text, expr text, lo integer, hi integer,
                                OUT next_values integer[], OUT star boolean, OUT how_many integer)
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    member boolean[] := array_fill(false, ARRAY[hi - lo + 1], ARRAY[lo]);
    elem text;
    m text[];
    low integer;
    high integer;
    step integer;
    from_step boolean;
    v integer;
    last_v integer;
    upcoming integer;
BEGIN
    star := false;
    IF strpos(expr, '?') > 0 THEN
        IF expr <> '?' THEN
            PERFORM alk._cron_bad(spec, field, expr, '''?'' must stand alone');
        END IF;
        IF field NOT IN ('day-of-month', 'day-of-week') THEN
            PERFORM alk._cron_bad(spec, field, expr, '''?'' is only allowed in day-of-month and day-of-week');
        END IF;
        star := true;
    ELSE
        FOREACH elem IN ARRAY string_to_array(expr, ',') LOOP
            IF elem = '*' THEN
                star := true;
                CONTINUE;
            END IF;
            IF elem = '' THEN
                PERFORM alk._cron_bad(spec, field, expr, 'empty list element');
            END IF;
            IF strpos(elem, '#') > 0 THEN
                PERFORM alk._cron_bad(spec, field, expr, alk._show(elem)
                    || ' is a croniter extension (L, W, #, H, R) that pyalk does not support');
            END IF;
            m := regexp_match(elem, '^\*/([0-9]+)$');
            IF m IS NOT NULL THEN
                low := lo;
                high := hi;
                step := alk._cron_step(spec, field, expr, m[1]);
                from_step := false;
            ELSE
                m := regexp_match(elem, '^([^-/]+)-([^-/]+)(/([0-9]+))?$');
                IF m IS NOT NULL THEN
                    low := alk._cron_value(spec, field, expr, m[1]);
                    high := alk._cron_value(spec, field, expr, m[2]);
                    step := CASE WHEN m[4] IS NULL THEN 1 ELSE alk._cron_step(spec, field, expr, m[4]) END;
                    from_step := false;
                ELSE
                    m := regexp_match(elem, '^([^-/]+)/([0-9]+)$');
                    IF m IS NULL THEN
                        -- A single value.
                        v := alk._cron_value(spec, field, expr, elem);
                        IF v < lo OR v > hi THEN
                            PERFORM alk._cron_bad(spec, field, expr, 'value ' || alk._show(elem)
                                || ' is out of range ' || lo || '-' || hi);
                        END IF;
                        member[v] := true;
                        CONTINUE;
                    END IF;
                    low := alk._cron_value(spec, field, expr, m[1]);
                    high := hi;
                    step := alk._cron_step(spec, field, expr, m[2]);
                    from_step := true;
                END IF;
            END IF;
            IF greatest(low, high) > hi THEN
                PERFORM alk._cron_bad(spec, field, expr, 'value ' || greatest(low, high)
                    || ' in ' || alk._show(elem) || ' is out of range ' || lo || '-' || hi);
            END IF;
            IF low = high AND NOT from_step THEN
                -- croniter: a range with equal ends is the whole cycle.
                low := lo;
                high := hi;
            END IF;
            IF low < lo THEN
                PERFORM alk._cron_bad(spec, field, expr, 'value ' || low
                    || ' in ' || alk._show(elem) || ' is out of range ' || lo || '-' || hi);
            END IF;
            IF from_step AND low = high THEN
                member[low] := true;
            ELSIF low > high THEN
                -- Wrap: low to the field's end, then on from the start.
                v := low;
                WHILE v <= hi LOOP
                    member[v] := true;
                    last_v := v;
                    v := v + step;
                END LOOP;
                v := lo + CASE WHEN last_v + step > hi + 1 THEN last_v + step - hi ELSE 0 END;
                WHILE v <= high LOOP
                    member[v] := true;
                    v := v + step;
                END LOOP;
            ELSE
                v := low;
                WHILE v <= high LOOP
                    member[v] := true;
                    v := v + step;
                END LOOP;
            END IF;
        END LOOP;
    END IF;
    next_values := array_fill(NULL::integer, ARRAY[hi - lo + 1], ARRAY[lo]);
    how_many := 0;
    FOR x IN REVERSE hi..lo LOOP
        IF star OR member[x] THEN
            upcoming := x;
            how_many := how_many + 1;
        END IF;
        next_values[x] := upcoming;
    END LOOP;
END
$$;
COMMENT ON FUNCTION alk._cron_field(text, text, text, integer, integer) IS
'internal: one cron field as a next-value table (entry x = smallest allowed value >= x, or NULL), whether it holds a '
'star, and how many values it allows; LK003 naming the field and value when it cannot be read';

CREATE FUNCTION alk._cron_parse(spec text)
RETURNS alk._cron
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s text;
    m text[];
    n numeric;
    fields text[];
    f_second record;
    f_minute record;
    f_hour record;
    f_dom record;
    f_month record;
    f_dow record;
    longest integer := 0;
    c alk._cron;
    shape constant text := 'expected 5 fields (minute hour day-of-month month day-of-week), 6 with a leading second, '
        || 'a macro (@yearly @annually @monthly @weekly @daily @midnight @hourly) or @every <n><s|m|h|d>';
BEGIN
    IF spec IS NULL THEN
        PERFORM alk._raise('LK003', 'spec must be a cron expression, got NULL');
    END IF;
    -- Names and macros are case-insensitive; the fields keep their case for
    -- the error messages.
    s := lower(spec);
    IF starts_with(s, '@every') THEN
        m := regexp_match(s, '^@every[ \t\n\r\f\v]+([0-9]+)([smhd])$');
        IF m IS NULL THEN
            PERFORM alk._raise('LK003', 'spec ' || alk._show(spec)
                || ': @every takes a whole number and a unit s, m, h or d, e.g. ''@every 90s''');
        END IF;
        n := m[1]::numeric * CASE m[2] WHEN 's' THEN 1 WHEN 'm' THEN 60 WHEN 'h' THEN 3600 ELSE 86400 END;
        IF n = 0 THEN
            PERFORM alk._raise('LK003', 'spec ' || alk._show(spec) || ': the @every period must be positive');
        END IF;
        IF n > 9223372036854775807 THEN
            PERFORM alk._raise('LK003', 'spec ' || alk._show(spec) || ': the @every period does not fit in bigint seconds');
        END IF;
        c.every_s := n::bigint;
        RETURN c;
    END IF;
    -- Macros are matched on the whole spec, as croniter does.
    s := CASE s
        WHEN '@yearly' THEN '0 0 1 1 *'
        WHEN '@annually' THEN '0 0 1 1 *'
        WHEN '@monthly' THEN '0 0 1 * *'
        WHEN '@weekly' THEN '0 0 * * 0'
        WHEN '@daily' THEN '0 0 * * *'
        WHEN '@midnight' THEN '0 0 * * *'
        WHEN '@hourly' THEN '0 * * * *'
        ELSE spec END;
    IF starts_with(s, '@') THEN
        PERFORM alk._raise('LK003', 'spec ' || alk._show(spec) || ' is not a known macro; ' || shape);
    END IF;
    -- Fields are separated by ASCII whitespace only.
    s := regexp_replace(s, '^[ \t\n\r\f\v]+|[ \t\n\r\f\v]+$', '', 'g');
    IF s = '' THEN
        PERFORM alk._raise('LK003', 'spec ' || alk._show(spec) || ' is empty; ' || shape);
    END IF;
    fields := regexp_split_to_array(s, '[ \t\n\r\f\v]+');
    IF cardinality(fields) = 6 THEN
        SELECT * INTO f_second FROM alk._cron_field(spec, 'second', fields[1], 0, 59);
        c.seconds := f_second.next_values;
        fields := fields[2:6];
    ELSIF cardinality(fields) <> 5 THEN
        PERFORM alk._raise('LK003', 'spec ' || alk._show(spec) || ' has ' || cardinality(fields) || ' fields; ' || shape);
    END IF;
    SELECT * INTO f_minute FROM alk._cron_field(spec, 'minute', fields[1], 0, 59);
    SELECT * INTO f_hour FROM alk._cron_field(spec, 'hour', fields[2], 0, 23);
    SELECT * INTO f_dom FROM alk._cron_field(spec, 'day-of-month', fields[3], 1, 31);
    SELECT * INTO f_month FROM alk._cron_field(spec, 'month', fields[4], 1, 12);
    SELECT * INTO f_dow FROM alk._cron_field(spec, 'day-of-week', fields[5], 0, 6);
    c.minutes := f_minute.next_values;
    c.hours := f_hour.next_values;
    c.doms := f_dom.next_values;
    c.months := f_month.next_values;
    c.dows := f_dow.next_values;
    -- croniter's "unrestricted": a star, or every value listed; but a full
    -- day list only counts as a star when the other day field was written
    -- with a '*' in it.
    c.dom_star := f_dom.star OR (f_dom.how_many = 31 AND strpos(fields[5], '*') > 0);
    c.dow_star := f_dow.star OR (f_dow.how_many = 7 AND strpos(fields[3], '*') > 0);
    c.hour_star := f_hour.how_many = 24;
    -- Can an allowed day-of-month fall in an allowed month at all (February
    -- counted with 29 days)? Its smallest allowed value decides.
    FOR mo IN 1..12 LOOP
        IF c.months[mo] = mo THEN
            longest := greatest(longest, CASE WHEN mo = 2 THEN 29 ELSE 30 + (mo + mo / 8) % 2 END);
        END IF;
    END LOOP;
    c.dom_feasible := c.dom_star OR c.doms[1] <= longest;
    IF NOT c.dom_feasible AND c.dow_star THEN
        PERFORM alk._raise('LK003', 'spec ' || alk._show(spec) || ' never fires: day-of-month '
            || alk._show(fields[3]) || ' does not occur in month ' || alk._show(fields[4]));
    END IF;
    RETURN c;
END
$$;
COMMENT ON FUNCTION alk._cron_parse(text) IS 'internal: parse a cron spec once; LK003 naming the field and value when it cannot be read';

-- Time zones ---------------------------------------------------------------

-- A time zone is an IANA name, spelled exactly as the tz database spells it
-- (what Python's zoneinfo accepts). PostgreSQL's TimeZone setting loads it;
-- the engine always converts through that setting, never AT TIME ZONE, which
-- reads names such as 'CET' or 'EST' as fixed-offset abbreviations.
CREATE FUNCTION alk._cron_tz(tz text)
RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET TimeZone = 'UTC'
AS $$
DECLARE
    loaded text;
BEGIN
    IF tz IS NULL THEN
        RETURN 'UTC';
    END IF;
    BEGIN
        PERFORM set_config('TimeZone', tz, true);
    EXCEPTION WHEN invalid_parameter_value THEN
        PERFORM alk._raise('LK003', 'tz ' || alk._show(tz) || ' is not a known IANA time zone name');
    END;
    loaded := current_setting('TimeZone');
    IF loaded IS DISTINCT FROM tz THEN
        PERFORM alk._raise('LK003', 'tz ' || alk._show(tz) || ' is not a known IANA time zone name'
            || CASE WHEN lower(loaded) = lower(tz) THEN ' (names are case-sensitive: ' || alk._show(loaded) || ')' ELSE '' END);
    END IF;
    -- PostgreSQL also reads POSIX TZ strings ('UTC+3', '<+05>-5'); every one
    -- has a digit, so names with digits must be in the tz database itself
    -- ('Etc/GMT+5', 'EST5EDT'). Slow (a directory scan), hence only here.
    IF tz ~ '[0-9]' AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_timezone_names z WHERE z.name = tz) THEN
        PERFORM alk._raise('LK003', 'tz ' || alk._show(tz) || ' is a POSIX TZ string, not an IANA time zone name');
    END IF;
    RETURN tz;
END
$$;
COMMENT ON FUNCTION alk._cron_tz(text) IS 'internal: the IANA zone name itself (UTC for NULL), LK003 unless the server knows it';

-- Evaluation ---------------------------------------------------------------

-- The first wall time strictly after `after` (local seconds, see the header)
-- that the spec matches, field by field: month, then day (day-of-month when
-- use_dom, day-of-week when use_dow), hour, minute, second. Each mismatch
-- jumps to the next candidate of that field and resets the finer fields; a
-- spec's fields always allow some day within a few years, so the loop is
-- short (the guard is a backstop, not a limit anyone reaches).
CREATE FUNCTION alk._cron_search(c alk._cron, after bigint, use_dom boolean, use_dow boolean)
RETURNS bigint
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    seconds integer[] := c.seconds;
    minutes integer[] := c.minutes;
    hours integer[] := c.hours;
    doms integer[] := c.doms;
    months integer[] := c.months;
    dows integer[] := c.dows;
    n bigint;
    dn bigint;
    sod integer;
    z bigint;
    era bigint;
    doe bigint;
    yoe bigint;
    doy bigint;
    mp bigint;
    y bigint;
    mo integer;
    d integer;
    h integer;
    mi integer;
    se integer;
    w integer;
    v integer;
    ml integer;
    guard integer := 0;
BEGIN
    -- Strictly after: the next second, or the next whole minute.
    n := CASE WHEN seconds IS NULL THEN after - ((after % 60) + 60) % 60 + 60 ELSE after + 1 END;
    LOOP
        guard := guard + 1;
        IF guard > 10000 THEN
            RETURN NULL;
        END IF;
        sod := ((n % 86400) + 86400) % 86400;
        dn := (n - sod) / 86400;
        -- Civil date of day number dn (days since 1970-01-01), proleptic
        -- Gregorian (H. Hinnant's days-to-civil algorithm).
        z := dn + 719468;
        era := (CASE WHEN z >= 0 THEN z ELSE z - 146096 END) / 146097;
        doe := z - era * 146097;
        yoe := (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
        doy := doe - (365 * yoe + yoe / 4 - yoe / 100);
        mp := (5 * doy + 2) / 153;
        d := (doy - (153 * mp + 2) / 5 + 1)::integer;
        mo := (CASE WHEN mp < 10 THEN mp + 3 ELSE mp - 9 END)::integer;
        y := yoe + era * 400 + CASE WHEN mo <= 2 THEN 1 ELSE 0 END;

        v := months[mo];
        IF v IS DISTINCT FROM mo THEN
            -- The first day of the next allowed month (civil-to-days).
            IF v IS NULL THEN
                y := y + 1;
                v := months[1];
            END IF;
            y := y - CASE WHEN v <= 2 THEN 1 ELSE 0 END;
            era := (CASE WHEN y >= 0 THEN y ELSE y - 399 END) / 400;
            yoe := y - era * 400;
            doy := (153 * (CASE WHEN v > 2 THEN v - 3 ELSE v + 9 END) + 2) / 5;
            n := (era * 146097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719468) * 86400;
            CONTINUE;
        END IF;
        IF use_dom THEN
            v := doms[d];
            ml := CASE WHEN mo <> 2 THEN 30 + (mo + mo / 8) % 2
                       WHEN y % 4 = 0 AND (y % 100 <> 0 OR y % 400 = 0) THEN 29
                       ELSE 28 END;
            IF v IS NULL OR v > ml THEN
                -- No allowed day left this month: the first of the next.
                n := (dn + ml - d + 1) * 86400;
                CONTINUE;
            END IF;
            IF v <> d THEN
                n := (dn + v - d) * 86400;
                CONTINUE;
            END IF;
        END IF;
        IF use_dow THEN
            w := (((dn + 4) % 7) + 7) % 7;   -- 1970-01-01 was a Thursday
            v := coalesce(dows[w], dows[0] + 7);
            IF v <> w THEN
                n := (dn + v - w) * 86400;
                CONTINUE;
            END IF;
        END IF;
        h := sod / 3600;
        v := hours[h];
        IF v IS DISTINCT FROM h THEN
            n := CASE WHEN v IS NULL THEN (dn + 1) * 86400 ELSE dn * 86400 + v * 3600 END;
            CONTINUE;
        END IF;
        mi := (sod / 60) % 60;
        v := minutes[mi];
        IF v IS DISTINCT FROM mi THEN
            n := dn * 86400 + h * 3600 + CASE WHEN v IS NULL THEN 3600 ELSE v * 60 END;
            CONTINUE;
        END IF;
        IF seconds IS NOT NULL THEN
            se := sod % 60;
            v := seconds[se];
            IF v IS DISTINCT FROM se THEN
                n := n - se + coalesce(v, 60);
                CONTINUE;
            END IF;
        END IF;
        RETURN n;
    END LOOP;
END
$$;
COMMENT ON FUNCTION alk._cron_search(alk._cron, bigint, boolean, boolean) IS
'internal: the first matching wall time (local seconds) strictly after the given one';

-- The instant of a wall time in the session's TimeZone, the way croniter
-- (through dateutil and zoneinfo) resolves it:
--   * one instant: that one (exact);
--   * two (a repeated hour): the first if it is after `after`, else the second;
--   * none (a skipped hour): the wall time moved forward in whole minutes to
--     the first that exists (exact = false), and gap_end = the first wall
--     time after the gap.
-- Offsets come from the zone at 16 hours either side of the wall time
-- (every UTC offset in the tz database is within +-16 h), so one transition
-- near the wall time is seen from both sides.
CREATE FUNCTION alk._cron_localize(wall bigint, after bigint,
                                   OUT instant bigint, OUT exact boolean, OUT utc_offset bigint, OUT gap_end bigint)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    off_early bigint := date_part('timezone', to_timestamp(wall - 57600))::bigint;
    off_late bigint := date_part('timezone', to_timestamp(wall + 57600))::bigint;
    early_ok boolean;
    late_ok boolean;
    lo bigint;
    hi bigint;
    mid bigint;
BEGIN
    exact := true;
    IF off_early = off_late THEN
        instant := wall - off_early;
        utc_offset := off_early;
        RETURN;
    END IF;
    early_ok := date_part('timezone', to_timestamp(wall - off_early))::bigint = off_early;
    late_ok := date_part('timezone', to_timestamp(wall - off_late))::bigint = off_late;
    IF early_ok AND late_ok THEN
        -- Repeated: the first occurrence unless it is not after `after`.
        instant := least(wall - off_early, wall - off_late);
        IF instant <= after THEN
            instant := greatest(wall - off_early, wall - off_late);
        END IF;
        utc_offset := wall - instant;
    ELSIF early_ok THEN
        instant := wall - off_early;
        utc_offset := off_early;
    ELSIF late_ok THEN
        instant := wall - off_late;
        utc_offset := off_late;
    ELSIF off_late < off_early THEN
        -- Not a gap, yet neither offset fits (two transitions within hours
        -- of each other, unknown in practice): take the earlier offset.
        instant := wall - off_early;
        utc_offset := off_early;
    ELSE
        -- Skipped (off_late > off_early): the transition instant lies in
        -- (wall - off_late, wall - off_early]; find its first second.
        lo := wall - off_late;
        hi := wall - off_early;
        WHILE hi - lo > 1 LOOP
            mid := lo + (hi - lo) / 2;
            IF date_part('timezone', to_timestamp(mid))::bigint = off_early THEN
                lo := mid;
            ELSE
                hi := mid;
            END IF;
        END LOOP;
        gap_end := hi + off_late;
        exact := false;
        utc_offset := off_late;
        instant := wall + ((gap_end - wall + 59) / 60) * 60 - off_late;
    END IF;
END
$$;
COMMENT ON FUNCTION alk._cron_localize(bigint, bigint) IS
'internal: the instant of a wall time in the session time zone, resolving repeated and skipped wall times like croniter';

-- The next fire of one day-matching mode (see the header, steps 1-3).
CREATE FUNCTION alk._cron_aware(c alk._cron, after bigint, use_dom boolean, use_dow boolean)
RETURNS bigint
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    off_now bigint := date_part('timezone', to_timestamp(after))::bigint;
    wall_now bigint := after + off_now;
    wall bigint;
    hit record;
    alt record;
    guard integer := 0;
BEGIN
    wall := alk._cron_search(c, wall_now, use_dom, use_dow);
    IF wall IS NULL THEN
        RETURN NULL;
    END IF;
    hit := alk._cron_localize(wall, after);
    IF NOT hit.exact AND (hit.instant <= after OR c.hour_star) THEN
        -- Do not fire at the end of the gap: the next match after it.
        WHILE NOT hit.exact AND guard < 100 LOOP
            guard := guard + 1;
            wall := alk._cron_search(c, hit.gap_end - 1, use_dom, use_dow);
            IF wall IS NULL THEN
                RETURN NULL;
            END IF;
            hit := alk._cron_localize(wall, after);
        END LOOP;
    END IF;
    IF hit.utc_offset = off_now THEN
        RETURN hit.instant;
    END IF;
    -- The offset changed on the way: also search from `after` read in the
    -- new offset (this finds the second pass through a repeated hour).
    wall := alk._cron_search(c, wall_now + hit.utc_offset - off_now, use_dom, use_dow);
    IF wall IS NULL THEN
        RETURN hit.instant;
    END IF;
    alt := alk._cron_localize(wall, after);
    IF NOT alt.exact OR alt.instant <= after THEN
        RETURN hit.instant;
    END IF;
    RETURN least(hit.instant, alt.instant);
END
$$;
COMMENT ON FUNCTION alk._cron_aware(alk._cron, bigint, boolean, boolean) IS
'internal: the next fire for one day-matching mode in the session time zone';

-- The engine: the first fire strictly after `after` of a parsed spec in a
-- validated zone, or NULL when none exists up to 9999-12-31T23:59:59Z.
CREATE FUNCTION alk._cron_next(c alk._cron, after bigint, tz text)
RETURNS bigint
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET TimeZone = 'UTC'
AS $$
DECLARE
    -- The calendar the engine (and Python's datetime) can express.
    first_instant constant bigint := -62135596800;   -- 0001-01-01T00:00:00Z
    last_instant constant bigint := 253402300799;    -- 9999-12-31T23:59:59Z
    start bigint;
    answer numeric;
BEGIN
    IF after IS NULL OR after >= last_instant THEN
        RETURN NULL;
    END IF;
    IF c.every_s IS NOT NULL THEN
        -- Anchored at the unix epoch: the multiples of the period.
        answer := (floor(after::numeric / c.every_s) + 1) * c.every_s;
    ELSE
        -- Before the calendar starts, the first fire is its first match.
        start := greatest(after, first_instant - 1);
        IF tz IS DISTINCT FROM 'UTC' THEN
            -- Local to this call: the SET clause above restores the caller's.
            PERFORM set_config('TimeZone', tz, true);
        END IF;
        IF c.dom_star OR c.dow_star THEN
            answer := alk._cron_aware(c, start, NOT c.dom_star, NOT c.dow_star);
        ELSIF c.dom_feasible THEN
            -- Both day fields restricted: a day matching either one fires.
            answer := least(alk._cron_aware(c, start, true, false), alk._cron_aware(c, start, false, true));
        ELSE
            answer := alk._cron_aware(c, start, false, true);
        END IF;
    END IF;
    RETURN CASE WHEN answer <= last_instant THEN answer::bigint END;
END
$$;
COMMENT ON FUNCTION alk._cron_next(alk._cron, bigint, text) IS
'internal: the next fire of a parsed spec strictly after `after` in zone tz, or NULL past 9999-12-31T23:59:59Z';

CREATE FUNCTION alk.cron_next(spec text, after bigint, tz text DEFAULT 'UTC')
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

-- Schedules ----------------------------------------------------------------

CREATE FUNCTION alk.schedule(
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

CREATE FUNCTION alk.unschedule(name text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM alk._check_name('name', unschedule.name);
    DELETE FROM alk.schedules s WHERE s.name = unschedule.name;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION alk.unschedule(text) IS
'Remove the schedule `name`; true if it existed. Jobs it already enqueued stay. '
'Example: SELECT alk.unschedule(''nightly-report'');';

CREATE FUNCTION alk.list_schedules()
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

-- tick ---------------------------------------------------------------------

-- How many boundaries one tick enqueues per schedule before it skips the
-- rest of a backlog (docs/schedule.md, "Catching up").
CREATE FUNCTION alk._tick_catch_up_cap()
RETURNS integer
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT 100 $$;
COMMENT ON FUNCTION alk._tick_catch_up_cap() IS 'internal: the most boundaries one tick fires per schedule (100)';

CREATE FUNCTION alk.tick(now bigint DEFAULT alk.now())
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

-- The leader's tick: leadership (the lease alk:scheduler) and the firing in
-- one transaction. The lock row _try_lock writes stays locked until this
-- transaction ends, so a contender waits for it and then finds the lease
-- held; a caller whose lease was taken raises before anything fires.
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

-- schedules -----------------------------------------------------------------

-- The last boundary each schedule fired, written by the tick path.
CREATE TABLE alk.schedule_fires (
    name text NOT NULL,
    fire_at bigint NOT NULL,
    job_id bigint,
    fired_at bigint NOT NULL,
    CONSTRAINT schedule_fires_pkey PRIMARY KEY (name)
);
COMMENT ON TABLE alk.schedule_fires IS 'The last fire of every schedule. Private: use the alk.* functions.';

-- The tick path's one call per fired boundary. Monotone: a late or
-- concurrent tick that fired an earlier boundary never moves it back.
CREATE FUNCTION alk._note_fire(name text, fire_at bigint, job_id bigint)
RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    INSERT INTO alk.schedule_fires AS f (name, fire_at, job_id, fired_at)
    VALUES ($1, $2, $3, alk.now())
    ON CONFLICT ON CONSTRAINT schedule_fires_pkey DO UPDATE
       SET fire_at = excluded.fire_at, job_id = excluded.job_id, fired_at = excluded.fired_at
     WHERE f.fire_at < excluded.fire_at
$$;
COMMENT ON FUNCTION alk._note_fire(text, bigint, bigint) IS
'internal: remember the boundary a schedule fired (monotone) and the job it enqueued';

CREATE TYPE alk.schedule_state AS (
    name text,
    spec text,
    tz text,
    queue text,
    next_fire_at bigint,
    last_fire_at bigint,
    last_job_id bigint,
    last_fired_at bigint
);
COMMENT ON TYPE alk.schedule_state IS 'One schedule''s row of alk.schedule_overview.';

CREATE FUNCTION alk.schedule_overview()
RETURNS SETOF alk.schedule_state
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT s.name, s.spec, s.tz, s.queue, s.next_fire_at, f.fire_at, f.job_id, f.fired_at
      FROM alk.schedules s
      LEFT JOIN alk.schedule_fires f ON f.name = s.name
     ORDER BY s.name
$$;
COMMENT ON FUNCTION alk.schedule_overview() IS
'Every schedule by name with its next fire and its last: last_fire_at (the boundary), last_job_id (the job it '
'enqueued) and last_fired_at (when the tick fired it); NULL until it first fires. '
'Example: SELECT name, next_fire_at - alk.now() AS due_in_s, last_fire_at FROM alk.schedule_overview();';

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
