-- lockkeeper_release_with_details, as migration 0017 installs it.
--
-- The overload the service calls: ``p_details`` is what the releasing worker
-- reports, stored with the ``released`` event. The five-argument
-- ``lockkeeper_release`` stays for code older than 0017.
CREATE OR REPLACE FUNCTION lockkeeper_release(
    p_resource varchar, p_owner varchar, p_token varchar, p_actor varchar,
    p_now timestamptz, p_details text)
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
    SET owner = NULL, token = NULL, session_id = NULL, expires_at = clock.now
    FROM target, clock
    WHERE l.id = target.id AND l.owner = p_owner
      AND (l.token IS NULL OR l.token = p_token) AND l.expires_at > clock.now
    RETURNING l.resource, p_owner AS owner, p_token AS token, l.fence,
              l.acquired_at, l.expires_at
),
logged AS (
    INSERT INTO lock_events (resource, action, owner, previous_owner, token, fence,
                             acquired_at, expires_at, actor, occurred_at, mode,
                             details)
    SELECT c.resource, 'released', c.owner, c.owner, p_token, c.fence,
           c.acquired_at, c.expires_at, p_actor, clock.now, 'exclusive',
           p_details
    FROM changed AS c, clock
),
queue AS (
    SELECT count(*) AS waiters FROM lock_waiters AS w, clock
    WHERE w.resource = p_resource AND w.deadline > clock.now
)
SELECT true, 'released'::text, c.resource, c.owner, c.token, c.fence,
       c.acquired_at, c.expires_at, clock.now, queue.waiters
FROM changed AS c, clock, queue
UNION ALL
SELECT false, NULL, l.resource, l.owner, l.token, l.fence, l.acquired_at,
       l.expires_at, clock.now, queue.waiters
FROM distributed_locks AS l, clock, queue
WHERE l.resource = p_resource AND NOT EXISTS (SELECT 1 FROM changed);
END
$function$
