"""Server-side dashboard sessions, disabled users, login attempts per address.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

from lockkeeper_core.columns import MYSQL_TABLE_ARGS, BigIntId, UTCDateTime

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None
oldest_code = "0004"


def upgrade():
    with op.batch_alter_table("users") as batch:
        batch.add_column(sa.Column("disabled_at", UTCDateTime(), nullable=True))
    op.create_table(
        "user_sessions",
        sa.Column("id", BigIntId, primary_key=True, autoincrement=True),
        sa.Column(
            "user_id",
            sa.Integer(),
            sa.ForeignKey("users.id", ondelete="CASCADE", name="fk_user_sessions_user"),
            nullable=False,
        ),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.UniqueConstraint("token_hash", name="uq_user_sessions_token_hash"),
        **MYSQL_TABLE_ARGS,
    )
    op.create_index("ix_user_sessions_user_id", "user_sessions", ["user_id"])
    op.create_table(
        "login_address_windows",
        sa.Column("address", sa.String(64), primary_key=True),
        sa.Column("window_start", UTCDateTime(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        **MYSQL_TABLE_ARGS,
    )
    op.create_index(
        "ix_login_address_windows_window_start",
        "login_address_windows",
        ["window_start"],
    )


def downgrade():
    # Dropping a table drops its indexes; MariaDB refuses to drop the user_id index
    # first while the foreign key needs it.
    op.drop_table("login_address_windows")
    op.drop_table("user_sessions")
    with op.batch_alter_table("users") as batch:
        batch.drop_column("disabled_at")
