-- lockkeeper_release_place, as migration 0022 installs it.
--
-- What renew_place and release_place answer: done false (with the clock) when
-- the caller holds no live place of the resource. Each locks the resource's row,
-- reads the clock after it, then the queue and the caller's live place (the one
-- that ends first, as the transaction's list has it).
CREATE OR REPLACE FUNCTION lockkeeper_release_place(
    p_resource varchar, p_owner varchar, p_token varchar, p_actor varchar,
    p_now timestamptz, p_details text)
RETURNS TABLE (
    done boolean, action text, resource varchar, owner varchar, token varchar,
    fence bigint, acquired_at timestamptz, expires_at timestamptz,
    now timestamptz, waiters bigint, holder_limit integer, mode varchar,
    holders integer, bound_session varchar)
LANGUAGE plpgsql VOLATILE AS $function$
#variable_conflict use_column
DECLARE
    v_now timestamptz;
    r distributed_locks%ROWTYPE;
    mine lock_holders%ROWTYPE;
    others integer;
    others_until timestamptz;
BEGIN


SELECT l.* INTO r FROM distributed_locks AS l
WHERE l.resource = p_resource FOR UPDATE;
v_now := COALESCE(p_now, clock_timestamp());
now := v_now;
done := false;
IF r.id IS NULL THEN
    RETURN NEXT;
    RETURN;
END IF;
SELECT h.* INTO mine FROM lock_holders AS h
WHERE h.resource = p_resource AND h.expires_at > v_now
  AND h.owner = p_owner AND h.token = COALESCE(p_token, '')
ORDER BY h.expires_at, h.id LIMIT 1;
IF mine.id IS NULL THEN
    RETURN NEXT;
    RETURN;
END IF;
SELECT count(*) INTO waiters FROM lock_waiters AS w
WHERE w.resource = p_resource AND w.deadline > v_now;
SELECT count(*), max(h.expires_at) INTO others, others_until
FROM lock_holders AS h
WHERE h.resource = p_resource AND h.expires_at > v_now AND h.id <> mine.id;
resource := mine.resource;
owner := mine.owner;
token := mine.token;
fence := mine.fence;
acquired_at := mine.acquired_at;
mode := mine.mode;
holder_limit := r.holder_limit;

DELETE FROM lock_holders AS h WHERE h.id = mine.id;
UPDATE distributed_locks AS l SET places_until = others_until WHERE l.id = r.id;
INSERT INTO lock_events (resource, action, owner, previous_owner, token, fence,
                         acquired_at, expires_at, actor, occurred_at, mode,
                         details)
VALUES (p_resource, 'released', mine.owner, p_owner, NULLIF(p_token, ''),
        mine.fence, mine.acquired_at, v_now, p_actor, v_now, mine.mode,
        p_details);
done := true;
action := 'released';
expires_at := v_now;
holders := others;
RETURN NEXT;
END
$function$
