"""``schema_compatibility``: the oldest code each applied revision admits.

Every migration names the oldest code (by its head revision) that may run on
its schema (``oldest_code``); ``lockkeeper_core/migrations/env.py`` writes it here as each
migration is applied, in the migration's transaction. Code that does not know
the database's revision (a newer release migrated it) reads here whether it may
serve on it, and is not ready when it may not. No lock statement reads or
writes it: additive.

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

from lockkeeper_core.columns import MYSQL_TABLE_ARGS

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None
oldest_code = "0016"


def upgrade() -> None:
    op.create_table(
        "schema_compatibility",
        sa.Column("revision", sa.String(32), primary_key=True),
        sa.Column("oldest_code", sa.String(32), nullable=False),
        **MYSQL_TABLE_ARGS,
    )


def downgrade() -> None:
    op.drop_table("schema_compatibility")
