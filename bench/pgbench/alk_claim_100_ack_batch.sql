-- pyalk: claim 100 jobs in one call, then ack them in one call (alk.ack_batch
-- with the fencing tokens): two transactions. Needs a pre-filled backlog of at
-- least clients x transactions x 100 jobs in queue 'bench'.
-- Floor twin: floor_claim_100_delete.sql.
SELECT array_agg(id) AS job_ids, array_agg(attempts) AS attempts, count(payload) AS n
  FROM alk.claim('bench', 'w' || :client_id, 100) \gset
SELECT alk.ack_batch(:job_ids, 'w' || :client_id, :attempts);
