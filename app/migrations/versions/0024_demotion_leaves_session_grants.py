"""PostgreSQL: a plain demotion of one's own session-bound exclusive grant is
refused.

A demotion (exclusive to shared) is a re-acquire: without the session, it set
the shared grant's expiry to now + ttl and its session to none, so it cut a
session-bound grant loose from its session. Now it is refused as a plain
re-acquire of a bound grant is (0018 for the exclusive statement; 0021 for a
place): ``bound_session`` names the session and the service answers 409.
Acquiring through the session demotes it, still bound (that path is the
transaction, not this function). Same signature and answer as 0021: replaced
in place.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-03
"""

import importlib

from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

_PREVIOUS = importlib.import_module(
    "app.migrations.versions.0021_place_acquire_function"
)

# Where 0021 refuses a bound place; the same refusal for the exclusive grant
# the caller holds (a demotion, or an exclusive re-acquire) follows it.
_AFTER = """\
        IF bound_session IS NOT NULL THEN
            EXIT decision;
        END IF;
    END IF;
"""
_EXCLUSIVE_BOUND = """\
    IF mine.id IS NULL AND exclusive_mine AND r.session_id IS NOT NULL THEN
        SELECT s.id INTO bound_session FROM lock_sessions AS s
        WHERE s.id = r.session_id AND s.expires_at = r.expires_at
          AND s.token = r.token AND s.owner = r.owner;
        IF bound_session IS NOT NULL THEN
            EXIT decision;
        END IF;
    END IF;
"""


def _acquire_place() -> str:
    if _PREVIOUS.ACQUIRE_PLACE.count(_AFTER) != 1:
        raise RuntimeError("0021's lockkeeper_acquire_place is not the one expected")
    return _PREVIOUS.ACQUIRE_PLACE.replace(_AFTER, _AFTER + _EXCLUSIVE_BOUND)


def upgrade():
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(_acquire_place())


def downgrade():
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(_PREVIOUS.ACQUIRE_PLACE)
