"""Freezes: no new grants under a resource prefix while one lasts.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

from lockkeeper_core.columns import MYSQL_TABLE_ARGS, BigIntId, UTCDateTime, name_column

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None
oldest_code = "0004"


def upgrade():
    op.create_table(
        "lock_freezes",
        sa.Column("id", BigIntId, primary_key=True, autoincrement=True),
        sa.Column("prefix", name_column(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("actor", name_column(), nullable=False),
        sa.Column("frozen_at", UTCDateTime(), nullable=False),
        sa.Column("ends_at", UTCDateTime(), nullable=True),
        sa.UniqueConstraint("prefix", name="uq_lock_freezes_prefix"),
        **MYSQL_TABLE_ARGS,
    )


def downgrade():
    op.drop_table("lock_freezes")
