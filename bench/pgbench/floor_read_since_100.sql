-- Floor: an index range scan of 100 events after a random offset.
\set after random(0, :max_after)
SELECT * FROM alk_floor.events WHERE stream = 'bench' AND event_offset > :after ORDER BY event_offset LIMIT 100;
