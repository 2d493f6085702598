"""The queue of acquires waiting for a lock (``"wait"`` on acquire).

One row per waiting request: ``id`` is the arrival order (never reused: SQLite
AUTOINCREMENT), ``deadline`` is when the request gives up, on the deciding clock,
so a row left behind by a killed app instance stops counting by itself.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

from lockkeeper_core.columns import MYSQL_TABLE_ARGS, BigIntId, UTCDateTime, name_column

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None
oldest_code = "0004"


def upgrade():
    op.create_table(
        "lock_waiters",
        sa.Column("id", BigIntId, primary_key=True, autoincrement=True),
        sa.Column("resource", name_column(), nullable=False),
        sa.Column("owner", name_column(), nullable=False),
        sa.Column("token", name_column(80), nullable=True),
        sa.Column("enqueued_at", UTCDateTime(), nullable=False),
        sa.Column("deadline", UTCDateTime(), nullable=False),
        sqlite_autoincrement=True,
        **MYSQL_TABLE_ARGS,
    )
    op.create_index("ix_lock_waiters_resource_id", "lock_waiters", ["resource", "id"])
    op.create_index("ix_lock_waiters_deadline", "lock_waiters", ["deadline"])


def downgrade():
    op.drop_index("ix_lock_waiters_deadline", table_name="lock_waiters")
    op.drop_index("ix_lock_waiters_resource_id", table_name="lock_waiters")
    op.drop_table("lock_waiters")
