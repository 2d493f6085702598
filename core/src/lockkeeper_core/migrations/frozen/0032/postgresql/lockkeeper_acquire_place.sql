-- lockkeeper_acquire_place, as migration 0032 installs it.
CREATE OR REPLACE FUNCTION lockkeeper_acquire_place(
    p_resource varchar, p_owner varchar, p_token varchar, p_ttl double precision,
    p_actor varchar, p_max_locks integer, p_waiter bigint, p_now timestamptz,
    p_limit integer, p_mode varchar)
RETURNS TABLE (
    done boolean, action text, resource varchar, owner varchar, token varchar,
    fence bigint, acquired_at timestamptz, expires_at timestamptz,
    now timestamptz, waiters bigint, over_quota boolean,
    frozen_prefix varchar, frozen_reason text, frozen_actor varchar,
    frozen_at timestamptz, frozen_until timestamptz, token_ended boolean,
    holder_limit integer, mode varchar, holders integer, limit_mismatch integer,
    bound_session varchar)
LANGUAGE plpgsql VOLATILE AS $function$
#variable_conflict use_column
DECLARE
    v_now timestamptz;
    r distributed_locks%ROWTYPE;
    mine lock_holders%ROWTYPE;
    first_live lock_holders%ROWTYPE;
    -- What a refusal names: the row (the exclusive grant, or the row itself
    -- while others are in line), a place, or nothing.
    shown_place lock_holders%ROWTYPE;
    show_row boolean := false;
    shown_limit integer;
    shown_holders integer;
    active_freeze lock_freezes%ROWTYPE;
    new_fence bigint;
    queued bigint;
    in_line_ahead boolean;
    live_count integer;
    expired_count integer;
    live_until timestamptz;
    exclusive_live boolean;
    exclusive_mine boolean;
    current_limit integer;
    holders_now integer;
    -- A place's token: a caller with none is recorded as '' (NO_TOKEN).
    mine_token varchar := COALESCE(p_token, '');
    capacity integer := CASE WHEN p_mode = 'exclusive' THEN p_limit END;
    counting boolean := COALESCE(p_max_locks, 0) <> 0 AND p_token IS NOT NULL;
    previous varchar;
    previous_token varchar;
    -- The grant taken over: its place (NULL: the row's grant), and the session
    -- it was bound to with the expiry it had (its heartbeats moved it without
    -- an event).
    taken_place bigint;
    previous_session varchar;
    previous_expiry timestamptz;
    -- The expired places bound to a session, as they were before this call.
    cleared lock_holders[];
    new_expiry timestamptz;
    dequeue boolean := true;
    -- Shared to exclusive for the sole holder: a new tenure (a new fence).
    promoting boolean := false;
    -- The event's details: the mode a promoted or demoted grant had.
    v_details text;
    t_revoked timestamptz;
    t_expires timestamptz;
BEGIN
done := false;
over_quota := false;
token_ended := false;
-- A plain look first (no lock, no write): a semaphore full of others refuses
-- here, so its refused contenders never queue on its row lock.
IF p_waiter IS NULL AND p_mode = 'exclusive' AND p_limit > 1 THEN
    v_now := COALESCE(p_now, clock_timestamp());
    IF EXISTS (SELECT 1 FROM distributed_locks AS l
               WHERE l.resource = p_resource
                 AND COALESCE(l.holder_limit, 1) = p_limit) THEN
        SELECT count(*) INTO live_count FROM lock_holders AS h
        WHERE h.resource = p_resource AND h.expires_at > v_now;
        IF live_count >= p_limit AND NOT EXISTS (
            SELECT 1 FROM lock_holders AS h
            WHERE h.resource = p_resource AND h.expires_at > v_now
              AND h.owner = p_owner AND h.token = mine_token) THEN
            SELECT h.* INTO shown_place FROM lock_holders AS h
            WHERE h.resource = p_resource AND h.expires_at > v_now
            ORDER BY h.expires_at, h.id LIMIT 1;
            now := v_now;
            waiters := 0;
            resource := shown_place.resource;
            owner := shown_place.owner;
            token := shown_place.token;
            fence := shown_place.fence;
            acquired_at := shown_place.acquired_at;
            expires_at := shown_place.expires_at;
            mode := shown_place.mode;
            holder_limit := p_limit;
            holders := live_count;
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;
END IF;

-- The lock order (``app.locks.statements``): the resource's row, then the
-- token's, then the places. The row is locked first; a resource with none yet
-- gets it only with its first grant (below, after the token's row): a refused
-- acquire writes nothing. The clock once the row is held.
SELECT l.* INTO r FROM distributed_locks AS l
WHERE l.resource = p_resource FOR UPDATE;
v_now := COALESCE(p_now, clock_timestamp());

-- The line (live waiters, our own row excluded; and whether any is ahead of
-- us: everyone is, for an acquire not in line) and the places.
SELECT count(*) FILTER (WHERE w.id IS DISTINCT FROM p_waiter),
       count(*) FILTER (WHERE p_waiter IS NULL OR w.id < p_waiter) > 0
INTO queued, in_line_ahead
FROM lock_waiters AS w
WHERE w.resource = p_resource AND w.deadline > v_now;
SELECT count(*) FILTER (WHERE h.expires_at > v_now),
       count(*) FILTER (WHERE h.expires_at <= v_now),
       max(h.expires_at) FILTER (WHERE h.expires_at > v_now)
INTO live_count, expired_count, live_until
FROM lock_holders AS h WHERE h.resource = p_resource;
IF expired_count > 0 THEN
    SELECT array_agg(h ORDER BY h.expires_at, h.id) INTO cleared
    FROM lock_holders AS h
    WHERE h.resource = p_resource AND h.expires_at <= v_now
      AND h.session_id IS NOT NULL;
END IF;
SELECT h.* INTO first_live FROM lock_holders AS h
WHERE h.resource = p_resource AND h.expires_at > v_now
ORDER BY h.expires_at, h.id LIMIT 1;
SELECT h.* INTO mine FROM lock_holders AS h
WHERE h.resource = p_resource AND h.expires_at > v_now
  AND h.owner = p_owner AND h.token = mine_token
ORDER BY h.expires_at, h.id LIMIT 1;
exclusive_live := COALESCE(r.owner IS NOT NULL AND r.expires_at > v_now, false);
exclusive_mine := exclusive_live AND r.owner = p_owner
    AND (r.token IS NULL OR r.token IS NOT DISTINCT FROM p_token);
-- No row yet: a free resource of the limit asked.
current_limit := CASE WHEN r.id IS NULL THEN p_limit
                      ELSE COALESCE(r.holder_limit, 1) END;
holders_now := live_count + CASE WHEN exclusive_live THEN 1 ELSE 0 END;
shown_limit := current_limit;
shown_holders := holders_now;

<<decision>>
BEGIN
    IF (exclusive_live OR live_count > 0 OR queued > 0)
       AND current_limit <> p_limit THEN
        -- In use with another limit: the grant that ends first.
        limit_mismatch := current_limit;
        show_row := exclusive_live;
        shown_place := first_live;
        EXIT decision;
    END IF;
    IF mine.id IS NOT NULL AND mine.session_id IS NOT NULL THEN
        -- Bound to a live session: only the session renews it.
        SELECT s.id INTO bound_session FROM lock_sessions AS s
        WHERE s.id = mine.session_id AND s.expires_at = mine.expires_at
          AND s.token = mine.token AND s.owner = mine.owner;
        IF bound_session IS NOT NULL THEN
            EXIT decision;
        END IF;
    END IF;
    IF mine.id IS NULL AND exclusive_mine AND r.session_id IS NOT NULL THEN
        SELECT s.id INTO bound_session FROM lock_sessions AS s
        WHERE s.id = r.session_id AND s.expires_at = r.expires_at
          AND s.token = r.token AND s.owner = r.owner;
        IF bound_session IS NOT NULL THEN
            EXIT decision;
        END IF;
    END IF;

    -- A holder asking again: re-acquire, promote, demote.
    IF mine.id IS NOT NULL AND (p_mode = 'shared') = (mine.mode = 'shared') THEN
        new_expiry := v_now + make_interval(secs => p_ttl);
        UPDATE lock_holders AS h
        SET acquired_at = v_now, expires_at = new_expiry, session_id = NULL
        WHERE h.id = mine.id;
        UPDATE distributed_locks AS l
        SET places_until = GREATEST(new_expiry, (
                SELECT max(h.expires_at) FROM lock_holders AS h
                WHERE h.resource = p_resource AND h.expires_at > v_now
                  AND h.id <> mine.id)),
            holder_limit = p_limit
        WHERE l.id = r.id;
        done := true;
        action := 'reacquired';
        previous := p_owner;
        resource := mine.resource;
        owner := mine.owner;
        token := mine.token;
        fence := mine.fence;
        acquired_at := v_now;
        expires_at := new_expiry;
        mode := mine.mode;
        holder_limit := current_limit;
        holders := holders_now;
        EXIT decision;
    END IF;
    IF mine.id IS NOT NULL THEN
        -- Shared to exclusive: only as the sole holder, refused as a new
        -- grant is (below: the token, the freeze).
        IF live_count > 1 OR (exclusive_live AND NOT exclusive_mine) THEN
            show_row := exclusive_live;
            SELECT h.* INTO shown_place FROM lock_holders AS h
            WHERE h.resource = p_resource AND h.expires_at > v_now
              AND h.id <> mine.id
            ORDER BY h.expires_at, h.id LIMIT 1;
            EXIT decision;
        END IF;
        promoting := true;
    ELSIF exclusive_mine THEN
        IF p_mode = 'shared' THEN
            -- Exclusive to shared: always, keeping the fence.
            new_expiry := v_now + make_interval(secs => p_ttl);
            UPDATE distributed_locks AS l
            SET owner = NULL, token = NULL, session_id = NULL, expires_at = v_now,
                places_until = new_expiry, holder_limit = 1
            WHERE l.id = r.id;
            DELETE FROM lock_holders AS h WHERE h.resource = p_resource;
            INSERT INTO lock_holders (resource, owner, token, mode, fence,
                                      acquired_at, expires_at, session_id)
            VALUES (p_resource, p_owner, mine_token, 'shared', r.fence, v_now,
                    new_expiry, NULL);
            done := true;
            action := 'reacquired';
            previous := p_owner;
            v_details := '{"from_mode": "exclusive"}';
            token := mine_token;
            fence := r.fence;
            expires_at := new_expiry;
            mode := 'shared';
            holder_limit := 1;
            holders := 1;
            EXIT decision;
        END IF;
        -- An exclusive re-acquire (the exclusive path's, normally).
        UPDATE distributed_locks AS l
        SET owner = p_owner, token = p_token, acquired_at = v_now,
            expires_at = v_now + make_interval(secs => p_ttl)
        WHERE l.id = r.id
        RETURNING l.expires_at INTO expires_at;
        done := true;
        action := 'reacquired';
        previous := r.owner;
        token := p_token;
        fence := r.fence;
        mode := 'exclusive';
        dequeue := false;
        EXIT decision;
    END IF;

    -- A new grant (or the promotion).
    IF promoting THEN
        NULL;
    ELSIF in_line_ahead THEN
        -- Others are in line first (the row itself when none holds it).
        show_row := exclusive_live OR first_live.id IS NULL;
        shown_place := first_live;
        EXIT decision;
    ELSIF exclusive_live
          OR (capacity IS NOT NULL AND live_count >= capacity) THEN
        show_row := exclusive_live;
        shown_place := first_live;
        EXIT decision;
    ELSIF r.owner IS NOT NULL THEN
        previous := r.owner;  -- an expired exclusive grant taken over
        previous_token := r.token;
        previous_session := r.session_id;
        previous_expiry := r.expires_at;
    ELSIF capacity IS NOT NULL AND expired_count > 0
          AND live_count + expired_count >= capacity THEN
        SELECT h.owner, h.token, h.id, h.session_id, h.expires_at
        INTO previous, previous_token, taken_place, previous_session,
             previous_expiry
        FROM lock_holders AS h
        WHERE h.resource = p_resource AND h.expires_at <= v_now
        ORDER BY h.expires_at, h.id LIMIT 1;  -- the expired place taken over
    END IF;
    -- A new tenure: its token must be live, and no freeze over the resource.
    IF p_token IS NOT NULL AND p_token <> '' THEN
        -- Exclusive under a quota: the token's new grants count one at a time.
        IF counting AND NOT promoting THEN
            SELECT t.revoked_at, t.expires_at INTO t_revoked, t_expires
            FROM api_tokens AS t WHERE t.name = p_token FOR UPDATE;
        ELSE
            SELECT t.revoked_at, t.expires_at INTO t_revoked, t_expires
            FROM api_tokens AS t WHERE t.name = p_token FOR SHARE;
        END IF;
        IF t_revoked IS NOT NULL OR t_expires <= v_now THEN
            token_ended := true;
            EXIT decision;
        END IF;
    END IF;
    SELECT f.* INTO active_freeze FROM lock_freezes AS f
    WHERE f.prefix = substr(p_resource, 1, length(f.prefix))
      AND (f.ends_at IS NULL OR f.ends_at > v_now)
    ORDER BY f.prefix LIMIT 1;
    IF active_freeze.prefix IS NOT NULL THEN
        frozen_prefix := active_freeze.prefix;
        frozen_reason := active_freeze.reason;
        frozen_actor := active_freeze.actor;
        frozen_at := active_freeze.frozen_at;
        frozen_until := active_freeze.ends_at;
        EXIT decision;
    END IF;
    IF promoting THEN
        DELETE FROM lock_holders AS h WHERE h.resource = p_resource;
        UPDATE distributed_locks AS l
        SET owner = p_owner, token = p_token, fence = nextval('lock_fence_seq'),
            acquired_at = v_now, expires_at = v_now + make_interval(secs => p_ttl),
            holder_limit = 1, places_until = NULL, session_id = NULL
        WHERE l.id = r.id
        RETURNING l.fence, l.expires_at INTO fence, expires_at;
        done := true;
        action := 'acquired';
        previous := r.owner;
        -- The shared grant it ends (as places.py's mode_change writes it).
        v_details := format('{"from_fence": %s, "from_mode": %s}', mine.fence,
                            to_json(mine.mode)::text);
        mode := 'exclusive';
        token := p_token;
        holder_limit := 1;
        holders := 1;
        EXIT decision;
    END IF;
    IF counting AND (
        SELECT count(*) FROM (
            SELECT 1 FROM distributed_locks AS q
            WHERE q.token = p_token AND q.expires_at > v_now
            LIMIT p_max_locks
        ) AS live
    ) + (
        SELECT count(*) FROM (
            SELECT 1 FROM lock_holders AS h
            WHERE h.token = p_token AND h.expires_at > v_now
            LIMIT p_max_locks
        ) AS places
    ) >= p_max_locks THEN
        over_quota := true;
        EXIT decision;
    END IF;
    IF r.id IS NULL THEN
        -- The resource's first grant: its row, free (the grant fills it in
        -- below). A concurrent first grant's row came first: nothing written,
        -- nothing shown; the service tries again and finds that row.
        INSERT INTO distributed_locks AS l (resource, owner, token, fence,
                                            acquired_at, expires_at, holder_limit)
        VALUES (p_resource, NULL, NULL, 0, v_now, v_now, p_limit)
        ON CONFLICT (resource) DO NOTHING
        RETURNING l.* INTO r;
        IF r.id IS NULL THEN
            EXIT decision;
        END IF;
    END IF;
    IF expired_count > 0 THEN
        DELETE FROM lock_holders AS h
        WHERE h.resource = p_resource AND h.expires_at <= v_now;
    END IF;
    done := true;
    action := CASE WHEN previous IS NULL THEN 'acquired' ELSE 'took_over' END;
    new_fence := nextval('lock_fence_seq');
    fence := new_fence;
    IF p_mode = 'exclusive' AND p_limit = 1 THEN
        -- No place is live: the exclusive grant lives on the row.
        UPDATE distributed_locks AS l
        SET owner = p_owner, token = p_token, fence = new_fence, acquired_at = v_now,
            expires_at = v_now + make_interval(secs => p_ttl),
            holder_limit = 1, places_until = NULL, session_id = NULL
        WHERE l.id = r.id
        RETURNING l.expires_at INTO expires_at;
        previous := r.owner;
        previous_token := r.token;
        token := p_token;
        mode := 'exclusive';
        EXIT decision;
    END IF;
    new_expiry := v_now + make_interval(secs => p_ttl);
    INSERT INTO lock_holders (resource, owner, token, mode, fence, acquired_at,
                              expires_at, session_id)
    VALUES (p_resource, p_owner, mine_token, p_mode, new_fence, v_now, new_expiry,
            NULL);
    -- An expired exclusive grant taken over leaves the row (its expiry stays).
    UPDATE distributed_locks AS l
    SET owner = NULL,
        token = CASE WHEN r.owner IS NULL THEN l.token END,
        session_id = CASE WHEN r.owner IS NULL THEN l.session_id END,
        places_until = GREATEST(live_until, new_expiry), holder_limit = p_limit
    WHERE l.id = r.id;
    token := mine_token;
    expires_at := new_expiry;
    mode := p_mode;
    holder_limit := p_limit;
    holders := live_count + 1;
END decision;

now := v_now;
waiters := queued;
IF done THEN
    IF cleared IS NOT NULL THEN
        -- The expired places bound to a session that the grant cleared (but
        -- the one taken over, whose event says when it ran out; an exclusive
        -- grant on the row names the row's previous owner only) ran out at
        -- their session's expiry, their own: a ``released`` event each, as
        -- ``details.session_expiry_event`` writes, before the grant's.
        INSERT INTO lock_events (resource, action, owner, previous_owner, token,
                                 fence, acquired_at, expires_at, actor,
                                 occurred_at, mode, details)
        SELECT c.resource, 'released', c.owner, c.owner, NULLIF(c.token, ''),
               c.fence, c.acquired_at, c.expires_at, NULL, c.expires_at, c.mode,
               jsonb_build_object('session', c.session_id,
                                  'session_expired', true)::text
        FROM unnest(cleared) AS c
        WHERE NOT EXISTS (SELECT 1 FROM lock_holders AS h WHERE h.id = c.id)
          AND (c.id IS DISTINCT FROM taken_place
               OR (p_mode = 'exclusive' AND p_limit = 1))
        ORDER BY c.expires_at, c.id;
    END IF;
    IF action = 'took_over' AND previous IS NOT NULL THEN
        v_details := (jsonb_build_object(
            'previous_token', COALESCE(previous_token, ''))
            || CASE WHEN previous_session IS NULL THEN '{}'::jsonb
               ELSE jsonb_build_object(
                   'previous_expires_at',
                   to_char(previous_expiry AT TIME ZONE 'UTC',
                           'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'))
               END)::text;
    END IF;
    resource := p_resource;
    owner := p_owner;
    acquired_at := v_now;
    INSERT INTO lock_events (resource, action, owner, previous_owner, token, fence,
                             acquired_at, expires_at, actor, occurred_at, mode,
                             details)
    VALUES (p_resource, lockkeeper_acquire_place.action, p_owner, previous,
            NULLIF(p_token, ''), lockkeeper_acquire_place.fence, v_now,
            lockkeeper_acquire_place.expires_at, p_actor, v_now,
            lockkeeper_acquire_place.mode, v_details);
    IF dequeue AND p_waiter IS NOT NULL THEN
        DELETE FROM lock_waiters AS w WHERE w.id = p_waiter;
    END IF;
    RETURN NEXT;
    RETURN;
END IF;
IF show_row THEN
    -- No row yet (others in line for a resource with none): shown free.
    resource := p_resource;
    owner := r.owner;
    token := r.token;
    fence := COALESCE(r.fence, 0);
    acquired_at := COALESCE(r.acquired_at, v_now);
    expires_at := COALESCE(r.expires_at, v_now);
    mode := 'exclusive';
    holder_limit := COALESCE(r.holder_limit, p_limit);
    holders := shown_holders;
ELSIF shown_place.id IS NOT NULL THEN
    resource := shown_place.resource;
    owner := shown_place.owner;
    token := shown_place.token;
    fence := shown_place.fence;
    acquired_at := shown_place.acquired_at;
    expires_at := shown_place.expires_at;
    mode := shown_place.mode;
    holder_limit := shown_limit;
    holders := shown_holders;
END IF;
RETURN NEXT;
END
$function$
