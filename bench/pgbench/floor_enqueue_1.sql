-- Floor: one bare INSERT into alk_floor.jobs per transaction (bench/floor.sql).
INSERT INTO alk_floor.jobs (queue, payload, run_at)
VALUES ('bench', '{"to": "user@example.com", "n": 1}'::jsonb, extract(epoch FROM clock_timestamp())::bigint)
RETURNING id;
