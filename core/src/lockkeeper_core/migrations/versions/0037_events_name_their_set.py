"""Events name the set their grant belongs to: ``lock_events.set_id``.

A set's acquire writes one event per member, as a single acquire does; the
set's id on each (and on the renewals and releases of the set) lets the
history and the dashboard show the members together and an operator end the
set as one. NULL on every other event: a single grant, a freeze, the events
before sets.

The column is added without rewriting the table (PostgreSQL: a nullable
column with no default; MariaDB ``INSTANT``). Its index holds only the events
of sets where the database can say so (PostgreSQL and SQLite, partial): the
hot path's other events add no entry. MariaDB has no partial index: there
every event adds one entry (NULL) to it; the A/B is in the commit that added
this migration. Built under traffic (``lockkeeper_core.migrations.online``).

Revision ID: 0037
Revises: 0036
Create Date: 2026-12-07
"""

import sqlalchemy as sa
from alembic import op

from lockkeeper_core.migrations.online import create_index, drop_index
from lockkeeper_core.migrations.replaceable import routine_dialect

revision = "0037"
down_revision = "0036"
branch_labels = None
depends_on = None
# Older code writes no set id (NULL) and reads none.
oldest_code = "0016"

TABLE = "lock_events"
INDEX = "ix_lock_events_set_id_id"


def upgrade():
    if routine_dialect() == "mariadb":
        op.execute(
            f"ALTER TABLE {TABLE} ADD COLUMN IF NOT EXISTS set_id VARCHAR(32) NULL,"
            " ALGORITHM=INSTANT"
        )
        create_index(INDEX, TABLE, ["set_id", "id"])
    else:
        op.add_column(TABLE, sa.Column("set_id", sa.String(32), nullable=True))
        create_index(INDEX, TABLE, ["set_id", "id"], where="set_id IS NOT NULL")


def downgrade():
    drop_index(INDEX, TABLE)
    if routine_dialect() == "sqlite":
        with op.batch_alter_table(TABLE) as batch:
            batch.drop_column("set_id")
    else:
        op.drop_column(TABLE, "set_id")
