-- Floor: one INSERT ... SELECT of 100 events per transaction.
INSERT INTO alk_floor.events (stream, payload)
SELECT 'bench', p FROM unnest(array_fill('{"to": "user@example.com", "n": 1}'::jsonb, ARRAY[100])) AS p
RETURNING event_offset;
