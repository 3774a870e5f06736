-- pyalk stream: event streams (docs/contract.md#streams).
--
-- current definition; edit here, then add a version file (docs/migrations.md).
-- Landed as 0003_stream.sql; a fresh install runs this file, an upgrade runs the
-- version files, and tests/migrations proves both give the same catalog.
--
-- A stream is an append-only log of JSON events, each at an offset that is
-- per stream, starts at 1, has no gaps between committed events and is never
-- reused, not even after a trim. Consumers keep a monotone checkpoint per
-- (stream, consumer).
--
-- Commit order. Offsets are COMMIT ORDERED: a reader that has seen offset k
-- never later finds a newly committed event at or below k. A sequence cannot
-- give this (publisher A draws 1, B draws 2, B commits, a reader sees 2, then A
-- commits 1 behind the reader's back). publish must return the offset, so the
-- offset is fixed before the publisher commits; the only way to make offset
-- order equal commit order is then to let at most one transaction hold the
-- "next offset" of a stream between drawing it and committing. alk.streams
-- keeps one head row per stream; publish increments it with an upsert, and
-- the row lock it takes is held until the publishing transaction ends:
--   * a second publisher of the SAME stream waits at the upsert until the
--     first commits (and then, under READ COMMITTED, re-reads the committed
--     head and continues from it) or rolls back (and then draws the same
--     offset, which was never visible to anyone: committed offsets are dense);
--   * when publisher k+1 reads head k, the transaction that wrote head k has
--     already committed, so offset k is visible to every snapshot that can see
--     offset k+1. By induction every offset below a visible one is visible (or
--     was trimmed).
--   * publishers of DIFFERENT streams touch different head rows and never wait
--     for each other.
-- The cost: publishers of one stream are serialised for the remainder of the
-- publishing transaction. Publish late in long transactions (docs/stream.md
-- has the numbers). Under REPEATABLE READ or SERIALIZABLE a publisher that
-- waited gets a serialization failure instead, as any concurrent update does.
--
-- Wake-ups. publish sends NOTIFY on the channel alk.stream_channel(stream),
-- 'alk_s_' followed by 32 hex digits of sha256(stream): always a valid,
-- 38-byte identifier whatever the stream name's length or characters, and one
-- channel per stream so a listener only hears its own streams. The payload is
-- empty, so PostgreSQL folds every publish of one transaction to the same
-- stream into one notification; a listener re-reads from its own position.
-- NOTIFY is delivered at commit; a rolled-back publish wakes nobody.

CREATE TYPE alk.stream_event AS (
    stream text,
    event_offset bigint,
    key text,
    payload jsonb,
    created_at bigint
);
COMMENT ON TYPE alk.stream_event IS 'One stream event as every read function returns it.';

-- The head of every stream: the last offset handed out. Never deleted, so
-- offsets are never reused after a trim. Its row lock is the publish lock.
CREATE TABLE alk.streams (
    stream text NOT NULL,
    last_offset bigint NOT NULL,
    created_at bigint NOT NULL,
    CONSTRAINT streams_pkey PRIMARY KEY (stream),
    CONSTRAINT streams_stream_named CHECK (stream <> ''),
    CONSTRAINT streams_offsets_start_at_1 CHECK (last_offset >= 1)
) WITH (fillfactor = 50);
COMMENT ON TABLE alk.streams IS 'The head (last offset handed out) of every stream. Private: use the alk.* functions.';
-- One row per stream rewritten by every publish: leave room for HOT updates
-- and vacuum the dead versions early.
ALTER TABLE alk.streams SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.1
);

CREATE TABLE alk.stream_events (
    stream text NOT NULL,
    event_offset bigint NOT NULL,
    key text,
    payload jsonb NOT NULL,
    created_at bigint NOT NULL,
    -- The stream leads the key so the table can be hash-distributed by stream.
    CONSTRAINT stream_events_pkey PRIMARY KEY (stream, event_offset),
    CONSTRAINT stream_events_offset_positive CHECK (event_offset >= 1)
);
COMMENT ON TABLE alk.stream_events IS 'Every event of every stream. Private: use the alk.* functions.';
ALTER TABLE alk.stream_events SET (
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02
);

CREATE TABLE alk.stream_consumers (
    stream text NOT NULL,
    consumer text NOT NULL,
    at_offset bigint NOT NULL,
    updated_at bigint NOT NULL,
    CONSTRAINT stream_consumers_pkey PRIMARY KEY (stream, consumer),
    CONSTRAINT stream_consumers_named CHECK (stream <> '' AND consumer <> '')
);
COMMENT ON TABLE alk.stream_consumers IS 'The saved checkpoint of every (stream, consumer). Private: use the alk.* functions.';

-- wake-ups ------------------------------------------------------------------

CREATE FUNCTION alk._stream_channel(stream text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT alk._channel('alk_s_', $1)
$$;
COMMENT ON FUNCTION alk._stream_channel(text) IS 'internal: the NOTIFY channel of a stream (no name check)';

CREATE FUNCTION alk.stream_channel(stream text)
RETURNS text
LANGUAGE sql IMMUTABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT alk._stream_channel(alk._check_name('stream', $1))
$$;
COMMENT ON FUNCTION alk.stream_channel(text) IS
'The LISTEN channel publish notifies for a stream: ''alk_s_'' and the first 32 hex digits of sha256(stream as UTF-8), '
'a 38-byte identifier whatever the name. The notification payload is empty; re-read from your own offset on wake-up. '
'Example: SELECT alk.stream_channel(''orders''); then LISTEN "<that channel>";';

-- publish -------------------------------------------------------------------

-- The one implementation behind publish and publish_batch. The caller has
-- validated the stream name.
CREATE FUNCTION alk._publish(stream text, payloads jsonb[], keys text[], clock bigint)
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    n bigint := cardinality(payloads);
    head bigint;
BEGIN
    PERFORM alk._check_payloads(payloads);
    IF keys IS NOT NULL AND cardinality(keys) <> n THEN
        PERFORM alk._raise('LK002', 'keys must have one entry per payload: got ' || n
            || ' payloads and ' || cardinality(keys) || ' keys');
    END IF;
    IF n = 0 THEN
        RETURN;
    END IF;
    -- Draw n offsets: create the head on first publish, else move it. The row
    -- lock taken here is held until this transaction ends; that is what makes
    -- offsets commit ordered (see the top of this file).
    INSERT INTO alk.streams AS s (stream, last_offset, created_at)
    VALUES (stream, n, clock)
    ON CONFLICT ON CONSTRAINT streams_pkey
        DO UPDATE SET last_offset = s.last_offset + excluded.last_offset
    RETURNING s.last_offset INTO head;

    INSERT INTO alk.stream_events (stream, event_offset, key, payload, created_at)
    SELECT stream, head - n + e.ord, e.key, e.payload, clock
      FROM unnest(payloads, keys) WITH ORDINALITY AS e(payload, key, ord);

    -- Delivered at commit, folded per transaction (same channel, same payload).
    PERFORM pg_catalog.pg_notify(alk._stream_channel(stream), '');

    RETURN QUERY SELECT head - n + g FROM pg_catalog.generate_series(1::bigint, n) AS g;
END
$$;
COMMENT ON FUNCTION alk._publish(text, jsonb[], text[], bigint) IS
'internal: append events at the next offsets of a stream (head row lock held to commit) and notify its channel';

CREATE FUNCTION alk.publish(stream text, payload jsonb, key text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock bigint := alk.now();
    at_offset bigint;
BEGIN
    PERFORM alk._check_name('stream', publish.stream);
    SELECT * INTO at_offset FROM alk._publish(publish.stream, ARRAY[payload], ARRAY[key], clock);
    RETURN at_offset;
END
$$;
COMMENT ON FUNCTION alk.publish(text, jsonb, text) IS
'Append one event to a stream; returns its offset (per stream, from 1, commit ordered, never reused). key is optional '
'free text stored with the event. Publishers of one stream wait for each other until commit; listeners of '
'alk.stream_channel(stream) are notified at commit. '
'Example: SELECT alk.publish(stream => ''orders'', payload => ''{"id": 7}'', key => ''customer-42'');';

CREATE FUNCTION alk.publish_batch(stream text, payloads jsonb[], keys text[] DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock bigint := alk.now();
BEGIN
    PERFORM alk._check_name('stream', publish_batch.stream);
    RETURN QUERY SELECT * FROM alk._publish(publish_batch.stream, payloads, keys, clock);
END
$$;
COMMENT ON FUNCTION alk.publish_batch(text, jsonb[], text[]) IS
'Append several events to a stream in one call; returns their offsets (consecutive) in input order. keys, when given, '
'holds one key (or NULL) per payload. An empty array publishes nothing. '
'Example: SELECT * FROM alk.publish_batch(''orders'', ARRAY[''{"id": 7}'', ''{"id": 8}'']::jsonb[], ARRAY[''a'', ''b'']);';

-- read ----------------------------------------------------------------------

CREATE FUNCTION alk.read_since(stream text, after_offset bigint DEFAULT 0, n bigint DEFAULT 100)
RETURNS SETOF alk.stream_event
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM alk._check_name('stream', read_since.stream);
    PERFORM alk._check_not_null('after_offset', after_offset);
    -- An extent: n <= 0 (or NULL) reads nothing, never "all rows".
    IF n IS NULL OR n <= 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT e.stream, e.event_offset, e.key, e.payload, e.created_at
      FROM alk.stream_events e
     WHERE e.stream = read_since.stream AND e.event_offset > after_offset
     ORDER BY e.event_offset
     LIMIT n;
END
$$;
COMMENT ON FUNCTION alk.read_since(text, bigint, bigint) IS
'Up to n events of a stream with offset > after_offset, ascending. n <= 0 reads nothing. after_offset may be any '
'bigint (negative reads from the start). Example: SELECT * FROM alk.read_since(''orders'', 41, 100);';

-- consumers ---------------------------------------------------------------

CREATE FUNCTION alk.get_offset(stream text, consumer text)
RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    saved bigint;
BEGIN
    PERFORM alk._check_name('stream', get_offset.stream);
    PERFORM alk._check_name('consumer', get_offset.consumer);
    SELECT c.at_offset INTO saved FROM alk.stream_consumers c
     WHERE c.stream = get_offset.stream AND c.consumer = get_offset.consumer;
    RETURN coalesce(saved, 0);
END
$$;
COMMENT ON FUNCTION alk.get_offset(text, text) IS
'The saved checkpoint of a consumer on a stream, 0 when none was saved. '
'Example: SELECT alk.get_offset(''orders'', ''billing'');';

CREATE FUNCTION alk.read_from_consumer(stream text, consumer text, n bigint DEFAULT 100)
RETURNS SETOF alk.stream_event
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT * FROM alk.read_since($1, alk.get_offset($1, $2), $3)
$$;
COMMENT ON FUNCTION alk.read_from_consumer(text, text, bigint) IS
'alk.read_since from the consumer''s saved checkpoint (0 when none): the next n events it has not saved past. '
'Example: SELECT * FROM alk.read_from_consumer(''orders'', ''billing'', 100);';

CREATE FUNCTION alk.save_offset(stream text, consumer text, at_offset bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock bigint := alk.now();
BEGIN
    PERFORM alk._check_name('stream', save_offset.stream);
    PERFORM alk._check_name('consumer', save_offset.consumer);
    PERFORM alk._check_not_null('at_offset', at_offset);
    -- Monotone: the first save stores any value (negatives included); later
    -- saves only move the checkpoint up. Under READ COMMITTED a concurrent
    -- save waits for the row and re-checks the condition against the
    -- committed value, so interleaved saves can never move it down.
    INSERT INTO alk.stream_consumers AS c (stream, consumer, at_offset, updated_at)
    VALUES (save_offset.stream, save_offset.consumer, at_offset, clock)
    ON CONFLICT ON CONSTRAINT stream_consumers_pkey
        DO UPDATE SET at_offset = excluded.at_offset, updated_at = excluded.updated_at
        WHERE c.at_offset < excluded.at_offset;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION alk.save_offset(text, text, bigint) IS
'Save a consumer''s checkpoint on a stream; true when it advanced. Monotone: a save at or below the stored checkpoint '
'is a silent no-op returning false; the first save stores any value, negatives included. '
'Example: SELECT alk.save_offset(''orders'', ''billing'', 42);';

-- retention ---------------------------------------------------------------

CREATE FUNCTION alk.trim_to(stream text, horizon bigint)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    trimmed bigint;
BEGIN
    PERFORM alk._check_name('stream', trim_to.stream);
    PERFORM alk._check_not_null('horizon', horizon);
    DELETE FROM alk.stream_events e WHERE e.stream = trim_to.stream AND e.event_offset <= horizon;
    GET DIAGNOSTICS trimmed = ROW_COUNT;
    RETURN trimmed;
END
$$;
COMMENT ON FUNCTION alk.trim_to(text, bigint) IS
'Delete a stream''s events at offsets <= horizon; returns how many went. Any bigint is accepted (a negative horizon '
'deletes nothing). Offsets are never reused: the next publish continues after the highest offset ever handed out. '
'Example: SELECT alk.trim_to(''orders'', 1000);';

-- browse_events -------------------------------------------------------------

CREATE TYPE alk.event_brief AS (
    stream text,
    event_offset bigint,
    key text,
    payload_preview text,
    payload_bytes bigint,
    created_at bigint
);
COMMENT ON TYPE alk.event_brief IS
'A stream event as a listing shows it: the payload cut to payload_preview (its JSON text), payload_bytes its full size.';

CREATE FUNCTION alk.browse_events(stream text, before_offset bigint DEFAULT NULL, n bigint DEFAULT 50,
                                  preview_chars bigint DEFAULT 200)
RETURNS SETOF alk.event_brief
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
BEGIN
    PERFORM alk._check_name('stream', browse_events.stream);
    IF preview_chars IS NULL OR preview_chars < 0 OR preview_chars > 1000000 THEN
        PERFORM alk._raise('LK002', 'preview_chars must be 0 to 1000000, got ' || coalesce(preview_chars::text, 'NULL'));
    END IF;
    IF n IS NULL OR n <= 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT e.stream, e.event_offset, e.key, pg_catalog.left(e.payload::text, preview_chars::integer),
           pg_catalog.octet_length(e.payload::text)::bigint, e.created_at
      FROM alk.stream_events e
     WHERE e.stream = browse_events.stream
       AND e.event_offset < coalesce(before_offset, 9223372036854775807)
     ORDER BY e.event_offset DESC
     LIMIT n;
END
$$;
COMMENT ON FUNCTION alk.browse_events(text, bigint, bigint, bigint) IS
'Up to n events of a stream, newest first, with offsets below before_offset (NULL: from the head): keyset paging '
'backwards. Payloads come cut to preview_chars characters with payload_bytes the full size (alk.read_since has the '
'whole event). Example: SELECT event_offset, key, payload_preview FROM alk.browse_events(''orders'', n => 10);';

-- streams and consumers -----------------------------------------------------

CREATE TYPE alk.stream_stat AS (
    stream text,
    head_offset bigint,
    first_offset bigint,
    consumers bigint,
    max_lag bigint,
    created_at bigint
);
COMMENT ON TYPE alk.stream_stat IS 'One stream''s row of alk.stream_stats.';

CREATE FUNCTION alk.stream_stats(stream text DEFAULT NULL)
RETURNS SETOF alk.stream_stat
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    only_stream text := stream_stats.stream;
BEGIN
    IF only_stream IS NOT NULL THEN
        PERFORM alk._check_name('stream', only_stream);
    END IF;
    -- One row per head (alk.streams), one primary-key probe for the first
    -- retained event, and the stream's checkpoints: nothing scans events.
    RETURN QUERY
    SELECT s.stream, s.last_offset,
           (SELECT e.event_offset FROM alk.stream_events e WHERE e.stream = s.stream
             ORDER BY e.event_offset LIMIT 1),
           c.consumers, c.max_lag, s.created_at
      FROM alk.streams s
     CROSS JOIN LATERAL (
        SELECT count(*) AS consumers, max(greatest(s.last_offset - sc.at_offset, 0)) AS max_lag
          FROM alk.stream_consumers sc WHERE sc.stream = s.stream) c
     WHERE only_stream IS NULL OR s.stream = only_stream
     ORDER BY s.stream;
END
$$;
COMMENT ON FUNCTION alk.stream_stats(text) IS
'One row per stream that was ever published to (or only the given one): head_offset (the last offset handed out), '
'first_offset (the oldest event still kept; NULL when trimmed empty), consumers (saved checkpoints) and max_lag '
'(the largest head_offset - checkpoint among them, NULL without consumers). Example: SELECT * FROM alk.stream_stats();';

CREATE TYPE alk.consumer_lag AS (
    stream text,
    consumer text,
    at_offset bigint,
    head_offset bigint,
    lag bigint,
    updated_at bigint
);
COMMENT ON TYPE alk.consumer_lag IS 'One consumer''s row of alk.stream_consumer_lag.';

CREATE FUNCTION alk.stream_consumer_lag(stream text DEFAULT NULL)
RETURNS SETOF alk.consumer_lag
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    only_stream text := stream_consumer_lag.stream;
BEGIN
    IF only_stream IS NOT NULL THEN
        PERFORM alk._check_name('stream', only_stream);
    END IF;
    RETURN QUERY
    SELECT sc.stream, sc.consumer, sc.at_offset, coalesce(s.last_offset, 0),
           greatest(coalesce(s.last_offset, 0) - sc.at_offset, 0), sc.updated_at
      FROM alk.stream_consumers sc
      LEFT JOIN alk.streams s ON s.stream = sc.stream
     WHERE only_stream IS NULL OR sc.stream = only_stream
     ORDER BY sc.stream, sc.consumer;
END
$$;
COMMENT ON FUNCTION alk.stream_consumer_lag(text) IS
'Every saved consumer checkpoint (of one stream, or all): at_offset, the stream''s head_offset (0 before the first '
'publish) and lag = head_offset - at_offset (never below 0: events the consumer has not read yet, trimmed ones '
'included). Example: SELECT consumer, lag FROM alk.stream_consumer_lag(''orders'') WHERE lag > 1000;';

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
