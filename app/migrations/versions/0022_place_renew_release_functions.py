"""PostgreSQL: renewing or releasing a place in one statement.

A renewal or release of a semaphore's place or a shared grant first tries the
exclusive statement (``lockkeeper_renew``, ``lockkeeper_release``: the hot
path, unchanged), then the place: ``lockkeeper_renew_place`` and
``lockkeeper_release_place`` make that second step one statement instead of a
transaction of six (``app.locks.statements.places``, ``renew_place`` and
``release_place``, the same answers): the resource's row locked, the clock read
after that lock, the caller's live place, its new expiry (a place bound to a
live session is refused: ``bound_session`` names it) or its deletion, the row's
``places_until`` and the event. New functions: additive.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-02
"""

from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

SIGNATURES = (
    "lockkeeper_renew_place(varchar, varchar, varchar, double precision, varchar,"
    " timestamptz)",
    "lockkeeper_release_place(varchar, varchar, varchar, varchar, timestamptz, text)",
)

# What both answer: done false (with the clock) when the caller holds no live
# place of the resource.
RESULT = """
RETURNS TABLE (
    done boolean, action text, resource varchar, owner varchar, token varchar,
    fence bigint, acquired_at timestamptz, expires_at timestamptz,
    now timestamptz, waiters bigint, holder_limit integer, mode varchar,
    holders integer, bound_session varchar)
"""

# The resource's row locked, the clock after it, the queue and the caller's
# live place (the one that ends first, as the transaction's list has it).
FIND_MINE = """
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
"""

DECLARATIONS = """
LANGUAGE plpgsql VOLATILE AS $function$
#variable_conflict use_column
DECLARE
    v_now timestamptz;
    r distributed_locks%ROWTYPE;
    mine lock_holders%ROWTYPE;
    others integer;
    others_until timestamptz;
BEGIN
"""

RENEW_PLACE = f"""
CREATE OR REPLACE FUNCTION lockkeeper_renew_place(
    p_resource varchar, p_owner varchar, p_token varchar, p_ttl double precision,
    p_actor varchar, p_now timestamptz)
{RESULT}
{DECLARATIONS}
{FIND_MINE}
IF mine.session_id IS NOT NULL THEN
    -- Bound to a live session: only the session's heartbeat moves it.
    SELECT s.id INTO bound_session FROM lock_sessions AS s
    WHERE s.id = mine.session_id AND s.expires_at = mine.expires_at
      AND s.token = mine.token AND s.owner = mine.owner;
    IF bound_session IS NOT NULL THEN
        RETURN NEXT;
        RETURN;
    END IF;
END IF;
expires_at := v_now + make_interval(secs => p_ttl);
UPDATE lock_holders AS h SET expires_at = lockkeeper_renew_place.expires_at
WHERE h.id = mine.id;
UPDATE distributed_locks AS l
SET places_until = GREATEST(others_until, lockkeeper_renew_place.expires_at)
WHERE l.id = r.id;
INSERT INTO lock_events (resource, action, owner, previous_owner, token, fence,
                         acquired_at, expires_at, actor, occurred_at, mode)
VALUES (p_resource, 'renewed', mine.owner, p_owner, NULLIF(p_token, ''),
        mine.fence, mine.acquired_at, lockkeeper_renew_place.expires_at, p_actor,
        v_now, mine.mode);
done := true;
action := 'renewed';
holders := others + 1;
RETURN NEXT;
END
$function$
"""

RELEASE_PLACE = f"""
CREATE OR REPLACE FUNCTION lockkeeper_release_place(
    p_resource varchar, p_owner varchar, p_token varchar, p_actor varchar,
    p_now timestamptz, p_details text)
{RESULT}
{DECLARATIONS}
{FIND_MINE}
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
"""


def upgrade():
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(RENEW_PLACE)
    op.execute(RELEASE_PLACE)


def downgrade():
    if op.get_bind().dialect.name != "postgresql":
        return
    for signature in SIGNATURES:
        op.execute(f"DROP FUNCTION IF EXISTS {signature}")
