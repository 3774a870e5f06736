-- pyalk 0011: what a dashboard, an exporter or a psql user reads to see the
-- whole system at once (docs/dashboard.md). Read functions only, plus two
-- small recorders the settle and tick paths call:
--   * alk.browse_jobs(queue, state, n, after_*): a queue's jobs in claim
--     order, keyset paged, payloads cut to a preview;
--   * alk.browse_events(stream, before_offset, n): a stream's newest events;
--   * alk.stream_stats(stream) and alk.stream_consumer_lag(stream): heads,
--     checkpoints and each consumer's lag;
--   * alk.queue_throughput(queue, since, bucket_s): settled jobs per bucket,
--     from the counters alk._count_settled keeps;
--   * alk.schedule_overview(): schedules with their next and last fire, the
--     last one noted by alk._note_fire;
--   * alk.list_locks(): every lock with its holder and expiry.

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

-- throughput ----------------------------------------------------------------

-- Settled jobs per queue and minute, one row per (queue, minute, backend).
-- The backend's pid is unique among live sessions, so two workers never
-- update the same row: a settle holds its row's lock until its commit, and
-- with one row per backend nobody waits for another's WAL flush. A backend
-- touches its row once per settle call (once per batch), and the rows per
-- hour are bounded by queues x 60 x connections that settled.
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

-- The settle path's one call: add n settled jobs of an outcome to this
-- backend's counter of the current minute. Once per batch, never per job.
-- When it opens a new minute it also drops this backend's own rows past
-- retention (a day): once a minute per backend, never another backend's rows.
CREATE FUNCTION alk._count_settled(queue text, outcome text, n bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    this_minute bigint := alk.now() / 60 * 60;
    me integer := pg_catalog.pg_backend_pid();
    opened boolean;
BEGIN
    IF n IS NULL OR n <= 0 OR queue IS NULL THEN
        RETURN;
    END IF;
    INSERT INTO alk.queue_counts AS c (queue, minute, backend, acked, retried, dead)
    VALUES (queue, this_minute, me,
            CASE WHEN outcome = 'acked' THEN n ELSE 0 END,
            CASE WHEN outcome = 'retried' THEN n ELSE 0 END,
            CASE WHEN outcome = 'dead' THEN n ELSE 0 END)
    ON CONFLICT ON CONSTRAINT queue_counts_pkey DO UPDATE
       SET acked = c.acked + excluded.acked, retried = c.retried + excluded.retried, dead = c.dead + excluded.dead
    RETURNING c.xmax = 0 INTO opened;
    IF opened THEN
        DELETE FROM alk.queue_counts c
         WHERE c.queue = _count_settled.queue AND c.backend = me
           AND c.minute < alk._sat_sub(this_minute, 86400);
    END IF;
END
$$;
COMMENT ON FUNCTION alk._count_settled(text, text, bigint) IS
'internal: add n jobs settled with outcome acked, retried or dead to this backend''s counter of the current minute';

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
    first_bucket := first_bucket - ((first_bucket % width) + width) % width;
    IF (clock - first_bucket) / width > 10080 THEN
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
        ON c.queue = n.queue AND c.minute >= b.bucket_at AND c.minute < b.bucket_at + width
     GROUP BY n.queue, b.bucket_at
     ORDER BY n.queue, b.bucket_at;
END
$$;
COMMENT ON FUNCTION alk.queue_throughput(text, bigint, bigint) IS
'Jobs settled per time bucket (acked, retried, dead) of one queue or of every queue with a count in the window, '
'from since (default: an hour ago) to now in buckets of bucket_s seconds (a multiple of 60), zeros included. '
'Counted by the settle functions, once per call; counters are kept a day. '
'Example: SELECT bucket_at, acked FROM alk.queue_throughput(''emails'', bucket_s => 300);';

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

-- locks ---------------------------------------------------------------------

CREATE TYPE alk.lock_state AS (
    name text,
    owner text,
    acquired_at bigint,
    expires_at bigint,
    held boolean
);
COMMENT ON TYPE alk.lock_state IS 'One lock''s row of alk.list_locks.';

CREATE FUNCTION alk.list_locks()
RETURNS SETOF alk.lock_state
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT l.name, l.owner, l.acquired_at, l.expires_at, l.expires_at > alk.now()
      FROM alk.locks l
     ORDER BY l.name
$$;
COMMENT ON FUNCTION alk.list_locks() IS
'Every lock taken and not released, reserved ones (the scheduler''s leader lock) included, by name: held is '
'expires_at > now; an expired row is free for the next try_lock. '
'Example: SELECT name, owner, expires_at - alk.now() AS expires_in_s FROM alk.list_locks() WHERE held;';

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
