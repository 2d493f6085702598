-- lockkeeper_guard, as migration 0008 installs it.
--
-- The row is locked first and the clock read after the lock is held, as the
-- lock functions of 0007 do: a clock read before the wait could be older than
-- a take-over the guard waited for. Under READ COMMITTED a guard that waited
-- for a take-over sees the new row (and fails as lost); under REPEATABLE READ
-- or SERIALIZABLE, PostgreSQL refuses the locking read of a row changed since
-- the snapshot with 40001 instead: it fails closed either way.
--
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
    SELECT l.owner, l.fence, l.expires_at INTO v_owner, v_fence, v_expires_at
    FROM distributed_locks AS l
    WHERE l.resource = p_resource
    FOR SHARE;
    v_now := clock_timestamp();
    IF v_fence = p_fence AND v_owner IS NOT NULL THEN
        IF v_expires_at > v_now THEN
            RETURN;
        END IF;
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
