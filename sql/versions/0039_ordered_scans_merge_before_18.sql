-- pyalk 0039: ordered_scans_merge_before_18 (issue 25; 0036's limit). Before PostgreSQL 18 the claim's ordered scans
-- still sorted the whole backlog under statistics that count few pending jobs: 24.8 ms a claim 1 + ack at 50,000
-- pending on 15, against 0.5 ms with fresh statistics. The sort is cheap there because the other slot, nearly empty by
-- its statistics, is read by a sequential or bitmap scan, whose rows come unordered. Before 18 the functions with such
-- scans run with those two scans off: every table they read has an index, so no plan needs a disabled path, and the
-- slots' index scans merge (0.80 ms). 18 and later keep 0036's sorts off. The rule lives in sql/queue/40_claim.sql.

DO $$
BEGIN
    IF pg_catalog.current_setting('server_version_num')::int < 180000 THEN
        ALTER FUNCTION alk._claim(text, text, bigint) SET enable_seqscan = off;
        ALTER FUNCTION alk._claim(text, text, bigint) SET enable_bitmapscan = off;
        ALTER FUNCTION alk.next_claim_at(text) SET enable_seqscan = off;
        ALTER FUNCTION alk.next_claim_at(text) SET enable_bitmapscan = off;
        ALTER FUNCTION alk._due_pending(text, bigint) SET enable_seqscan = off;
        ALTER FUNCTION alk._due_pending(text, bigint) SET enable_bitmapscan = off;
        ALTER FUNCTION alk._group_turn_ids(text, text, bigint) SET enable_seqscan = off;
        ALTER FUNCTION alk._group_turn_ids(text, text, bigint) SET enable_bitmapscan = off;
    END IF;
END
$$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
