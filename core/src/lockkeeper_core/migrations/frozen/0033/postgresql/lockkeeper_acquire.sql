-- lockkeeper_acquire, as migration 0032 installs it.
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
    frozen_at timestamptz, frozen_until timestamptz, token_ended boolean,
    holder_limit integer, places_until timestamptz)
LANGUAGE plpgsql VOLATILE AS $function$
#variable_conflict use_column
DECLARE
    -- Whether this call holds its token's row lock (or has no token to check).
    checked boolean := p_token IS NULL OR p_token = '';
    revoked boolean;
    token_expires timestamptz;
    -- Grants of one token in flight at once: at most one per server connection.
    margin integer := 0;
    -- The token is so far from its quota that no set of grants in flight can
    -- take it past: it shares its row lock (see below).
    far boolean := false;
BEGIN
-- The lock order (``app.locks.statements``): the resource's row, then the
-- token's. A row a new tenure may take (free or expired, with no one in line
-- before this acquire) is locked first; a row validly held is left alone: a
-- re-acquire needs no token, a refusal locks nothing. Then, when a new tenure
-- may follow (that row, or no row: the insert below comes after the token's
-- lock and is the last this statement takes), the token's row: FOR SHARE
-- without a quota (only a revocation waits), and under a quota while the
-- token's live locks plus max_connections stay below it: every grant in flight
-- holds a connection, so even all of them together cannot pass the quota, and
-- a grant whose count (made after its lock) finds itself that near is refused
-- and tried again. Nearer than that, FOR NO KEY UPDATE: it waits for every
-- grant of the token in flight, shared or not, and counts after them, one at a
-- time. The statement below takes a snapshot of its own after these locks. A
-- row that expires between this look and the statement is not granted
-- unchecked: the statement refuses it and the service tries again.
IF NOT checked THEN
    PERFORM 1 FROM distributed_locks AS l
    WHERE l.resource = p_resource
      AND (l.owner IS NULL OR l.expires_at <= COALESCE(p_now, clock_timestamp()))
      AND NOT EXISTS (
          SELECT 1 FROM lock_waiters AS w
          WHERE w.resource = p_resource
            AND w.deadline > COALESCE(p_now, clock_timestamp())
            AND (p_waiter IS NULL OR w.id < p_waiter))
    FOR UPDATE OF l;
    IF NOT FOUND AND EXISTS (
        SELECT 1 FROM distributed_locks AS l WHERE l.resource = p_resource)
    THEN
        checked := false;  -- held, or others first in line: no new tenure here
    ELSE
        IF p_max_locks IS NOT NULL THEN
            margin := current_setting('max_connections')::integer;
            far := p_max_locks > margin AND (
                SELECT count(*) FROM (
                    SELECT 1 FROM distributed_locks AS q
                    WHERE q.token = p_token
                      AND q.expires_at > COALESCE(p_now, clock_timestamp())
                    LIMIT p_max_locks - margin
                ) AS live
            ) + (
                SELECT count(*) FROM (
                    SELECT 1 FROM lock_holders AS h
                    WHERE h.token = p_token
                      AND h.expires_at > COALESCE(p_now, clock_timestamp())
                    LIMIT p_max_locks - margin
                ) AS places
            ) < p_max_locks - margin;
        END IF;
        IF p_max_locks IS NULL OR far THEN
            SELECT t.revoked_at IS NOT NULL, t.expires_at
            INTO revoked, token_expires
            FROM api_tokens AS t WHERE t.name = p_token FOR SHARE;
        ELSE
            SELECT t.revoked_at IS NOT NULL, t.expires_at
            INTO revoked, token_expires
            FROM api_tokens AS t WHERE t.name = p_token FOR NO KEY UPDATE;
        END IF;
        checked := true;
    END IF;
