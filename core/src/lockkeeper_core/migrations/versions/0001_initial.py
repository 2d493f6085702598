"""Locks, the audit log, the fence sequence, users and API tokens.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

from lockkeeper_core.columns import MYSQL_TABLE_ARGS, BigIntId, UTCDateTime, name_column

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None
oldest_code = "0001"


def upgrade():
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        counter = op.create_table(
            "lock_fence_counter",
            sa.Column("id", sa.Integer(), primary_key=True),
            sa.Column("value", sa.BigInteger(), nullable=False),
        )
        op.bulk_insert(counter, [{"id": 1, "value": 0}])
    elif bind.dialect.name == "postgresql":
        op.execute(sa.schema.CreateSequence(sa.Sequence("lock_fence_seq", start=1)))
    else:
        # MariaDB: INCREMENT BY 0 steps by the server's auto_increment_increment
        # (1 on one server), the only form with a cache a Galera cluster accepts
        # (each node draws at its own offset). Revision 0034 brings sequences
        # created before to it.
        op.execute("CREATE SEQUENCE lock_fence_seq START WITH 1 INCREMENT BY 0")

    op.create_table(
        "distributed_locks",
        sa.Column("id", BigIntId, primary_key=True, autoincrement=True),
        sa.Column("resource", name_column(), nullable=False),
        sa.Column("owner", name_column(), nullable=True),  # NULL: released
        sa.Column("fence", sa.BigInteger(), nullable=False),
        sa.Column("acquired_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.UniqueConstraint("resource", name="uq_distributed_locks_resource"),
        **MYSQL_TABLE_ARGS,
    )
    op.create_index(
        "ix_distributed_locks_expires_at", "distributed_locks", ["expires_at"]
    )
    op.create_index("ix_distributed_locks_owner", "distributed_locks", ["owner"])

    op.create_table(
        "lock_events",
        sa.Column("id", BigIntId, primary_key=True, autoincrement=True),
        sa.Column("resource", name_column(), nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("owner", name_column(), nullable=True),
        sa.Column("previous_owner", name_column(), nullable=True),
        sa.Column("fence", sa.BigInteger(), nullable=True),
        sa.Column("acquired_at", UTCDateTime(), nullable=True),
        sa.Column("expires_at", UTCDateTime(), nullable=True),
        sa.Column("actor", name_column(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("occurred_at", UTCDateTime(), nullable=False),
        sqlite_autoincrement=True,
        **MYSQL_TABLE_ARGS,
    )
    op.create_index("ix_lock_events_resource_id", "lock_events", ["resource", "id"])
    op.create_index("ix_lock_events_owner_id", "lock_events", ["owner", "id"])
    op.create_index("ix_lock_events_actor_id", "lock_events", ["actor", "id"])
    op.create_index("ix_lock_events_action_id", "lock_events", ["action", "id"])
    op.create_index("ix_lock_events_occurred_at", "lock_events", ["occurred_at"])

    op.create_table(
        "users",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("username", name_column(80), nullable=False, unique=True),
        sa.Column("password_hash", sa.String(255), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("failed_logins", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("locked_until", UTCDateTime(), nullable=True),
        **MYSQL_TABLE_ARGS,
    )
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", name_column(80), nullable=False, unique=True),
        sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("revoked_at", UTCDateTime(), nullable=True),
        **MYSQL_TABLE_ARGS,
    )


def downgrade():
    op.drop_table("api_tokens")
    op.drop_table("users")
    op.drop_table("lock_events")
    op.drop_table("distributed_locks")
    if op.get_bind().dialect.name == "sqlite":
        op.drop_table("lock_fence_counter")
    else:
        op.execute(sa.schema.DropSequence(sa.Sequence("lock_fence_seq")))
