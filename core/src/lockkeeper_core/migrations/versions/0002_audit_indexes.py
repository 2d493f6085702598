"""Prefix searches that use an index on PostgreSQL.

PostgreSQL can only turn ``resource LIKE 'job:42%'`` into an index range scan on a
``text_pattern_ops`` index (or a database whose collation is exactly "C"); the
default b-tree indexes of 0001 are then never used, and a rare prefix scanned the
whole audit log (160 ms on 1 000 000 events, see docs/benchmarks-audit.md).
MariaDB (utf8mb4_bin columns) already range-scans ``LIKE 'prefix%'``; SQLite's LIKE
is case-insensitive and cannot use a BINARY index whatever we add.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None
oldest_code = "0001"


def upgrade():
    if op.get_bind().dialect.name != "postgresql":
        return
    op.create_index(
        "ix_lock_events_resource_pattern",
        "lock_events",
        ["resource", "id"],
        postgresql_ops={"resource": "text_pattern_ops"},
    )
    op.create_index(
        "ix_distributed_locks_resource_pattern",
        "distributed_locks",
        ["resource"],
        postgresql_ops={"resource": "text_pattern_ops"},
    )


def downgrade():
    if op.get_bind().dialect.name != "postgresql":
        return
    op.drop_index("ix_distributed_locks_resource_pattern", "distributed_locks")
    op.drop_index("ix_lock_events_resource_pattern", "lock_events")
