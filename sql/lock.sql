-- pyalk lock: lease locks (docs/contract.md#locks).
--
-- current definition; edit here, then add a version file (docs/migrations.md).
-- Landed as 0005_lock.sql; a fresh install runs this file, an upgrade runs the
-- version files, and tests/migrations proves both give the same catalog.
--
-- A lock is a named lease: one owner at a time, until expires_at. Nothing
-- blocks and nothing is tied to a session or a transaction: a holder that
-- crashes simply stops renewing, and once expires_at <= now the next
-- contender takes the lock over (steals it).
--
-- The rules, in one place:
--   * try_lock acquires when the lock is free or expired (expires_at <= now),
--     and also when this owner already holds it: a re-acquire by the holder
--     is a renew (a new full window from now), not an error and not a count.
--   * renew_lock gives the holder a new full window from now; false when the
--     lock was lost: released, or expired and taken by another owner. A lock
--     that expired but that nobody took is still this owner's to renew.
--   * release_lock frees the lock; true only if it was this owner's.
--   * ttl is a duration: NULL or <= 0 is LK002 and nothing is written;
--     expires_at = now + ttl saturates at the bigint maximum.
--   * The lock name is a name (non-empty, at most 1024 bytes, outside the
--     reserved alk: prefix); the owner is a holder's identity like a worker
--     id (non-empty; the prefix is allowed). pyalk's own locks (the
--     scheduler's alk:scheduler) go through the internal _try_lock,
--     _renew_lock and _release_lock, which accept the reserved prefix.

CREATE TYPE alk.lock AS (
    name text,
    owner text,
    acquired_at bigint,
    expires_at bigint
);
COMMENT ON TYPE alk.lock IS 'A lock as alk.get_lock returns it; expires_at <= alk.now() means it is free for the taking.';

CREATE TABLE alk.locks (
    name text NOT NULL,
    owner text NOT NULL,
    acquired_at bigint NOT NULL,
    expires_at bigint NOT NULL,
    CONSTRAINT locks_pkey PRIMARY KEY (name),
    CONSTRAINT locks_name_named CHECK (name <> ''),
    CONSTRAINT locks_owner_named CHECK (owner <> '')
);
COMMENT ON TABLE alk.locks IS 'Every lock ever taken and not released. Private: use the alk.* lock functions.';

-- The duration rule: a lease of zero or negative length (or none) is refused.
CREATE FUNCTION alk._check_ttl(ttl bigint)
RETURNS bigint
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF ttl IS NULL OR ttl <= 0 THEN
        PERFORM alk._raise('LK002', 'ttl must be a positive number of seconds, got ' || coalesce(ttl::text, 'NULL'));
    END IF;
    RETURN ttl;
END
$$;
COMMENT ON FUNCTION alk._check_ttl(bigint) IS 'internal: LK002 unless ttl is a positive number of seconds';

-- internal forms: the implementation, reserved names allowed ------------------

CREATE FUNCTION alk._try_lock(name text, owner text, ttl bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock bigint := alk.now();
    lock_name text := alk._check_name('name', name, true);
    lock_owner text := alk._check_name('owner', owner, true);
    expires bigint := alk._sat_add(clock, alk._check_ttl(ttl));
BEGIN
    -- One statement, so concurrent contenders serialise on the row: the first
    -- inserts, the others wait for it and then see a live lock held by
    -- someone else, which the WHERE refuses.
    INSERT INTO alk.locks AS l (name, owner, acquired_at, expires_at)
    VALUES (lock_name, lock_owner, clock, expires)
    ON CONFLICT ON CONSTRAINT locks_pkey DO UPDATE
       SET owner = excluded.owner,
           -- A holder re-acquiring keeps its acquisition time.
           acquired_at = CASE WHEN l.owner = excluded.owner AND l.expires_at > clock
                              THEN l.acquired_at ELSE clock END,
           expires_at = excluded.expires_at
     WHERE l.expires_at <= clock OR l.owner = excluded.owner;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION alk._try_lock(text, text, bigint) IS
'internal: alk.try_lock without the reserved-prefix rule, for pyalk''s own locks (alk:scheduler)';

CREATE FUNCTION alk._renew_lock(name text, owner text, ttl bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock bigint := alk.now();
    lock_name text := alk._check_name('name', name, true);
    lock_owner text := alk._check_name('owner', owner, true);
    expires bigint := alk._sat_add(clock, alk._check_ttl(ttl));
BEGIN
    UPDATE alk.locks l SET expires_at = expires
     WHERE l.name = lock_name AND l.owner = lock_owner;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION alk._renew_lock(text, text, bigint) IS
'internal: alk.renew_lock without the reserved-prefix rule, for pyalk''s own locks (alk:scheduler)';

CREATE FUNCTION alk._release_lock(name text, owner text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    lock_name text := alk._check_name('name', name, true);
    lock_owner text := alk._check_name('owner', owner, true);
BEGIN
    DELETE FROM alk.locks l WHERE l.name = lock_name AND l.owner = lock_owner;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION alk._release_lock(text, text) IS
'internal: alk.release_lock without the reserved-prefix rule, for pyalk''s own locks (alk:scheduler)';

-- public forms: the reserved prefix refused, then the implementation ----------

CREATE FUNCTION alk.try_lock(name text, owner text, ttl bigint)
RETURNS boolean
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT alk._try_lock(alk._check_name('name', $1), $2, $3)
$$;
COMMENT ON FUNCTION alk.try_lock(text, text, bigint) IS
'Take the lock name for owner until now + ttl seconds; true when owner holds it afterwards. Succeeds when the lock is '
'free, expired (expires_at <= now: taken over from its last holder) or already held by owner (then it is a renew: '
'a new full window from now; locks do not count). False, and nothing changes, while another owner holds it. '
'ttl NULL or <= 0 is LK002. Example: SELECT alk.try_lock(''nightly-report'', ''host-a:4242'', 60);';

CREATE FUNCTION alk.renew_lock(name text, owner text, ttl bigint)
RETURNS boolean
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT alk._renew_lock(alk._check_name('name', $1), $2, $3)
$$;
COMMENT ON FUNCTION alk.renew_lock(text, text, bigint) IS
'Give owner''s lock a new full window: expires_at = now + ttl seconds. False, and nothing changes, when the lock was '
'lost (released, or expired and taken by another owner). ttl NULL or <= 0 is LK002. '
'Example: SELECT alk.renew_lock(''nightly-report'', ''host-a:4242'', 60);';

CREATE FUNCTION alk.release_lock(name text, owner text)
RETURNS boolean
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT alk._release_lock(alk._check_name('name', $1), $2)
$$;
COMMENT ON FUNCTION alk.release_lock(text, text) IS
'Free the lock if owner holds it; true if it did. Another owner''s lock is left alone (false). '
'Example: SELECT alk.release_lock(''nightly-report'', ''host-a:4242'');';

CREATE FUNCTION alk.get_lock(name text)
RETURNS SETOF alk.lock
LANGUAGE sql STABLE SECURITY DEFINER ROWS 1
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT l.name, l.owner, l.acquired_at, l.expires_at
      FROM alk.locks l
     WHERE l.name = alk._check_name('name', $1, true)
$$;
COMMENT ON FUNCTION alk.get_lock(text) IS
'The lock as stored (reserved names included, for inspection): one row, or none when nobody took it or it was '
'released (as a scalar, (SELECT alk.get_lock(name)) is then NULL). A row with expires_at <= alk.now() is expired: '
'free for the next try_lock. '
'Example: SELECT *, expires_at <= alk.now() AS expired FROM alk.get_lock(''nightly-report'');';

-- locks ---------------------------------------------------------------------

CREATE TYPE alk.lock_state AS (
    name text,
    owner text,
    acquired_at bigint,
    expires_at bigint,
    held boolean
);
COMMENT ON TYPE alk.lock_state IS 'One lock''s row of alk.list_locks.';

CREATE FUNCTION alk.list_locks()
RETURNS SETOF alk.lock_state
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT l.name, l.owner, l.acquired_at, l.expires_at, l.expires_at > alk.now()
      FROM alk.locks l
     ORDER BY l.name
$$;
COMMENT ON FUNCTION alk.list_locks() IS
'Every lock taken and not released, reserved ones (the scheduler''s leader lock) included, by name: held is '
'expires_at > now; an expired row is free for the next try_lock. '
'Example: SELECT name, owner, expires_at - alk.now() AS expires_in_s FROM alk.list_locks() WHERE held;';

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;
