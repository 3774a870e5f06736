-- pyalk 0023: counts_prune_trigger. The retention of alk.queue_counts lives once, in an insert trigger (alk._prune_counts) that prunes when a settle opens a minute, instead of a pruning CTE in each settle statement; alk.ack counts without it. (0019 landed with the CTEs; 0020 and 0022 already install _settle and ack_batch without them, so between 0020 and this version, within one upgrade, nothing prunes.)

-- alk._prune_counts(): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._prune_counts()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM alk.queue_counts c
     WHERE c.ctid = ANY (ARRAY(
         SELECT o.ctid FROM alk.queue_counts o
          WHERE o.queue = NEW.queue AND o.minute < alk._sat_sub(NEW.minute, 86400)
          ORDER BY o.minute LIMIT 1000
            FOR UPDATE SKIP LOCKED));
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION alk._prune_counts() IS
'internal: alk.queue_counts'' insert trigger: drop the queue''s counter rows past a day (at most 1000, skip locked)';

-- alk.ack(bigint,text,bigint,text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.ack(job_id bigint, worker_id text, attempt bigint DEFAULT NULL, queue text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    clock bigint := alk.now();
    wid text := alk._name_ok('worker_id', ack.worker_id, true);
    this_minute bigint := clock / 60 * 60;
    done boolean;
BEGIN
    WITH acked AS (
        DELETE FROM alk.jobs j
         WHERE j.id = ack.job_id AND (ack.queue IS NULL OR j.queue = ack.queue)
           AND alk._holds(j, wid, ack.attempt, clock)
        RETURNING j.queue
    ), counted AS (
        INSERT INTO alk.queue_counts AS c (queue, minute, backend, acked)
        SELECT a.queue, this_minute, pg_catalog.pg_backend_pid(), 1 FROM acked a
        ON CONFLICT ON CONSTRAINT queue_counts_pkey DO UPDATE SET acked = c.acked + excluded.acked
        RETURNING c.queue
    )
    SELECT true INTO done FROM counted;
    RETURN done IS NOT NULL;
END
$$;
COMMENT ON FUNCTION alk.ack(bigint, text, bigint, text) IS
'Acknowledge a claimed job: it is deleted. False, and nothing changes, unless the job is processing, held by worker_id '
'under claim attempt (the fencing token the claim returned; NULL skips that check) and its lease has not lapsed '
'(claim_expires_at >= now). worker_id follows the name rule (LK001). queue is optional routing for sharded deployments. '
'Example: SELECT alk.ack(job_id => 42, worker_id => ''worker-1'', attempt => 1);';

-- hand-written: the trigger (after its function, above).
CREATE TRIGGER queue_counts_prune AFTER INSERT ON alk.queue_counts FOR EACH ROW EXECUTE FUNCTION alk._prune_counts();

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
