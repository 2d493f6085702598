"""On a Galera node the guard writes the grant's row, so certification orders a
guarded transaction against a take-over committed on another node.

``lockkeeper_guard`` held the resource's row shared until the caller's
transaction ended: on one server a take-over waits for that lock. On Galera row
locks are local to a node and certification compares only the keys a
transaction writes: a take-over committed on another node did not wait, and a
guarded transaction that committed before its own node had applied the
take-over passed certification (it wrote no key the take-over wrote) and
committed after it. On a node with ``wsrep_on`` the guard now adds one to the
grant's ``guard_writes`` (the resource's row for the exclusive grant, the
place's row for a shared grant or a place): both transactions write the row,
and whichever the cluster orders second fails at COMMIT with 1213. Off Galera
it writes nothing, as before.

``guard_writes`` counts the guarded transactions a grant's row saw on Galera;
nothing reads it. Added without rewriting the tables (MariaDB ``INSTANT``,
PostgreSQL's constant default).

Revision ID: 0035
Revises: 0034
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

from lockkeeper_core.migrations.replaceable import install, routine_dialect

revision = "0035"
down_revision = "0034"
branch_labels = None
depends_on = None
# The code reads no new column; older code inserts rows that take the default.
oldest_code = "0016"

TABLES = ("distributed_locks", "lock_holders")


def upgrade():
    dialect = routine_dialect()
    for table in TABLES:
        if dialect == "mariadb":
            op.execute(
                f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS guard_writes"
                " BIGINT NOT NULL DEFAULT 0, ALGORITHM=INSTANT"
            )
        else:
            op.add_column(
                table,
                sa.Column(
                    "guard_writes", sa.BigInteger(), nullable=False, server_default="0"
                ),
            )
    if dialect == "mariadb":
        install("0035", "lockkeeper_guard")


def downgrade():
    dialect = routine_dialect()
    if dialect == "mariadb":
        install("0030", "lockkeeper_guard")
    for table in TABLES:
        if dialect == "sqlite":
            with op.batch_alter_table(table) as batch:
                batch.drop_column("guard_writes")
        else:
            op.drop_column(table, "guard_writes")
