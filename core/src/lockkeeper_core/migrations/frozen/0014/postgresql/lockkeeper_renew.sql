-- lockkeeper_renew, as migration 0014 installs it.
--
-- Renew and release lock only their owner's row, then read the clock; a valid
-- lock of the same owner under another token is refused (the holder is the pair).
-- ``changed`` is the operation's conditional UPDATE; it returns the lock as the
-- answer shows it.
CREATE OR REPLACE FUNCTION lockkeeper_renew(
    p_resource varchar, p_owner varchar, p_token varchar, p_ttl double precision,
    p_actor varchar, p_now timestamptz)
RETURNS TABLE (
    done boolean, action text, resource varchar, owner varchar, token varchar,
    fence bigint, acquired_at timestamptz, expires_at timestamptz,
    now timestamptz, waiters bigint)
LANGUAGE plpgsql VOLATILE AS $function$
#variable_conflict use_column
BEGIN
RETURN QUERY
WITH target AS MATERIALIZED (
    SELECT l.id FROM distributed_locks AS l
    WHERE l.resource = p_resource AND l.owner = p_owner
    FOR UPDATE OF l
),
clock AS MATERIALIZED (
    SELECT COALESCE((SELECT COALESCE(p_now, clock_timestamp()) FROM target),
                    COALESCE(p_now, clock_timestamp())) AS now
),
changed AS (
    UPDATE distributed_locks AS l
    SET expires_at = clock.now + make_interval(secs => p_ttl)
    FROM target, clock
    WHERE l.id = target.id AND l.owner = p_owner
      AND (l.token IS NULL OR l.token = p_token) AND l.expires_at > clock.now
      AND (l.session_id IS NULL OR NOT EXISTS (
            SELECT 1 FROM lock_sessions AS s
            WHERE s.id = l.session_id AND s.expires_at = l.expires_at
              AND s.owner = l.owner AND s.token = l.token))
    RETURNING l.resource, l.owner, l.token, l.fence, l.acquired_at, l.expires_at
),
logged AS (
    INSERT INTO lock_events (resource, action, owner, previous_owner, token, fence,
                             acquired_at, expires_at, actor, occurred_at)
    SELECT c.resource, 'renewed', c.owner, c.owner, p_token, c.fence,
           c.acquired_at, c.expires_at, p_actor, clock.now
    FROM changed AS c, clock
),
queue AS (
    SELECT count(*) AS waiters FROM lock_waiters AS w, clock
    WHERE w.resource = p_resource AND w.deadline > clock.now
)
SELECT true, 'renewed'::text, c.resource, c.owner, c.token, c.fence,
       c.acquired_at, c.expires_at, clock.now, queue.waiters
FROM changed AS c, clock, queue
UNION ALL
SELECT false, NULL, l.resource, l.owner, l.token, l.fence, l.acquired_at,
       l.expires_at, clock.now, queue.waiters
FROM distributed_locks AS l, clock, queue
WHERE l.resource = p_resource AND NOT EXISTS (SELECT 1 FROM changed);
END
$function$
