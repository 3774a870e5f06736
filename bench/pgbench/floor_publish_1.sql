-- Floor: one bare INSERT into an append-only table per transaction.
INSERT INTO alk_floor.events (stream, payload) VALUES ('bench', '{"to": "user@example.com", "n": 1}'::jsonb)
RETURNING event_offset;
