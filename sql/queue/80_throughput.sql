-- pyalk queue, throughput (docs/contract.md#queue): the per-minute settle
-- counters (alk.queue_counts, pruned by its insert trigger) and
-- alk.queue_throughput, which reads them.
--
-- Last: the settle functions (50_settle.sql) write the counters at run time,
-- and this file ends the queue with the REVOKE every current file ends with.
-- Landed in 0011_observe.sql; changed by 0013 and 0015; 0023 moved the
-- retention into the trigger.

-- throughput ----------------------------------------------------------------

-- Settled jobs per queue and minute, one row per (queue, minute, backend),
-- written by alk._settle (every ack, ack_batch, settle, retry, fail and
-- settle_and_claim) in the settling statement itself. The backend's pid is
-- unique among live sessions, so two workers never update the same row: a
-- settle holds its row's lock until its commit, and with one row per backend
-- nobody waits for another's WAL flush. A backend touches its row once per
-- settle call and queue (once per batch, never per job), and the rows per
-- hour are bounded by queues x 60 x connections that settled. A queue's rows
-- past a day go when any backend opens a new minute of that queue.
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

-- Retention, once for every settle statement: a new row is a minute opened
-- for a queue (once a minute per backend and queue; an upsert that only adds
-- to its row fires nothing). It drops that queue's rows past a day, gone
-- backends' too, at most 1000 a time in queue_counts_pkey order, skipping
-- rows another backend's prune has locked (nobody waits).
CREATE FUNCTION alk._prune_counts()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM alk.queue_counts c
     WHERE c.ctid = ANY (ARRAY(
         SELECT o.ctid FROM alk.queue_counts o
          WHERE o.queue = NEW.queue AND o.minute < alk._sat_sub(NEW.minute, 86400)
          ORDER BY o.minute LIMIT 1000
            FOR UPDATE SKIP LOCKED));
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION alk._prune_counts() IS
'internal: alk.queue_counts'' insert trigger: drop the queue''s counter rows past a day (at most 1000, skip locked)';
CREATE TRIGGER queue_counts_prune AFTER INSERT ON alk.queue_counts FOR EACH ROW EXECUTE FUNCTION alk._prune_counts();

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
    -- Saturating: since may be any bigint (a boundary argument), width too.
    first_bucket := alk._sat_sub(first_bucket, CASE WHEN first_bucket % width < 0 THEN first_bucket % width + width
                                                    ELSE first_bucket % width END);
    IF (clock::numeric - first_bucket) / width > 10080 THEN
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
        ON c.queue = n.queue AND c.minute >= b.bucket_at AND c.minute < alk._sat_add(b.bucket_at, width)
     GROUP BY n.queue, b.bucket_at
     ORDER BY n.queue, b.bucket_at;
END
$$;
COMMENT ON FUNCTION alk.queue_throughput(text, bigint, bigint) IS
'Jobs settled per time bucket (acked, retried, dead) of one queue or of every queue with a count in the window, '
'from since (default: an hour ago) to now in buckets of bucket_s seconds (a multiple of 60), zeros included. '
'Counted by the settle functions (ack, ack_batch, settle, retry, fail, settle_and_claim), once per call: acked, '
'retried (pending again) and dead (failed, or retried with its attempts spent). Jobs a claim buries (out of attempts '
'after lapsed leases, or expired) and sweeps are not settlements and are not counted: alk.queue_stats shows the '
'dead. Counters are kept a day. '
'Example: SELECT bucket_at, acked FROM alk.queue_throughput(''emails'', bucket_s => 300);';

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
