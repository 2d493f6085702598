-- lockkeeper_release_set, as migration 0043 installs it.
CREATE OR REPLACE FUNCTION lockkeeper_release_set(
    p_resources varchar[], p_owner varchar, p_token varchar, p_actor varchar,
    p_now timestamptz)
RETURNS TABLE (
    done boolean, action text, resource varchar, owner varchar, token varchar,
    fence bigint, acquired_at timestamptz, expires_at timestamptz,
    now timestamptz, waiters bigint, holder_limit integer, mode varchar,
    holders integer)
LANGUAGE plpgsql VOLATILE AS $function$
#variable_conflict use_column
DECLARE
    x record;
    h record;
    v_set varchar;
BEGIN
-- A set's release in one statement: each member still validly held by
-- (p_token, p_owner) ended as a single release ends it (lockkeeper_release,
-- else, when the row carries no live exclusive grant, the caller's holder by
-- lockkeeper_release_place: its event, its waiters counted), and the set
-- its grant was made by named on the event that ends it. One row per member
-- released; a member not held answers none.
--
-- The lock order (``lockkeeper_core.sets``): the members' rows at once, in
-- ``ORDER BY resource`` (as lockkeeper_acquire_set takes them), then within
-- each member's release its holders and its line.
PERFORM 1 FROM distributed_locks AS l
WHERE l.resource = ANY (p_resources) ORDER BY l.resource FOR UPDATE;
FOR i IN 1 .. cardinality(p_resources) LOOP
    SELECT * INTO x FROM lockkeeper_release(
        p_resources[i], p_owner, p_token, p_actor, p_now, NULL::text) AS r;
    holder_limit := NULL;
    mode := NULL;
    holders := NULL;
    IF x.done IS NOT TRUE THEN
        -- No row (no answer), or a live exclusive grant that is not ours:
        -- nothing of ours to end.
        IF x.resource IS NULL
           OR (x.owner IS NOT NULL AND x.expires_at > x.now) THEN
            CONTINUE;
        END IF;
        SELECT * INTO h FROM lockkeeper_release_place(
            p_resources[i], p_owner, p_token, p_actor, p_now, NULL::text) AS r;
        IF NOT h.done THEN
            CONTINUE;
        END IF;
        x := h;
        holder_limit := h.holder_limit;
        mode := h.mode;
        holders := h.holders;
    END IF;
    -- The set the grant was made by: its grant event's, written at its
    -- acquired_at (read through the events' time index: the name is
    -- compared as an expression, as ``set_names`` reads it), named on the
    -- event just written under the member's row lock: the newest event of
    -- its resource when it carries the grant's fence (as
    -- lockkeeper_acquire_set finds its grant's event, and why), else, a
    -- freeze's event being newer, the newest of its resource and fence.
    v_set := NULL;
    SELECT e.set_id INTO v_set FROM lock_events AS e
    WHERE e.occurred_at = x.acquired_at AND e.resource || '' = x.resource
      AND e.fence = x.fence
      AND e.action IN ('acquired', 'took_over', 'reacquired')
    ORDER BY e.id DESC LIMIT 1;
    IF v_set IS NOT NULL THEN
        UPDATE lock_events AS e SET set_id = v_set
        WHERE e.id = (SELECT max(y.id) FROM lock_events AS y
                      WHERE y.resource = x.resource)
          AND e.fence = x.fence;
        IF NOT FOUND THEN
            UPDATE lock_events AS e SET set_id = v_set
            WHERE e.id = (SELECT max(y.id) FROM lock_events AS y
                          WHERE y.resource = x.resource AND y.fence = x.fence);
        END IF;
    END IF;
    done := true;
    action := x.action;
    resource := x.resource;
    owner := x.owner;
    token := x.token;
    fence := x.fence;
    acquired_at := x.acquired_at;
    expires_at := x.expires_at;
    now := x.now;
    waiters := x.waiters;
    RETURN NEXT;
END LOOP;
END
$function$
