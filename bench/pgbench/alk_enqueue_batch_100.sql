-- pyalk: enqueue 100 jobs per transaction in one call (alk.enqueue_batch); the ids come back.
-- Floor twin: floor_enqueue_batch_100.sql.
SELECT * FROM alk.enqueue_batch('bench', array_fill('{"to": "user@example.com", "n": 1}'::jsonb, ARRAY[100]));
