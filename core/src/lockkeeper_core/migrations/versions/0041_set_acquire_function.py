"""PostgreSQL: a set's acquire in one statement.

A set's acquire was a transaction of a statement per step: the members' rows
locked in the lock order, the clock, the token's row, each member's
``lockkeeper_acquire_place``, then the naming of the set on the members'
events (seven statements for a set of three, and its BEGIN and COMMIT).
``lockkeeper_acquire_set`` takes the same steps in the database, in the same
order: the members' rows at once in ``ORDER BY resource``, one clock for
every member, each member's ``lockkeeper_acquire_place`` (its token's row,
places, fence, event, its place in line left), and the set's id on the
grant's event. Any member refused, or a member with no row yet, raises: the
statement rolls back whole, writing nothing, and the code decides the set
again by its transaction, whose refusal names the member and why.

A new function that only this code calls: additive.

Revision ID: 0041
Revises: 0040
Create Date: 2026-12-07
"""

from alembic import op

from lockkeeper_core.migrations.replaceable import install, routine_dialect

revision = "0041"
down_revision = "0040"
branch_labels = None
depends_on = None
# A new function that only this code calls; older code runs as before.
oldest_code = "0016"

SIGNATURE = (
    "lockkeeper_acquire_set(varchar[], integer[], varchar[], bigint[], varchar,"
    " varchar, double precision, varchar, integer, timestamptz, varchar)"
)


def upgrade():
    if routine_dialect() != "postgresql":
        return
    install("0041", "lockkeeper_acquire_set")


def downgrade():
    if routine_dialect() != "postgresql":
        return
    op.execute(f"DROP FUNCTION IF EXISTS {SIGNATURE}")
