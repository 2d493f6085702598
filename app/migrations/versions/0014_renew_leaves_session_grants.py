"""PostgreSQL: ``lockkeeper_renew`` leaves a session-bound grant alone.

A grant bound to a session expires with it and is renewed by the session's
heartbeat only: renewed on its own, its expiry would leave the session's, and
the session's end and expiry would no longer cover it. Renew now refuses a row
bound to a live binding (its ``session_id`` names a session whose expiry is the
row's, same holder); the service then answers 409, "renew the session". A row
whose ``session_id`` outlived its binding (an earlier tenure's) renews as before.
The lookup is one primary-key probe, made only for a row with a ``session_id``.
Same signature and answer: replaced in place.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01
"""

import importlib

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_functions = importlib.import_module(
    "app.migrations.versions.0007_postgresql_lock_functions"
)

RENEW = _functions._OWNER_FUNCTION.format(
    operation="renew",
    parameters="p_resource varchar, p_owner varchar, p_token varchar, "
    "p_ttl double precision, p_actor varchar, p_now timestamptz",
    action="renewed",
    change="""
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
""",
)


def upgrade():
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(RENEW)


def downgrade():
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(_functions.RENEW)
