-- pyalk: publish one event per transaction (alk.publish). Floor twin: floor_publish_1.sql.
SELECT alk.publish('bench', '{"to": "user@example.com", "n": 1}'::jsonb);
