-- pyalk: read 100 events after a random offset (alk.read_since). Needs a
-- pre-filled stream 'bench' and -D max_after=<events - 100>.
-- Floor twin: floor_read_since_100.sql.
\set after random(0, :max_after)
SELECT * FROM alk.read_since('bench', :after, 100);
