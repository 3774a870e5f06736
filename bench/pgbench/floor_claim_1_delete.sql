-- Floor: UPDATE ... WHERE id = (SELECT ... FOR UPDATE SKIP LOCKED LIMIT 1), then DELETE by id.
-- Needs a pre-filled backlog in alk_floor.jobs (queue 'bench').
UPDATE alk_floor.jobs
   SET state = 'processing', worker_id = 'w' || :client_id, attempts = attempts + 1,
       claim_expires_at = extract(epoch FROM clock_timestamp())::bigint + 300
 WHERE id = (SELECT id FROM alk_floor.jobs
              WHERE queue = 'bench' AND state = 'pending'
              ORDER BY priority DESC, run_at, id
              LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id AS job_id, attempts AS attempt, payload \gset
DELETE FROM alk_floor.jobs WHERE id = :job_id;
