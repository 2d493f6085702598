"""More than one holder, and sessions: one schema change for both.

- ``distributed_locks`` stays one row per resource, and the row an exclusive grant
  lives on, so the exclusive lock keeps its one-statement path. It gains
  ``holder_limit`` (how many holders the resource allows: 1 is the exclusive or
  read/write lock, N a counting semaphore), ``places_until`` (the latest expiry of
  the resource's rows in ``lock_holders``: while it is in the future the resource
  is held by places, and an exclusive grant of the row is refused) and
  ``session_id`` (the session the exclusive grant is bound to, if any).
- ``lock_holders``: one row per place of a semaphore or shared grant, each with
  its own (token, owner), mode, fence, times and session.
- ``lock_sessions``: a session belongs to its token; a bound grant's
  ``expires_at`` is moved with the session's by one heartbeat, so that column
  stays the single truth of every grant's expiry.
- ``lock_events`` gains ``mode`` (of the grant it records) and ``details`` (JSON:
  what a releasing worker reports, e.g. ``lockkeeper exec``'s exit status).

Additive: instances of the previous release never write the new columns (their
defaults are what such an instance means) and never read the new tables.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

from lockkeeper_core.columns import MYSQL_TABLE_ARGS, BigIntId, UTCDateTime, name_column

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None
oldest_code = "0009"

SESSION_ID_LENGTH = 64


def upgrade():
    with op.batch_alter_table("distributed_locks") as table:
        table.add_column(
            sa.Column("holder_limit", sa.Integer(), nullable=False, server_default="1")
        )
        table.add_column(sa.Column("places_until", UTCDateTime(), nullable=True))
        table.add_column(
            sa.Column("session_id", sa.String(SESSION_ID_LENGTH), nullable=True)
        )
    op.create_index(
        "ix_distributed_locks_session_id", "distributed_locks", ["session_id"]
    )
    op.create_table(
        "lock_holders",
        sa.Column("id", BigIntId, primary_key=True, autoincrement=True),
        sa.Column("resource", name_column(), nullable=False),
        sa.Column("owner", name_column(), nullable=False),
        sa.Column("token", name_column(80), nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("fence", sa.BigInteger(), nullable=False),
        sa.Column("acquired_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.Column("session_id", sa.String(SESSION_ID_LENGTH), nullable=True),
        sa.UniqueConstraint(
            "resource", "token", "owner", name="uq_lock_holders_resource_holder"
        ),
        **MYSQL_TABLE_ARGS,
    )
    op.create_index(
        "ix_lock_holders_resource_expires_at",
        "lock_holders",
        ["resource", "expires_at"],
    )
    op.create_index(
        "ix_lock_holders_token_expires_at", "lock_holders", ["token", "expires_at"]
    )
    op.create_index("ix_lock_holders_fence", "lock_holders", ["fence"])
    op.create_index("ix_lock_holders_session_id", "lock_holders", ["session_id"])
    op.create_table(
        "lock_sessions",
        sa.Column("id", sa.String(SESSION_ID_LENGTH), primary_key=True),
        sa.Column("owner", name_column(), nullable=False),
        sa.Column("token", name_column(80), nullable=False),
        sa.Column("ttl", sa.Float(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        **MYSQL_TABLE_ARGS,
    )
    op.create_index("ix_lock_sessions_token", "lock_sessions", ["token"])
    op.create_index("ix_lock_sessions_expires_at", "lock_sessions", ["expires_at"])
    with op.batch_alter_table("lock_events") as table:
        table.add_column(sa.Column("mode", sa.String(16), nullable=True))
        table.add_column(sa.Column("details", sa.Text(), nullable=True))


def downgrade():
    with op.batch_alter_table("lock_events") as table:
        table.drop_column("details")
        table.drop_column("mode")
    op.drop_index("ix_lock_sessions_expires_at", table_name="lock_sessions")
    op.drop_index("ix_lock_sessions_token", table_name="lock_sessions")
    op.drop_table("lock_sessions")
    op.drop_index("ix_lock_holders_session_id", table_name="lock_holders")
    op.drop_index("ix_lock_holders_fence", table_name="lock_holders")
    op.drop_index("ix_lock_holders_token_expires_at", table_name="lock_holders")
    op.drop_index("ix_lock_holders_resource_expires_at", table_name="lock_holders")
    op.drop_table("lock_holders")
    op.drop_index("ix_distributed_locks_session_id", table_name="distributed_locks")
    with op.batch_alter_table("distributed_locks") as table:
        table.drop_column("session_id")
        table.drop_column("places_until")
        table.drop_column("holder_limit")
