-- pyalk 0013: alk.queue_throughput at the bigint edges. A since of -2^63 (or a
-- bucket width near 2^63) overflowed its bucket arithmetic with 22003; it now
-- saturates like every other stamp (found by tests/sql/test_hostile.py).

-- alk.queue_throughput(text,bigint,bigint): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.queue_throughput(queue text DEFAULT NULL, since bigint DEFAULT NULL, bucket_s bigint DEFAULT 60)
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
'Counted by the settle functions, once per call; counters are kept a day. '
'Example: SELECT bucket_at, acked FROM alk.queue_throughput(''emails'', bucket_s => 300);';

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
