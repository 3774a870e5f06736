-- Floor: one bare INSERT ... SELECT of 100 rows per transaction; the ids come back.
INSERT INTO alk_floor.jobs (queue, payload, run_at)
SELECT 'bench', p, extract(epoch FROM clock_timestamp())::bigint
  FROM unnest(array_fill('{"to": "user@example.com", "n": 1}'::jsonb, ARRAY[100])) AS p
RETURNING id;
