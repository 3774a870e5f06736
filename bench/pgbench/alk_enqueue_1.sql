-- pyalk: enqueue one job per transaction (alk.enqueue).
-- Floor twin: floor_enqueue_1.sql. Run: pgbench -n -M prepared -f alk_enqueue_1.sql -T 10
SELECT alk.enqueue('bench', '{"to": "user@example.com", "n": 1}'::jsonb);
