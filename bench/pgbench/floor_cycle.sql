-- Floor: INSERT one job, then claim one (UPDATE ... SKIP LOCKED LIMIT 1) and DELETE it.
INSERT INTO alk_floor.jobs (queue, payload, run_at)
VALUES ('bench', '{"to": "user@example.com", "n": 1}'::jsonb, extract(epoch FROM clock_timestamp())::bigint);
UPDATE alk_floor.jobs
   SET state = 'processing', worker_id = 'w' || :client_id, attempts = attempts + 1,
       claim_expires_at = extract(epoch FROM clock_timestamp())::bigint + 300
 WHERE id = (SELECT id FROM alk_floor.jobs
              WHERE queue = 'bench' AND state = 'pending'
              ORDER BY priority DESC, run_at, id
              LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id AS job_id, attempts AS attempt, payload \gset
DELETE FROM alk_floor.jobs WHERE id = :job_id;
