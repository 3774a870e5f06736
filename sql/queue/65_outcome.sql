-- pyalk queue, job outcomes a producer can wait for (docs/queue.md#waiting-for-a-result):
-- on a queue that keeps completed jobs (alk.set_queue_retention), a job that
-- becomes completed or dead, or is cancelled, is announced on the queue's
-- outcome channel at commit, with the payload '<job_id> <state>'. A waiter
-- LISTENs there, then reads the job (alk.get_job) once it listens: a job
-- already settled is read, a later one notified. Queues without retention
-- notify nothing (their acks delete, no waiter can read an outcome), so
-- their hot path is unchanged.
--
-- After settle and control: the trigger fires on the state changes those
-- statements (and the claim's and the sweep's burials) make; alk.cancel
-- sends its own notice (a delete, which the trigger does not see). Landed in
-- 0030_job_outcome.sql.

CREATE FUNCTION alk._outcome_channel(queue text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT alk._channel('alk_o_', $1)
$$;
COMMENT ON FUNCTION alk._outcome_channel(text) IS 'internal: the outcome channel of a queue (no name check)';

CREATE FUNCTION alk.outcome_channel(queue text)
RETURNS text
LANGUAGE sql IMMUTABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT alk._outcome_channel(alk._check_name('queue', $1, true))
$$;
COMMENT ON FUNCTION alk.outcome_channel(text) IS
'The LISTEN channel where a queue that keeps completed jobs (alk.set_queue_retention) announces job outcomes: '
'''alk_o_'' and the first 32 hex digits of sha256(queue as UTF-8). At the commit that settles a job for good, the '
'payload ''<job_id> completed'' (acked; alk.get_job has its result), ''<job_id> dead'' (failed, out of attempts or '
'expired; alk.get_job has last_error) or ''<job_id> cancelled'' (alk.cancel; the row is gone). Queues without '
'retention announce nothing. To wait for job 42: LISTEN on the channel, then read alk.get_job(queue, 42) (it may '
'have settled before the LISTEN), then wait for a payload starting ''42 ''. '
'Example: SELECT alk.outcome_channel(''emails''); then LISTEN "<that channel>";';

-- One trigger rather than a notice in every statement that buries or
-- completes (claim, settle, sweep, alk._complete). It fires only on UPDATEs
-- that set died_at or completed_at, as every burial and completion does;
-- the claim's UPDATE sets neither, so it pays nothing (with "OF state" the
-- claim paid a WHEN per row: claim(1)+ack 1.077x server side, measured), an
-- ack (a delete) nothing either. Only a row that became completed or dead
-- calls the function, which probes alk.queue_settings by primary key.
CREATE FUNCTION alk._notify_outcome()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF EXISTS (SELECT FROM alk.queue_settings s WHERE s.queue = NEW.queue) THEN
        PERFORM pg_catalog.pg_notify(alk._outcome_channel(NEW.queue), NEW.id || ' ' || NEW.state);
    END IF;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION alk._notify_outcome() IS
'internal: trigger: announce a job that became completed or dead on its queue''s outcome channel, when the queue '
'keeps completed jobs';

CREATE TRIGGER jobs_outcome AFTER UPDATE OF died_at, completed_at ON alk.jobs
    FOR EACH ROW WHEN (NEW.state IN ('completed', 'dead') AND OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION alk._notify_outcome();
COMMENT ON TRIGGER jobs_outcome ON alk.jobs IS
'Announces completed and dead jobs of queues that keep completed jobs on alk.outcome_channel (alk._notify_outcome).';
