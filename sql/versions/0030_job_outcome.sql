-- pyalk 0030: job_outcome (issue 27, point 4: a producer waits for a job's outcome without polling). On a queue that
-- keeps completed jobs, a job that becomes completed or dead is announced at commit on the queue's outcome channel
-- (alk.outcome_channel) with the payload '<job_id> <state>', by one trigger on alk.jobs (jobs_outcome, on UPDATEs
-- that set died_at or completed_at: never the claim's); alk.cancel announces '<job_id> cancelled' there. Queues
-- without retention announce nothing: an ordinary queue's ack (a delete) costs nothing more. Producers and readers
-- get alk.outcome_channel, producers alk.queue_retention (re-granted by alk._regrant()). Signatures stay.

-- alk._notify_outcome(): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._notify_outcome()
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

-- alk._outcome_channel(text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._outcome_channel(queue text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT alk._channel('alk_o_', $1)
$$;
COMMENT ON FUNCTION alk._outcome_channel(text) IS 'internal: the outcome channel of a queue (no name check)';

-- alk._role_functions(): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._role_functions()
RETURNS TABLE (kind text, function_name text)
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT l.kind, l.function_name FROM (VALUES
        -- every kind: the clock and the schema check a client runs at connect
        ('base', 'now'), ('base', 'pinned_clock'), ('base', 'schema_info'),
        -- reader: inspection only (pyalk status, pyalk jobs, dashboards)
        ('reader', 'get_job'), ('reader', 'list_jobs'), ('reader', 'queue_stats'), ('reader', 'next_claim_at'),
        ('reader', 'outbox_get_job'), ('reader', 'read_since'), ('reader', 'get_offset'),
        ('reader', 'stream_channel'), ('reader', 'get_lock'), ('reader', 'get_schedule'),
        ('reader', 'list_schedules'), ('reader', 'cron_next'),
        -- the dashboard's and exporter's reads (0011)
        ('reader', 'browse_jobs'), ('reader', 'browse_events'), ('reader', 'stream_stats'),
        ('reader', 'stream_consumer_lag'), ('reader', 'queue_throughput'), ('reader', 'schedule_overview'),
        ('reader', 'list_locks'),
        -- the registry of running workers (0024)
        ('reader', 'workers'),
        -- a queue's completed-job retention (0026), where its outcomes are announced (0030)
        ('reader', 'queue_retention'), ('reader', 'outcome_channel'),
        -- a queue's claim limits (0029)
        ('reader', 'queue_limits'),
        -- producer: write work and events, and look at what it wrote
        ('producer', 'enqueue'), ('producer', 'enqueue_batch'), ('producer', 'outbox_enqueue'),
        ('producer', 'outbox_enqueue_batch'), ('producer', 'publish'), ('producer', 'publish_batch'),
        ('producer', 'get_job'), ('producer', 'outbox_get_job'),
        -- wait for a job's outcome: the queue keeps it, and where it is announced (0030)
        ('producer', 'queue_retention'), ('producer', 'outcome_channel'),
        -- worker: claim and settle jobs (pyalk worker, outbox delivery),
        -- consume streams with checkpoints, hold its own locks
        ('worker', 'claim'), ('worker', 'ack'), ('worker', 'ack_batch'), ('worker', 'retry'), ('worker', 'fail'),
        ('worker', 'heartbeat'), ('worker', 'release_jobs'), ('worker', 'settle_and_claim'), ('worker', 'settle'),
        ('worker', 'snooze'),
        -- idle workers advertise themselves so enqueues wake them (docs/design.md)
        ('worker', 'wait_for_jobs'), ('worker', 'wake_fence'), ('worker', 'stop_waiting'),
        ('worker', 'next_claim_at'), ('worker', 'queue_channel'), ('worker', 'get_job'),
        -- pyalk worker checks the queue name with list_jobs(queue, n => 1) before it starts
        ('worker', 'list_jobs'),
        ('worker', 'outbox_claim'), ('worker', 'outbox_get_job'),
        ('worker', 'read_since'), ('worker', 'read_from_consumer'), ('worker', 'save_offset'),
        ('worker', 'get_offset'), ('worker', 'stream_channel'),
        ('worker', 'try_lock'), ('worker', 'renew_lock'), ('worker', 'release_lock'), ('worker', 'get_lock'),
        -- a running worker keeps its row in the registry (0024)
        ('worker', 'worker_register'), ('worker', 'worker_beat'), ('worker', 'worker_deregister'),
        -- admin: everything above (alk._kind_functions adds it) and these
        ('admin', 'cancel'), ('admin', 'sweep_expired'), ('admin', 'outbox_sweep_expired'), ('admin', 'trim_to'),
        ('admin', 'requeue_dead'), ('admin', 'pause_queue'), ('admin', 'resume_queue'),
        ('admin', 'set_queue_retention'), ('admin', 'set_queue_limits'),
        ('admin', 'schedule'), ('admin', 'unschedule'), ('admin', 'tick'), ('admin', 'scheduler_tick'),
        -- stop a worker from anywhere (0024)
        ('admin', 'request_stop'),
        -- the scheduler's leader loop holds the reserved lock alk:scheduler
        ('admin', '_try_lock'), ('admin', '_renew_lock'), ('admin', '_release_lock'),
        ('admin', 'grant_reader'), ('admin', 'grant_producer'), ('admin', 'grant_worker'), ('admin', 'grant_admin'),
        ('admin', 'revoke_all'), ('admin', 'role_grants'), ('admin', 'role_functions'),
        ('admin', 'limit_names'), ('admin', 'name_limits')
    ) AS l(kind, function_name)
$$;
COMMENT ON FUNCTION alk._role_functions() IS
'internal: the function names each role kind gets (base goes to every kind; admin also gets every other kind''s)';

-- alk.cancel(text,bigint): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.cancel(queue text, job_id bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    was text;
    holder text;
    awaited boolean;
BEGIN
    PERFORM alk._check_name('queue', cancel.queue);
    DELETE FROM alk.jobs j WHERE j.queue = cancel.queue AND j.id = job_id AND j.state IN ('pending', 'processing')
    RETURNING j.state, j.worker_id, j.awaited INTO was, holder, awaited;
    IF was IS NULL THEN
        RETURN false;
    END IF;
    -- A cancelled job no longer exists: the jobs enqueued after it are
    -- released, as by an ack (docs/queue.md "Dependencies").
    IF awaited THEN
        PERFORM alk._after_sync(ARRAY[job_id]);
    END IF;
    -- A processing job's holder learns at commit on its control channel
    -- (sql/workers.sql), so its handler stops instead of running to a refused
    -- outcome. Sent whatever the lease: a lapsed holder may still be running it.
    IF was = 'processing' AND holder IS NOT NULL THEN
        PERFORM pg_catalog.pg_notify(alk._worker_channel(holder), 'cancel ' || job_id);
    END IF;
    -- A producer waiting for the job's outcome (65_outcome.sql) learns too.
    IF EXISTS (SELECT FROM alk.queue_settings s WHERE s.queue = cancel.queue) THEN
        PERFORM pg_catalog.pg_notify(alk._outcome_channel(cancel.queue), job_id || ' cancelled');
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION alk.cancel(text, bigint) IS
'Delete a pending or processing job whatever its lease; true if a row went. Dead and completed jobs stay for '
'inspection (false). A processing job''s holder is told at commit: ''cancel <job_id>'' on its control channel '
'(alk.worker_register), so its handler is cancelled; its later ack, nack or settle is refused as for any lost job. '
'Jobs enqueued after it (alk.enqueue''s after) no longer wait for it, as after an ack. '
'On a queue that keeps completed jobs, ''<job_id> cancelled'' goes to alk.outcome_channel as well. '
'Example: SELECT alk.cancel(''emails'', 42);';

-- alk.grant_producer(text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.grant_producer(role text)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT alk._grant_kind($1, 'producer') $$;
COMMENT ON FUNCTION alk.grant_producer(text) IS
'Let role produce: enqueue, enqueue_batch, outbox_enqueue, outbox_enqueue_batch, publish, publish_batch, get_job, '
'outbox_get_job, queue_retention and outcome_channel (to wait for a job''s outcome) and the clock. Idempotent; '
'returns how many functions it granted. '
'Example: SELECT alk.grant_producer(''web_app'');';

-- alk.outcome_channel(text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.outcome_channel(queue text)
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

-- hand-written: the trigger (after its function above).
CREATE TRIGGER jobs_outcome AFTER UPDATE OF died_at, completed_at ON alk.jobs
    FOR EACH ROW WHEN (NEW.state IN ('completed', 'dead') AND OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION alk._notify_outcome();
COMMENT ON TRIGGER jobs_outcome ON alk.jobs IS
'Announces completed and dead jobs of queues that keep completed jobs on alk.outcome_channel (alk._notify_outcome).';

-- the role kinds' lists changed: grant the new names to roles already granted a kind.
SELECT alk._regrant();

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
