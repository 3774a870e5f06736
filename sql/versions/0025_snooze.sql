-- pyalk 0025: snooze. alk.snooze gives a claimed job back to pending at now + delay without spending its
-- attempt (refunded as alk.release_jobs does) and fences its token for good; granted to the worker kind
-- (alk._role_functions, then alk._regrant() so roles granted earlier get it). alk.queue_channel's comment
-- names snooze among what wakes an idle worker.

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
        -- producer: write work and events, and look at what it wrote
        ('producer', 'enqueue'), ('producer', 'enqueue_batch'), ('producer', 'outbox_enqueue'),
        ('producer', 'outbox_enqueue_batch'), ('producer', 'publish'), ('producer', 'publish_batch'),
        ('producer', 'get_job'), ('producer', 'outbox_get_job'),
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

-- alk.queue_channel(text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.queue_channel(queue text)
RETURNS text
LANGUAGE sql IMMUTABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    -- Reserved names are accepted: an outbox relay may listen to its backing
    -- queue alk:outbox:<name>; a channel name reveals nothing.
    SELECT alk._queue_channel(alk._check_name('queue', $1, true))
$$;
COMMENT ON FUNCTION alk.queue_channel(text) IS
'The LISTEN channel of a queue: ''alk_q_'' and the first 32 hex digits of sha256(queue as UTF-8), a 38-byte '
'identifier whatever the name. A worker that waits idle (alk.wait_for_jobs) is notified there at the commit of '
'the first enqueue, release, snooze or requeue of the queue that commits after the advert (it consumes the '
'advert: one notification per idle period; advertise again before waiting again), and by alk.resume_queue; with '
'an empty payload: on wake-up, claim. Example: SELECT alk.queue_channel(''emails''); then LISTEN "<that channel>";';

-- alk.snooze(bigint,text,bigint,bigint,text): changed or new in the current files
CREATE OR REPLACE FUNCTION alk.snooze(job_id bigint, worker_id text, attempt bigint, delay bigint, queue text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    clock bigint := alk.now();
    wid text := alk._name_ok('worker_id', snooze.worker_id, true);
    snoozed text;
BEGIN
    UPDATE alk.jobs j
       SET state = 'pending', worker_id = NULL, claimed_at = NULL, claim_expires_at = NULL,
           run_at = alk._sat_add(clock, coalesce(snooze.delay, 0)),
           attempts_refunded = j.attempts_refunded + 1
     WHERE j.id = snooze.job_id AND (snooze.queue IS NULL OR j.queue = snooze.queue)
       AND alk._holds(j, wid, snooze.attempt, clock)
    RETURNING j.queue INTO snoozed;
    IF snoozed IS NULL THEN
        RETURN false;
    END IF;
    PERFORM alk._wake(snoozed);
    RETURN true;
END
$$;
COMMENT ON FUNCTION alk.snooze(bigint, text, bigint, bigint, text) IS
'Give a claimed job back for later without spending its attempt: pending, no worker, ready at now + delay seconds '
'(saturating; any bigint, a negative one is due at once; NULL is 0), attempts_refunded + 1. The validity predicate of '
'alk.ack applies (attempt NULL skips the token check); the token stays invalid for good (the next claim issues '
'attempts + 1). False, and nothing changes, when the claim is no longer valid. '
'Example: SELECT alk.snooze(job_id => 42, worker_id => ''worker-1'', attempt => 1, delay => 60);';

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;

-- Roles granted a kind before this version get alk.snooze too.
SELECT alk._regrant();
