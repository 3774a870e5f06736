-- pyalk: publish 100 events in one call (alk.publish_batch): one turn on the
-- stream's head row, consecutive offsets. Floor twin: floor_publish_100.sql.
SELECT * FROM alk.publish_batch('bench', array_fill('{"to": "user@example.com", "n": 1}'::jsonb, ARRAY[100]));
