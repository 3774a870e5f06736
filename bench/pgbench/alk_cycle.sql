-- pyalk: a steady queue. Each transaction enqueues one job, then claims one
-- and acks it (three transactions), so the depth stays at its pre-filled
-- level. Used by the held-xmin row. Floor twin: floor_cycle.sql.
SELECT alk.enqueue('bench', '{"to": "user@example.com", "n": 1}'::jsonb);
SELECT id AS job_id, attempts AS attempt, payload FROM alk.claim('bench', 'w' || :client_id, 1) \gset
SELECT alk.ack(:job_id, 'w' || :client_id, :attempt);
