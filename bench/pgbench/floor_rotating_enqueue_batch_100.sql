-- Rotating floor: floor_enqueue_batch_100.sql on alk_floor.rotating_jobs, the same table
-- partitioned as alk.jobs is (bench/floor.sql); lookups name the live slots as ours do.
INSERT INTO alk_floor.rotating_jobs (queue, payload, run_at)
SELECT 'bench', p, extract(epoch FROM clock_timestamp())::bigint
  FROM unnest(array_fill('{"to": "user@example.com", "n": 1}'::jsonb, ARRAY[100])) AS p
RETURNING id;
