"""PostgreSQL: a semaphore's place or a shared grant in one statement.

``lockkeeper_acquire_place`` makes the places path's whole decision
(``lockkeeper_core.statements.places``, ``acquire_place`` with no session) in the
database, in one round trip instead of a plain read and a transaction of ten
statements: the plain look that refuses a semaphore full of others without
locking anything, then the resource's row locked (inserted free when missing),
the clock read after that lock, the limit check, a holder's re-acquire,
promotion (a new tenure: refused as a new grant is) or demotion (their events'
details name the mode they had) (and the refusal of a plain re-acquire of a place bound to
a live session: ``bound_session`` names it, the service answers 409), the line
ahead, the places left, the token's row (revoked, expired; locked exclusively
under a quota, so the count after it is exact), the freeze, the quota, the
fence, the writes, ``places_until``, the event with its mode (whose trigger
notifies followers, migration 0010) and the waiter's row.

A session-bound acquire keeps its transaction (the session's row is locked
first, ``lockkeeper_core.sessions``). A new function: additive.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-02
"""

from alembic import op

from lockkeeper_core.migrations.replaceable import install, routine_dialect

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None
oldest_code = "0016"

SIGNATURE = (
    "lockkeeper_acquire_place(varchar, varchar, varchar, double precision, varchar,"
    " integer, bigint, timestamptz, integer, varchar)"
)


def upgrade():
    if routine_dialect() != "postgresql":
        return
    install("0021", "lockkeeper_acquire_place")


def downgrade():
    if routine_dialect() != "postgresql":
        return
    op.execute(f"DROP FUNCTION IF EXISTS {SIGNATURE}")
