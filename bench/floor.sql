-- The floor: the least a Postgres job queue can do for the same rows.
--
-- A plain table with the columns a claim must read or write, its primary key
-- and one partial index in claim order; no functions, no checks, no lease
-- stamps beyond the one the claim sets. bench/pgbench/floor_*.sql run bare
-- SQL against it (single INSERT; UPDATE ... WHERE id IN (SELECT ... FOR UPDATE
-- SKIP LOCKED LIMIT n) then DELETE). alk.* can only be slower than this; the
-- ratio ours/floor is what the SQL rows report.
CREATE SCHEMA IF NOT EXISTS alk_floor;

CREATE TABLE alk_floor.jobs (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue text NOT NULL,
    state text NOT NULL DEFAULT 'pending',
    payload jsonb NOT NULL,
    priority integer NOT NULL DEFAULT 0,
    run_at bigint NOT NULL,
    attempts integer NOT NULL DEFAULT 0,
    worker_id text,
    claim_expires_at bigint
);

CREATE INDEX jobs_claim ON alk_floor.jobs (queue, priority DESC, run_at, id) WHERE state = 'pending';

-- Same autovacuum settings as alk.jobs, so bloat handling is not what differs.
ALTER TABLE alk_floor.jobs SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 500,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02
);

-- Streams floor: an append-only table, offsets from an identity (which, unlike
-- alk's offsets, are not commit ordered under concurrent publishers).
CREATE TABLE alk_floor.events (
    stream text NOT NULL,
    event_offset bigint GENERATED ALWAYS AS IDENTITY,
    key text,
    payload jsonb NOT NULL,
    created_at bigint NOT NULL DEFAULT extract(epoch FROM clock_timestamp())::bigint,
    PRIMARY KEY (stream, event_offset)
);
