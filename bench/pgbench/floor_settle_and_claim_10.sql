-- Floor: one statement per batch: DELETE the 10 jobs the previous run
-- claimed, and claim the next 10 (UPDATE ... WHERE id IN (SELECT ... FOR
-- UPDATE SKIP LOCKED LIMIT 10)). The first run deletes nothing (-D job_ids={}).
WITH done AS (
    DELETE FROM alk_floor.jobs WHERE id = ANY (:job_ids::bigint[])
), claimed AS (
    UPDATE alk_floor.jobs
       SET state = 'processing', worker_id = 'w' || :client_id, attempts = attempts + 1,
           claim_expires_at = extract(epoch FROM clock_timestamp())::bigint + 300
     WHERE id IN (SELECT id FROM alk_floor.jobs
                   WHERE queue = 'bench' AND state = 'pending'
                   ORDER BY priority DESC, run_at, id
                   LIMIT 10 FOR UPDATE SKIP LOCKED)
    RETURNING id, attempts, payload
)
SELECT coalesce(array_agg(id), '{}') AS job_ids, coalesce(array_agg(attempts), '{}') AS attempts, count(payload) AS n
  FROM claimed \gset
