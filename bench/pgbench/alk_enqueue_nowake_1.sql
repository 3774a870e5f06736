-- The durable-enqueue row's floor: pyalk's own alk.enqueue copied into
-- alk_floor with its wake-up step removed (never NOTIFY), built by
-- bench/rows_sql.py from the installed definitions. Twin: alk_enqueue_1.sql.
SELECT alk_floor.enqueue_nowake('bench', '{"to": "user@example.com", "n": 1}'::jsonb);
