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

-- The rotating floor (issue 25): the same columns, partitioned the way
-- alk.jobs is since 0031 (two rotating slots and a kept one, LIST by slot,
-- the slot in the primary key), so its ratio shows what the functions cost
-- on top of the storage, and the plain floor above what the storage costs.
-- New rows go to slot 0 (nothing rotates in a pgbench run); the scripts
-- leave slot 2 out as alk.* does (bench/pgbench/floor_rotating_*.sql).
CREATE TABLE alk_floor.rotating_jobs (
    id bigint GENERATED ALWAYS AS IDENTITY,
    queue text NOT NULL,
    state text NOT NULL DEFAULT 'pending',
    payload jsonb NOT NULL,
    priority integer NOT NULL DEFAULT 0,
    run_at bigint NOT NULL,
    attempts integer NOT NULL DEFAULT 0,
    worker_id text,
    claim_expires_at bigint,
    slot bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (id, slot)
) PARTITION BY LIST (slot);
CREATE TABLE alk_floor.rotating_jobs_0 PARTITION OF alk_floor.rotating_jobs FOR VALUES IN (0);
CREATE TABLE alk_floor.rotating_jobs_1 PARTITION OF alk_floor.rotating_jobs FOR VALUES IN (1);
CREATE TABLE alk_floor.rotating_jobs_kept PARTITION OF alk_floor.rotating_jobs FOR VALUES IN (2);

CREATE INDEX rotating_jobs_claim ON alk_floor.rotating_jobs (queue, priority DESC, run_at, id)
    WHERE state = 'pending';

ALTER TABLE alk_floor.rotating_jobs_0 SET (
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
