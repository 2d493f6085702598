"""PostgreSQL: a session's heartbeat as one function, ``lockkeeper_heartbeat``.

One call renews the session and every grant bound to it. A function rather than
one data-modifying CTE: under READ COMMITTED a statement reads the snapshot it
started with, and a heartbeat that waited for the session's row behind a
session-bound acquire would not see the grant that acquire just committed (a
first insert is invisible to it), which would then keep its old expiry. In a
VOLATILE plpgsql function each statement takes a new snapshot: the ones after the
session's row lock see every grant committed before it, and no new one can
commit meanwhile (an acquire in the session holds that row ``FOR SHARE``).

Lock order as everywhere else: the session's row, then the resources' rows, then
their ``lock_holders`` rows.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01
"""

from alembic import op

from lockkeeper_core.migrations.replaceable import install, routine_dialect

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None
oldest_code = "0009"


def upgrade():
    if routine_dialect() != "postgresql":
        return
    install("0013", "lockkeeper_heartbeat")


def downgrade():
    if routine_dialect() != "postgresql":
        return
    op.execute(
        "DROP FUNCTION IF EXISTS lockkeeper_heartbeat(varchar, varchar, timestamptz)"
    )
