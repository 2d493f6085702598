"""The token that holds a lock; token scopes, read-only tokens, expiry and quotas.

``distributed_locks.token``: the name of the API token that holds the lock, ``''``
for an operator's claim bound to no token, NULL for a grant made before tokens
were recorded (any token with the owner may still renew or release it) or a free
row. The index serves the per-token quota count (live locks of one token).

``lock_events.token``: the token the change was made for (an operator's claim
names it; a worker's own change repeats its actor).

``api_tokens``: ``prefixes`` (newline-separated, NULL: every resource),
``read_only``, ``expires_at`` (NULL: never), ``max_locks`` (NULL: no limit).
Tokens that exist keep full scope, no expiry and no quota.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

from lockkeeper_core.columns import UTCDateTime, name_column

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None
oldest_code = "0003"


def upgrade():
    with op.batch_alter_table("distributed_locks") as batch:
        batch.add_column(sa.Column("token", name_column(80), nullable=True))
        batch.create_index(
            "ix_distributed_locks_token_expires_at", ["token", "expires_at"]
        )
    with op.batch_alter_table("lock_events") as batch:
        batch.add_column(sa.Column("token", name_column(80), nullable=True))
    with op.batch_alter_table("api_tokens") as batch:
        batch.add_column(sa.Column("prefixes", sa.Text(), nullable=True))
        batch.add_column(
            sa.Column(
                "read_only", sa.Boolean(), nullable=False, server_default=sa.false()
            )
        )
        batch.add_column(sa.Column("expires_at", UTCDateTime(), nullable=True))
        batch.add_column(sa.Column("max_locks", sa.Integer(), nullable=True))


def downgrade():
    with op.batch_alter_table("api_tokens") as batch:
        batch.drop_column("max_locks")
        batch.drop_column("expires_at")
        batch.drop_column("read_only")
        batch.drop_column("prefixes")
    with op.batch_alter_table("lock_events") as batch:
        batch.drop_column("token")
    with op.batch_alter_table("distributed_locks") as batch:
        batch.drop_index("ix_distributed_locks_token_expires_at")
        batch.drop_column("token")
