"""A release carries what the releasing worker reports (``details``): stored with
its ``released`` event in the same statement.

``lockkeeper exec`` reports how its command ended (exit status, duration, host),
so the audit log and the lock page tell how the last run went. PostgreSQL gains
an overload of ``lockkeeper_release`` with ``p_details``; the five-argument
function of 0016 stays, so instances of the previous release keep working:
additive. SQLite and MariaDB write the column in their transaction.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-01
"""

from alembic import op

from lockkeeper_core.migrations.replaceable import install, routine_dialect

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None
oldest_code = "0016"

SIGNATURE = "lockkeeper_release(varchar, varchar, varchar, varchar, timestamptz, text)"


def upgrade():
    if routine_dialect() != "postgresql":
        return
    install("0017", "lockkeeper_release_with_details")


def downgrade():
    if routine_dialect() != "postgresql":
        return
    op.execute(f"DROP FUNCTION IF EXISTS {SIGNATURE}")
