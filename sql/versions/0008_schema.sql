-- pyalk 0008: the schema says which version it is, so a client can check at
-- connect that it can run on it (docs/migrations.md, "Compatibility").
--
-- alk.schema_info() returns the installed version and the newest version
-- that broke older clients. A version file that changes a function's
-- signature or result in a way an older pyalk would misread replaces this
-- function with its own number as breaking_since; every other version leaves
-- it alone. A client that knows versions up to K runs on a schema whose
-- breaking_since <= K, and asks for `pyalk migrate` when the schema is older
-- than the version it needs.

CREATE FUNCTION alk.schema_info(OUT version text, OUT breaking_since text)
RETURNS record
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT (SELECT max(v.version_num)::text FROM alk.alembic_version v), '0008'::text
$$;
COMMENT ON FUNCTION alk.schema_info() IS
'The installed schema version and breaking_since, the newest version that older clients cannot run on. '
'A client that knows versions up to K may run when breaking_since <= K; it needs pyalk migrate when version is '
'older than what it uses. Example: SELECT * FROM alk.schema_info();';

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
