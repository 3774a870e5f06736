-- pyalk 0047: job_slots_replaced. A restore of the extension install reset alk.job_slots: the script writes its
-- one row and the row was not dump data, while the jobs came back in their slots. A live job holding a dedup key sat
-- in slot 1 while new jobs went to slot 0, so a keyed enqueue did not see it and wrote a second job with the key.
-- An insert into alk.job_slots now replaces its row, so the table can be dump data (pyalk.schema.extension marks
-- it once this trigger exists) and the restore's copy of the row replaces the script's. The rule lives in
-- sql/queue/10_table.sql.

-- alk._job_slots_replaced(): changed or new in the current files
CREATE OR REPLACE FUNCTION alk._job_slots_replaced()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM alk.job_slots;
    RETURN NEW;
END
$$;
COMMENT ON FUNCTION alk._job_slots_replaced() IS
'internal: trigger: an insert into alk.job_slots replaces its one row (a restore copying the dumped row)';

CREATE TRIGGER job_slots_replaced BEFORE INSERT ON alk.job_slots
    FOR EACH ROW EXECUTE FUNCTION alk._job_slots_replaced();
COMMENT ON TRIGGER job_slots_replaced ON alk.job_slots IS
'A restore''s copy of the dumped row replaces the row CREATE EXTENSION wrote (alk._job_slots_replaced).';

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
