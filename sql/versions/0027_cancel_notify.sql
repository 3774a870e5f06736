-- pyalk 0027: cancel_notify (issue 26, point 5). alk.cancel of a processing job now also sends
-- 'cancel <job_id>' on its holder's control channel (alk._worker_channel, the verb sql/workers.sql reserved
-- for it), at commit, so the worker stops the handler instead of running it to a refused outcome. Nothing
-- else changes: the row is deleted as before, a pending job notifies nobody, signatures stay.

-- alk.cancel(text,bigint): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.cancel(queue text, job_id bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    was text;
    holder text;
BEGIN
    PERFORM alk._check_name('queue', cancel.queue);
    DELETE FROM alk.jobs j WHERE j.queue = cancel.queue AND j.id = job_id AND j.state IN ('pending', 'processing')
    RETURNING j.state, j.worker_id INTO was, holder;
    IF was IS NULL THEN
        RETURN false;
    END IF;
    -- A processing job's holder learns at commit on its control channel
    -- (sql/workers.sql), so its handler stops instead of running to a refused
    -- outcome. Sent whatever the lease: a lapsed holder may still be running it.
    IF was = 'processing' AND holder IS NOT NULL THEN
        PERFORM pg_catalog.pg_notify(alk._worker_channel(holder), 'cancel ' || job_id);
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION alk.cancel(text, bigint) IS
'Delete a pending or processing job whatever its lease; true if a row went. Dead and completed jobs stay for '
'inspection (false). A processing job''s holder is told at commit: ''cancel <job_id>'' on its control channel '
'(alk.worker_register), so its handler is cancelled; its later ack, nack or settle is refused as for any lost job. '
'Example: SELECT alk.cancel(''emails'', 42);';

-- alk.worker_register(text,text,text,bigint,bigint,text): its comment only (the body is unchanged)
COMMENT ON FUNCTION alk.worker_register(text, text, text, bigint, bigint, text) IS
'Register a running worker: one row in the registry that alk.workers() lists, replacing the row of the same '
'worker_id (a restart: started_at and last_seen_at now, running 0, stopping false). Returns the worker''s control '
'channel: LISTEN on it for ''stop'' (alk.request_stop) and ''cancel <job_id>'' (alk.cancel of a job it holds); ignore '
'other payloads. '
'worker_id follows the worker-id rule and queue the name rule, reserved names allowed (LK001); concurrency must be '
'at least 1, pid NULL or at least 0, host and version NULL or at most 1024 bytes (LK002); nothing is written on an '
'error. Also deletes the rows of workers silent for longer than an hour. '
'Example: LISTEN on the result of SELECT alk.worker_register(''w-1'', ''emails'', ''web-3'', 4242, 8, ''node-alk 1.2'');';

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
