-- lockkeeper_acquire, as migration 0007 installs it.
--
-- Each statement takes its row lock first and reads the clock after it: ``clock``
-- selects from the locking CTE, so PostgreSQL has the row locked before it
-- evaluates clock_timestamp() there. A clock read before the wait for the row lock
-- could be older than the change the statement waited for (a release, a
-- force-release), and the grant would record a time before the end of the grant it
-- follows. ``early`` only pre-selects the rows worth locking; anything it lets
-- through is decided again by ``clock``, and a row expired by ``early`` is expired
-- by the later ``clock`` too.
--
-- Column names of the answer (OUT parameters) are also column names of the
-- tables: ``#variable_conflict use_column`` makes a bare name in the SQL the
-- table's column, as it was when the statement was sent on its own.
CREATE OR REPLACE FUNCTION lockkeeper_acquire(
    p_resource varchar, p_owner varchar, p_token varchar, p_ttl double precision,
    p_actor varchar, p_max_locks integer, p_waiter bigint, p_now timestamptz)
RETURNS TABLE (
    done boolean, action text, resource varchar, owner varchar, token varchar,
    fence bigint, acquired_at timestamptz, expires_at timestamptz,
    now timestamptz, waiters bigint, over_quota boolean,
    frozen_prefix varchar, frozen_reason text, frozen_actor varchar,
    frozen_at timestamptz, frozen_until timestamptz)
LANGUAGE plpgsql VOLATILE AS $function$
#variable_conflict use_column
BEGIN
RETURN QUERY
WITH early AS MATERIALIZED (SELECT COALESCE(p_now, clock_timestamp()) AS now),
prior AS MATERIALIZED (
    SELECT l.id, l.owner, l.expires_at
    FROM distributed_locks AS l, early
    WHERE l.resource = p_resource
      AND (l.owner IS NULL OR l.expires_at <= early.now
           OR (l.owner = p_owner AND (l.token IS NULL OR l.token = p_token)))
      AND ((l.owner = p_owner AND (l.token IS NULL OR l.token = p_token)
            AND l.expires_at > early.now)
           -- Someone is in line before this acquire: anyone for a non-waiting
           -- acquire (p_waiter NULL), the waiters that arrived earlier for a
           -- waiting one.
           OR NOT EXISTS (
               SELECT 1 FROM lock_waiters AS w
               WHERE w.resource = p_resource AND w.deadline > early.now
                 AND (p_waiter IS NULL OR w.id < p_waiter)))
    FOR UPDATE OF l
),
clock AS MATERIALIZED (
    SELECT COALESCE((SELECT COALESCE(p_now, clock_timestamp()) FROM prior),
                    early.now) AS now
    FROM early
),
decided AS (
    SELECT prior.id, prior.owner,
           prior.owner IS NOT NULL AND prior.expires_at > clock.now AS valid
    FROM prior, clock
),
frozen AS MATERIALIZED (
    SELECT f.prefix, f.reason, f.actor, f.frozen_at, f.ends_at
    FROM lock_freezes AS f, clock
    WHERE f.prefix = substr(p_resource, 1, length(f.prefix))
      AND (f.ends_at IS NULL OR f.ends_at > clock.now)
    ORDER BY f.prefix
    LIMIT 1
),
quota AS MATERIALIZED (
    SELECT p_max_locks IS NOT NULL AND (
        SELECT count(*) FROM (
            SELECT 1 FROM distributed_locks AS q, clock
            WHERE q.token = p_token AND q.expires_at > clock.now
            LIMIT p_max_locks
        ) AS live
    ) >= p_max_locks AS reached
),
updated AS (
    UPDATE distributed_locks AS l
    SET owner = p_owner,
        token = p_token,
        acquired_at = clock.now,
        expires_at = clock.now + make_interval(secs => p_ttl),
        fence = CASE WHEN decided.valid THEN l.fence
                     ELSE nextval('lock_fence_seq') END
    FROM decided, clock
    WHERE l.id = decided.id
      AND (decided.valid OR (NOT EXISTS (SELECT 1 FROM frozen)
                             AND NOT (SELECT reached FROM quota)))
    RETURNING l.resource, l.owner, l.token, l.fence, l.acquired_at, l.expires_at,
              decided.owner AS previous_owner,
              CASE WHEN decided.owner IS NULL THEN 'acquired'
                   WHEN decided.valid THEN 'reacquired'
                   ELSE 'took_over' END AS action
),
inserted AS (
    INSERT INTO distributed_locks (resource, owner, token, fence, acquired_at,
                                   expires_at)
    SELECT p_resource, p_owner, p_token, nextval('lock_fence_seq'),
           clock.now, clock.now + make_interval(secs => p_ttl)
    FROM clock
    WHERE NOT EXISTS (SELECT 1 FROM distributed_locks AS d
                      WHERE d.resource = p_resource)
      AND NOT EXISTS (SELECT 1 FROM frozen)
      AND NOT (SELECT reached FROM quota)
    ON CONFLICT (resource) DO NOTHING
    RETURNING distributed_locks.resource, distributed_locks.owner,
              distributed_locks.token, distributed_locks.fence,
              distributed_locks.acquired_at, distributed_locks.expires_at,
              CAST(NULL AS varchar) AS previous_owner, 'acquired' AS action
),
granted AS (SELECT * FROM updated UNION ALL SELECT * FROM inserted),
logged AS (
    INSERT INTO lock_events (resource, action, owner, previous_owner, token, fence,
                             acquired_at, expires_at, actor, occurred_at)
    SELECT g.resource, g.action, g.owner, g.previous_owner, g.token, g.fence,
           g.acquired_at, g.expires_at, p_actor, clock.now
    FROM granted AS g, clock
),
dequeued AS (
    DELETE FROM lock_waiters AS w
    WHERE w.id = p_waiter AND EXISTS (SELECT 1 FROM granted)
),
-- Live waiters queued for the resource, the waiter's own row excluded: the
-- Lock's ``waiters``. Rows past their deadline (a killed app instance's) never
-- count.
queue AS (
    SELECT count(*) AS waiters FROM lock_waiters AS w, clock
    WHERE w.resource = p_resource AND w.deadline > clock.now
      AND w.id IS DISTINCT FROM p_waiter
)
SELECT true, g.action, g.resource, g.owner, g.token, g.fence,
       g.acquired_at, g.expires_at, clock.now, queue.waiters, false,
       NULL::varchar, NULL::text, NULL::varchar, NULL::timestamptz,
       NULL::timestamptz
FROM granted AS g, clock, queue
UNION ALL
SELECT false, NULL, p_resource, l.owner, l.token, l.fence,
       l.acquired_at, l.expires_at, clock.now, queue.waiters,
       -- Only a grant can be over quota: a valid lock here is another holder's.
       CASE WHEN l.owner IS NOT NULL AND l.expires_at > clock.now THEN false
            ELSE (SELECT reached FROM quota) END,
       f.prefix, f.reason, f.actor, f.frozen_at, f.ends_at
FROM clock
CROSS JOIN queue
LEFT JOIN distributed_locks AS l ON l.resource = p_resource
LEFT JOIN frozen AS f ON true
WHERE NOT EXISTS (SELECT 1 FROM granted);
END
$function$
