-- lockkeeper_acquire_set, as migration 0043 installs it.
CREATE OR REPLACE FUNCTION lockkeeper_acquire_set(
    p_resources varchar[], p_limits integer[], p_modes varchar[],
    p_waiters bigint[], p_owner varchar, p_token varchar,
    p_ttl double precision, p_actor varchar, p_max_locks integer,
    p_now timestamptz, p_set_id varchar)
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
    locked integer;
    g record;
BEGIN
-- The set's acquire in one statement: every member granted, each by
-- lockkeeper_acquire_place (its fence, its event, its place in line left),
-- its event naming the set; or an error that rolls the whole statement back
-- (nothing written), on which the caller decides the set again by its
-- transaction of statements, whose refusal names the member and why.
--
-- The lock order (``lockkeeper_core.sets``): the members' rows at once, in
-- ``ORDER BY resource`` (the caller names them sorted), then, within each
-- member's grant, the token's row and the places. A member with no row
-- yet: LKS01, the caller makes the rows one by one and asks again.
PERFORM 1 FROM distributed_locks AS l
WHERE l.resource = ANY (p_resources) ORDER BY l.resource FOR UPDATE;
GET DIAGNOSTICS locked = ROW_COUNT;
IF locked < cardinality(p_resources) THEN
    RAISE EXCEPTION 'a member of the set has no row yet' USING ERRCODE = 'LKS01';
END IF;
-- One clock for every member, once the rows are held.
v_now := COALESCE(p_now, clock_timestamp());
FOR i IN 1 .. cardinality(p_resources) LOOP
    SELECT * INTO g FROM lockkeeper_acquire_place(
        p_resources[i], p_owner, p_token, p_ttl, p_actor, p_max_locks,
        p_waiters[i], v_now, p_limits[i], p_modes[i]) AS a;
    IF NOT g.done THEN
        RAISE EXCEPTION 'the set''s member % was refused', p_resources[i]
            USING ERRCODE = 'LKS02';
    END IF;
    -- The grant's event, just written under the member's row lock: the
    -- newest event of its resource (one step back along its (resource, id)
    -- index) when it carries the grant's fence. Asked for the newest of the
    -- resource and fence at once, the planner reads every event of the
    -- resource (a bitmap scan, the fence filtered row by row), so a busy
    -- resource's grant cost grew with its history.
    UPDATE lock_events AS e SET set_id = p_set_id
    WHERE e.id = (SELECT max(x.id) FROM lock_events AS x
                  WHERE x.resource = p_resources[i])
      AND e.fence = g.fence;
    IF NOT FOUND THEN
        -- Its newest event is another's (a freeze names its prefix as its
        -- resource and is written under no row lock): the grant's own, by
        -- its fence.
        UPDATE lock_events AS e SET set_id = p_set_id
        WHERE e.id = (SELECT max(x.id) FROM lock_events AS x
                      WHERE x.resource = p_resources[i] AND x.fence = g.fence);
    END IF;
    done := g.done;
    action := g.action;
    resource := g.resource;
    owner := g.owner;
    token := g.token;
    fence := g.fence;
    acquired_at := g.acquired_at;
    expires_at := g.expires_at;
    now := g.now;
    waiters := g.waiters;
    over_quota := g.over_quota;
    frozen_prefix := g.frozen_prefix;
    frozen_reason := g.frozen_reason;
    frozen_actor := g.frozen_actor;
    frozen_at := g.frozen_at;
    frozen_until := g.frozen_until;
    token_ended := g.token_ended;
    holder_limit := g.holder_limit;
    mode := g.mode;
    holders := g.holders;
    limit_mismatch := g.limit_mismatch;
    bound_session := g.bound_session;
    RETURN NEXT;
END LOOP;
END
$function$
