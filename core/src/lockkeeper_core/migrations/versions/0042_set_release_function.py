"""PostgreSQL: a set's release in one statement.

A set's release was a transaction of a statement per step: each member's
``lockkeeper_release`` (and, where the row carried no live exclusive grant,
its ``lockkeeper_release_place``), then the naming of the set on the events
that end its grants (four statements for a set of three exclusive locks, and
its BEGIN and COMMIT). ``lockkeeper_release_set`` takes the same steps in the
database: the members' rows locked at once in ``ORDER BY resource`` (as
``lockkeeper_acquire_set`` locks them), each member's release by the same two
functions, and the set its grant was made by named on the event that ends it.

A new function that only this code calls: additive.

Revision ID: 0042
Revises: 0041
Create Date: 2026-12-07
"""

from alembic import op

from lockkeeper_core.migrations.replaceable import install, routine_dialect

revision = "0042"
down_revision = "0041"
branch_labels = None
depends_on = None
# A new function that only this code calls; older code runs as before.
oldest_code = "0016"

SIGNATURE = "lockkeeper_release_set(varchar[], varchar, varchar, varchar, timestamptz)"


def upgrade():
    if routine_dialect() != "postgresql":
        return
    install("0042", "lockkeeper_release_set")


def downgrade():
    if routine_dialect() != "postgresql":
        return
    op.execute(f"DROP FUNCTION IF EXISTS {SIGNATURE}")
