-- Rotating floor: floor_enqueue_1.sql on alk_floor.rotating_jobs, the same table
-- partitioned as alk.jobs is (bench/floor.sql); lookups name the live slots as ours do.
INSERT INTO alk_floor.rotating_jobs (queue, payload, run_at)
VALUES ('bench', '{"to": "user@example.com", "n": 1}'::jsonb, extract(epoch FROM clock_timestamp())::bigint)
RETURNING id;
