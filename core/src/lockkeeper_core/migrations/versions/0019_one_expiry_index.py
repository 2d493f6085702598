"""Drop ``ix_distributed_locks_expires_at``: 0015's (expires_at, resource) covers it.

Every statement that grants, renews or releases a lock moves its ``expires_at``,
and so writes every index holding that column. The single-column index is a
prefix of ``ix_distributed_locks_expires_at_resource``, which serves every read
it served (ranges and orders on expiry), so it was one index write per
statement for nothing.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-01
"""

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None
oldest_code = "0016"


def upgrade() -> None:
    op.drop_index("ix_distributed_locks_expires_at", table_name="distributed_locks")


def downgrade() -> None:
    op.create_index(
        "ix_distributed_locks_expires_at", "distributed_locks", ["expires_at"]
    )
