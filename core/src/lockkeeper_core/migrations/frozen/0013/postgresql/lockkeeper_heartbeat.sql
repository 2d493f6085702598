-- lockkeeper_heartbeat, as migration 0013 installs it.
CREATE OR REPLACE FUNCTION lockkeeper_heartbeat(
    p_id varchar, p_token varchar, p_now timestamptz)
RETURNS TABLE (
    id varchar, owner varchar, token varchar, ttl double precision,
    created_at timestamptz, expires_at timestamptz, now timestamptz,
    done boolean, renewed bigint)
LANGUAGE plpgsql VOLATILE AS $function$
#variable_conflict use_column
DECLARE
    s lock_sessions%ROWTYPE;
    v_now timestamptz;
    v_until timestamptz;
    v_grants bigint;
    v_places bigint;
BEGIN
    SELECT * INTO s FROM lock_sessions AS ls
    WHERE ls.id = p_id AND ls.token = p_token
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    v_now := COALESCE(p_now, clock_timestamp());
    IF s.expires_at <= v_now THEN
        RETURN QUERY SELECT s.id, s.owner, s.token, s.ttl, s.created_at,
                            s.expires_at, v_now, false, 0::bigint;
        RETURN;
    END IF;
    v_until := v_now + make_interval(secs => s.ttl);
    UPDATE lock_sessions AS ls SET expires_at = v_until WHERE ls.id = s.id;
    -- The exclusive grants bound to it, and the places_until of the resources
    -- its places are on (before those places: the resource's row comes first).
    UPDATE distributed_locks AS l
    SET expires_at = CASE WHEN l.session_id = s.id AND l.owner = s.owner
                               AND l.token = s.token
                               AND l.expires_at = s.expires_at
                          THEN v_until ELSE l.expires_at END,
        places_until = CASE WHEN l.resource IN (
                                SELECT h.resource FROM lock_holders AS h
                                WHERE h.session_id = s.id AND h.token = s.token
                                  AND h.expires_at = s.expires_at)
                            THEN GREATEST(l.places_until, v_until)
                            ELSE l.places_until END
    WHERE (l.session_id = s.id AND l.owner = s.owner AND l.token = s.token
           AND l.expires_at = s.expires_at)
       OR l.resource IN (
            SELECT h.resource FROM lock_holders AS h
            WHERE h.session_id = s.id AND h.token = s.token
              AND h.expires_at = s.expires_at);
    SELECT count(*) INTO v_grants FROM distributed_locks AS l
    WHERE l.session_id = s.id AND l.owner = s.owner AND l.token = s.token
      AND l.expires_at = v_until;
    UPDATE lock_holders AS h SET expires_at = v_until
    WHERE h.session_id = s.id AND h.token = s.token
      AND h.expires_at = s.expires_at;
    GET DIAGNOSTICS v_places = ROW_COUNT;
    RETURN QUERY SELECT s.id, s.owner, s.token, s.ttl, s.created_at, v_until,
                        v_now, true, v_grants + v_places;
END
$function$
