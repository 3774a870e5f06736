-- pyalk: publish 100 events in one transaction (one statement calling alk.publish 100 times).
-- Floor twin: floor_publish_100.sql.
SELECT alk.publish('bench', p) FROM unnest(array_fill('{"to": "user@example.com", "n": 1}'::jsonb, ARRAY[100])) AS p;
