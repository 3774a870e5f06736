-- pyalk: claim one job, then ack it, as a worker does: two transactions
-- (the claim commits before the handler runs). Needs a pre-filled backlog in
-- queue 'bench' of at least clients x transactions jobs (pgbench -t).
-- Floor twin: floor_claim_1_delete.sql.
SELECT id AS job_id, attempts AS attempt, payload FROM alk.claim('bench', 'w' || :client_id, 1) \gset
SELECT alk.ack(:job_id, 'w' || :client_id, :attempt);
