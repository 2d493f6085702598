-- lockkeeper_guard, as migration 0030 installs it.
--
-- It raises LK001 (lost), LK002 (expired) or LK003 (never held), as migration
-- 0008 describes them, and 40001 for a fence newer than the caller's snapshot.
-- ``{schema}`` stands for the schema it is created in, filled in as it is
-- installed: the search_path it pins.
CREATE OR REPLACE FUNCTION lockkeeper_guard(p_resource varchar, p_fence bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = {schema}, pg_temp
AS $function$
DECLARE
    v_owner varchar;
    v_fence bigint;
    v_expires_at timestamptz;
    v_now timestamptz;
BEGIN
    -- A plain read first: no lock.
    v_now := clock_timestamp();
    SELECT l.owner, l.fence, l.expires_at INTO v_owner, v_fence, v_expires_at
    FROM distributed_locks AS l WHERE l.resource = p_resource;
    IF (v_fence = p_fence AND v_owner IS NOT NULL AND v_expires_at > v_now)
       OR EXISTS (
            SELECT 1 FROM lock_holders AS h
            WHERE h.resource = p_resource AND h.fence = p_fence
              AND h.expires_at > v_now) THEN
        -- The row, shared until the caller's transaction ends; the clock and
        -- the grants read again once it is held.
        SELECT l.owner, l.fence, l.expires_at INTO v_owner, v_fence, v_expires_at
        FROM distributed_locks AS l
        WHERE l.resource = p_resource
        FOR SHARE;
        v_now := clock_timestamp();
        IF (v_fence = p_fence AND v_owner IS NOT NULL AND v_expires_at > v_now)
           OR EXISTS (
                SELECT 1 FROM lock_holders AS h
                WHERE h.resource = p_resource AND h.fence = p_fence
                  AND h.expires_at > v_now) THEN
            RETURN;
        END IF;
    ELSIF current_setting('transaction_isolation') <> 'read committed'
          AND p_fence > GREATEST(COALESCE(v_fence, 0), COALESCE((
                SELECT max(h.fence) FROM lock_holders AS h
                WHERE h.resource = p_resource), 0)) THEN
        -- The transaction's snapshot is older than any grant of this fence
        -- could be: it cannot guard one (as a locking read of a row changed
        -- since the snapshot fails).
        RAISE EXCEPTION USING ERRCODE = '40001',
            MESSAGE = format('lockkeeper_guard: fence %s is newer than this '
                             'transaction''s snapshot of %L: begin it after '
                             'the grant', p_fence, p_resource);
    END IF;
    SELECT e.expires_at INTO v_expires_at FROM (
        SELECT l.expires_at FROM distributed_locks AS l
        WHERE l.resource = p_resource AND l.fence = p_fence
          AND l.owner IS NOT NULL
        UNION ALL
        SELECT h.expires_at FROM lock_holders AS h
        WHERE h.resource = p_resource AND h.fence = p_fence) AS e
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'LK002',
            MESSAGE = format('lockkeeper_guard: expired: the grant of %L under '
                             'fence %s expired at %s', p_resource, p_fence,
                             v_expires_at);
    END IF;
    IF EXISTS (SELECT 1 FROM lock_events AS e
               WHERE e.resource = p_resource AND e.fence = p_fence) THEN
        RAISE EXCEPTION USING ERRCODE = 'LK001',
            MESSAGE = format('lockkeeper_guard: lost: %L is no longer held under '
                             'fence %s', p_resource, p_fence),
            DETAIL = CASE WHEN v_owner IS NULL THEN 'No grant is in place.'
                          ELSE format('Fence %s holds it now.', v_fence) END;
    END IF;
    RAISE EXCEPTION USING ERRCODE = 'LK003',
        MESSAGE = format('lockkeeper_guard: never held: %L was never granted '
                         'under fence %s', p_resource, p_fence);
END
$function$
