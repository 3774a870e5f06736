-- pyalk 0036: ordered_scans_merge (issue 25). Since 0031 the claim's ordered scans read two slots and merge
-- their indexes; with statistics that count few pending jobs (taken while a slot was empty, drained or full of
-- processing rows: a queue's usual state) the planner sorted the whole Append instead, 78 ms against 0.3 ms a
-- claim at 10^5 pending, 238x (150x at 0034). On PostgreSQL 18 and later the functions with such scans run with
-- sorts off; before 18 a disabled path only costs 10^10 more, within the planner's 1% fuzz of every other such
-- path (claim + ack took 3 s on 15), so there nothing changes. The rule lives in sql/queue/40_claim.sql.

DO $$
BEGIN
    IF pg_catalog.current_setting('server_version_num')::int >= 180000 THEN
        ALTER FUNCTION alk._claim(text, text, bigint) SET enable_sort = off;
        ALTER FUNCTION alk.next_claim_at(text) SET enable_sort = off;
        ALTER FUNCTION alk._due_pending(text, bigint) SET enable_sort = off;
        ALTER FUNCTION alk._group_turn_ids(text, text, bigint) SET enable_sort = off;
    END IF;
END
$$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
