-- Rotating floor: floor_claim_1_delete.sql on alk_floor.rotating_jobs, the same table
-- partitioned as alk.jobs is (bench/floor.sql); lookups name the live slots as ours do.
UPDATE alk_floor.rotating_jobs
   SET state = 'processing', worker_id = 'w' || :client_id, attempts = attempts + 1,
       claim_expires_at = extract(epoch FROM clock_timestamp())::bigint + 300
 WHERE slot <> 2 AND id = (SELECT id FROM alk_floor.rotating_jobs
              WHERE slot <> 2 AND queue = 'bench' AND state = 'pending'
              ORDER BY priority DESC, run_at, id
              LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id AS job_id, attempts AS attempt, payload \gset
DELETE FROM alk_floor.rotating_jobs WHERE slot <> 2 AND id = :job_id;
