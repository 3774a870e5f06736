-- Reference for the durable-enqueue row: the same copy of alk.enqueue that
-- always calls pg_notify (as every enqueue did before 0009), to show what the
-- notify lock costs. Twin: alk_enqueue_1.sql.
SELECT alk_floor.enqueue_notify('bench', '{"to": "user@example.com", "n": 1}'::jsonb);
