"""The charts' counts per closed bucket, and refused acquires per minute.

``activity_samples`` (locks per state at a past moment of the charts' grid) and
``activity_events`` (events per action in a closed bucket) are filled by the
drawers as they read: a closed bucket never changes, so each is counted once and
a drawing of a day or a week counts only its open bucket. ``activity_refusals``
holds refused acquires per minute and outcome (refused, 423, 429), added by each
server process from its in-memory counts every few seconds. No lock statement
writes any of them: additive.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

from lockkeeper_core.columns import MYSQL_TABLE_ARGS, UTCDateTime

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None
oldest_code = "0016"


def upgrade() -> None:
    op.create_table(
        "activity_samples",
        sa.Column("within_ms", sa.Integer(), primary_key=True),
        sa.Column("at", UTCDateTime(), primary_key=True),
        sa.Column("held", sa.Integer(), nullable=False),
        sa.Column("expiring", sa.Integer(), nullable=False),
        sa.Column("stale", sa.Integer(), nullable=False),
        **MYSQL_TABLE_ARGS,
    )
    op.create_table(
        "activity_events",
        sa.Column("step_seconds", sa.Integer(), primary_key=True),
        sa.Column("starts_at", UTCDateTime(), primary_key=True),
        sa.Column("action", sa.String(32), primary_key=True),
        sa.Column("events", sa.Integer(), nullable=False),
        **MYSQL_TABLE_ARGS,
    )
    op.create_table(
        "activity_refusals",
        sa.Column("starts_at", UTCDateTime(), primary_key=True),
        sa.Column("outcome", sa.String(16), primary_key=True),
        sa.Column("refused", sa.Integer(), nullable=False),
        **MYSQL_TABLE_ARGS,
    )


def downgrade() -> None:
    op.drop_table("activity_refusals")
    op.drop_table("activity_events")
    op.drop_table("activity_samples")
