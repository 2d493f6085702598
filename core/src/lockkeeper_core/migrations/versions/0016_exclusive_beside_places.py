"""PostgreSQL: the exclusive lock beside semaphores and shared grants.

The acquire function refuses an exclusive grant of a row held by places (its
``places_until``, the latest expiry of the resource's ``lock_holders`` rows, is
in the future), and a new tenure sets ``holder_limit`` 1 and ``session_id``
NULL (a take-over never inherits the previous tenure's session, whose heartbeat
would extend someone else's lock). A token's quota counts its live places too.
Every event it writes says ``mode`` 'exclusive'. The answer gains
``holder_limit`` and ``places_until`` (so the service knows a refusal by
places, and asks the places path), so the function is dropped and created
again: ``CREATE OR REPLACE`` cannot change a function's result type.

Renew (with 0014's refusal of a grant bound to a live session) and release
write ``mode`` too, and a release clears ``session_id``: same signature and
answer, replaced in place.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-01
"""

from alembic import op

from lockkeeper_core.migrations.replaceable import install, routine_dialect

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None
oldest_code = "0016"

SIGNATURE = (
    "lockkeeper_acquire(varchar, varchar, varchar, double precision, varchar, "
    "integer, bigint, timestamptz)"
)


def upgrade():
    if routine_dialect() != "postgresql":
        return
    op.execute(f"DROP FUNCTION IF EXISTS {SIGNATURE}")
    install("0016", "lockkeeper_acquire", "lockkeeper_renew", "lockkeeper_release")


def downgrade():
    if routine_dialect() != "postgresql":
        return
    op.execute(f"DROP FUNCTION IF EXISTS {SIGNATURE}")
    install("0011", "lockkeeper_acquire")
    install("0014", "lockkeeper_renew")
    install("0007", "lockkeeper_release")
