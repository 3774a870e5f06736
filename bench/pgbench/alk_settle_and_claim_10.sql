-- pyalk: a prefetching worker's loop, one call and one transaction per
-- batch: ack the 10 jobs the previous call claimed and claim the next 10
-- (alk.settle_and_claim). The first call settles nothing (-D job_ids={}
-- -D attempts={}). Needs a pre-filled backlog in queue 'bench' of at least
-- clients x transactions x 10 jobs. Floor twin: floor_settle_and_claim_10.sql.
SELECT coalesce(array_agg(id) FILTER (WHERE kind = 'claimed'), '{}') AS job_ids,
       coalesce(array_agg(attempts) FILTER (WHERE kind = 'claimed'), '{}') AS attempts
  FROM alk.settle_and_claim('bench', 'w' || :client_id, 10, :job_ids, :attempts) \gset
