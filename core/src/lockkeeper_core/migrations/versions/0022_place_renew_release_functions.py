"""PostgreSQL: renewing or releasing a place in one statement.

A renewal or release of a semaphore's place or a shared grant first tries the
exclusive statement (``lockkeeper_renew``, ``lockkeeper_release``: the hot
path, unchanged), then the place: ``lockkeeper_renew_place`` and
``lockkeeper_release_place`` make that second step one statement instead of a
transaction of six (``lockkeeper_core.statements.places``, ``renew_place`` and
``release_place``, the same answers): the resource's row locked, the clock read
after that lock, the caller's live place, its new expiry (a place bound to a
live session is refused: ``bound_session`` names it) or its deletion, the row's
``places_until`` and the event. New functions: additive.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-02
"""

from alembic import op

from lockkeeper_core.migrations.replaceable import install, routine_dialect

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None
oldest_code = "0016"

SIGNATURES = (
    "lockkeeper_renew_place(varchar, varchar, varchar, double precision, varchar,"
    " timestamptz)",
    "lockkeeper_release_place(varchar, varchar, varchar, varchar, timestamptz, text)",
)


def upgrade():
    if routine_dialect() != "postgresql":
        return
    install("0022", "lockkeeper_renew_place", "lockkeeper_release_place")


def downgrade():
    if routine_dialect() != "postgresql":
        return
    for signature in SIGNATURES:
        op.execute(f"DROP FUNCTION IF EXISTS {signature}")