END IF;
RETURN QUERY
WITH early AS MATERIALIZED (SELECT COALESCE(p_now, clock_timestamp()) AS now),
prior AS MATERIALIZED (
    SELECT l.id, l.owner, l.token, l.expires_at, l.places_until, l.session_id
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
    SELECT prior.id, prior.owner, prior.token, prior.session_id, prior.expires_at,
           prior.owner IS NOT NULL AND prior.expires_at > clock.now AS valid,
           -- Held by places (shared grants, a semaphore's): no exclusive grant.
           COALESCE(prior.places_until > clock.now, false) AS placed,
           -- Bound to a session of the same holder (0014's rule: the session's
           -- expiry is the row's): only the session's heartbeat moves it, so a
           -- plain re-acquire is refused rather than cutting it loose.
           prior.session_id IS NOT NULL AND EXISTS (
               SELECT 1 FROM lock_sessions AS s
               WHERE s.id = prior.session_id AND s.expires_at = prior.expires_at
                 AND s.owner = prior.owner AND s.token = prior.token) AS bound
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
-- The token was revoked, or has expired by the deciding clock (no row: a
-- caller's own label, nothing to check).
ended AS MATERIALIZED (
    SELECT COALESCE(revoked, false)
           OR COALESCE(token_expires <= clock.now, false) AS ended
    FROM clock
),
quota AS MATERIALIZED (
    SELECT p_max_locks IS NOT NULL AND (
        SELECT count(*) FROM (
            SELECT 1 FROM distributed_locks AS q, clock
            WHERE q.token = p_token AND q.expires_at > clock.now
            LIMIT p_max_locks
        ) AS live
    ) + (
        SELECT count(*) FROM (
            SELECT 1 FROM lock_holders AS h, clock
            WHERE h.token = p_token AND h.expires_at > clock.now
            LIMIT p_max_locks
        ) AS places
    ) >= p_max_locks AS reached,
    -- Shared, but no longer far from the quota: not granted (the service tries
    -- again, and takes the lock alone).
    far AND (
        SELECT count(*) FROM (
            SELECT 1 FROM distributed_locks AS q, clock
            WHERE q.token = p_token AND q.expires_at > clock.now
            LIMIT p_max_locks - margin
        ) AS live
    ) + (
        SELECT count(*) FROM (
            SELECT 1 FROM lock_holders AS h, clock
            WHERE h.token = p_token AND h.expires_at > clock.now
            LIMIT p_max_locks - margin
        ) AS places
    ) >= p_max_locks - margin AS near
),
updated AS (
    UPDATE distributed_locks AS l
    SET owner = p_owner,
        token = p_token,
        -- A new tenure is exclusive, of limit 1, and bound to no session (a
        -- previous tenure's session must not extend it).
        holder_limit = 1,
        places_until = CASE WHEN decided.valid THEN l.places_until END,
        session_id = CASE WHEN decided.valid THEN l.session_id END,
        acquired_at = clock.now,
        expires_at = clock.now + make_interval(secs => p_ttl),
        fence = CASE WHEN decided.valid THEN l.fence
                     ELSE nextval('lock_fence_seq') END
    FROM decided, clock
    WHERE l.id = decided.id
      AND ((decided.valid AND NOT decided.bound)
           OR (NOT decided.valid AND checked AND NOT decided.placed
                             AND NOT (SELECT ended FROM ended)
                             AND NOT EXISTS (SELECT 1 FROM frozen)
                             AND NOT (SELECT reached FROM quota)
                             AND NOT (SELECT near FROM quota)))
    RETURNING l.resource, l.owner, l.token, l.fence, l.acquired_at, l.expires_at,
              decided.owner AS previous_owner,
              -- A take-over names the token it took, and the expiry a grant
              -- bound to a session had (its heartbeats moved it without an
              -- event), as ``details.took_over_from`` and ``ended_bound_grant``
              -- write them.
              CASE WHEN decided.owner IS NOT NULL AND NOT decided.valid
                   THEN (jsonb_build_object(
                       'previous_token', COALESCE(decided.token, ''))
                       || CASE WHEN decided.session_id IS NULL THEN '{}'::jsonb
                          ELSE jsonb_build_object(
                              'previous_expires_at',
                              to_char(decided.expires_at AT TIME ZONE 'UTC',
                                      'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'))
                          END)::text
              END AS details,
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
      AND checked AND NOT (SELECT ended FROM ended)
      AND NOT EXISTS (SELECT 1 FROM frozen)
      AND NOT (SELECT reached FROM quota)
      AND NOT (SELECT near FROM quota)
    ON CONFLICT (resource) DO NOTHING
    RETURNING distributed_locks.resource, distributed_locks.owner,
              distributed_locks.token, distributed_locks.fence,
              distributed_locks.acquired_at, distributed_locks.expires_at,
              CAST(NULL AS varchar) AS previous_owner,
              CAST(NULL AS text) AS details, 'acquired' AS action
),
granted AS (SELECT * FROM updated UNION ALL SELECT * FROM inserted),
-- A new tenure on a row that places held, all run out (a live one made it
-- ``placed``): they go with it. Those bound to a session ran out at their
-- session's expiry: a ``released`` event each before the grant's, as
-- ``details.session_expiry_event`` writes (once the session's row is gone
-- nothing else would say when).
cleared AS (
    DELETE FROM lock_holders AS h
    USING updated AS u
    WHERE h.resource = p_resource AND u.action <> 'reacquired'
    RETURNING h.id, h.resource, h.owner, h.token, h.mode, h.fence, h.acquired_at,
              h.expires_at, h.session_id
),
logged AS (
    INSERT INTO lock_events (resource, action, owner, previous_owner, token, fence,
                             acquired_at, expires_at, actor, occurred_at, mode,
                             details)
    SELECT e.resource, e.action, e.owner, e.previous_owner, e.token, e.fence,
           e.acquired_at, e.expires_at, e.actor, e.occurred_at, e.mode, e.details
    FROM (
        SELECT 0 AS step, c.expires_at AS ran_out, c.id AS place, c.resource,
               'released' AS action, c.owner, c.owner AS previous_owner,
               NULLIF(c.token, '') AS token, c.fence, c.acquired_at,
               c.expires_at, CAST(NULL AS varchar) AS actor,
               c.expires_at AS occurred_at, c.mode,
               jsonb_build_object('session', c.session_id,
                                  'session_expired', true)::text AS details
        FROM cleared AS c, clock
        WHERE c.session_id IS NOT NULL AND c.expires_at <= clock.now
        UNION ALL
        SELECT 1, NULL, NULL, g.resource, g.action, g.owner, g.previous_owner,
               g.token, g.fence, g.acquired_at, g.expires_at, p_actor, clock.now,
               'exclusive', g.details
        FROM granted AS g, clock
    ) AS e
    ORDER BY e.step, e.ran_out, e.place
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
       NULL::timestamptz, false, 1, NULL::timestamptz
FROM granted AS g, clock, queue
UNION ALL
SELECT false, NULL, p_resource, l.owner, l.token, l.fence,
       l.acquired_at, l.expires_at, clock.now, queue.waiters,
       -- Only a grant can be over quota: a valid lock here is another holder's.
       CASE WHEN l.owner IS NOT NULL AND l.expires_at > clock.now THEN false
            ELSE (SELECT reached FROM quota) END,
       f.prefix, f.reason, f.actor, f.frozen_at, f.ends_at,
       -- Only a new grant is refused for its token; a valid lock here is
       -- another holder's.
       CASE WHEN l.owner IS NOT NULL AND l.expires_at > clock.now THEN false
            ELSE checked AND (SELECT ended FROM ended) END,
       l.holder_limit, l.places_until
FROM clock
CROSS JOIN queue
LEFT JOIN distributed_locks AS l ON l.resource = p_resource
LEFT JOIN frozen AS f ON true
WHERE NOT EXISTS (SELECT 1 FROM granted);
END
$function$
