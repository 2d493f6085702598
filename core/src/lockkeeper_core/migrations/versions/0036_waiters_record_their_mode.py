"""``lock_waiters`` records what each waiting acquire asked for: its mode and
its limit.

The dashboard's waiting line could say who waits but not for what: a writer
waiting behind readers, or a semaphore's place, read the same. The waiting
acquire now writes ``mode`` (exclusive or shared) and ``holder_limit`` (above 1:
a place of a semaphore of that limit) in the statement that enqueues it, and
the line reads them back.

Both columns are nullable with no default: code older than this revision
inserts its places without them and reads the table as before, and this code
shows such a place's mode as not recorded. No routine reads or writes them.
Added without rewriting the table (MariaDB ``INSTANT``; on PostgreSQL a
nullable column without a default is a change of the catalogue only; SQLite's
``ADD COLUMN``).

Revision ID: 0036
Revises: 0035
Create Date: 2026-12-07
"""

import sqlalchemy as sa
from alembic import op

revision = "0036"
down_revision = "0035"
branch_labels = None
depends_on = None
# Older code never names the new columns: its inserts leave them NULL, and its
# reads select the columns it knows.
oldest_code = "0016"

COLUMNS = (
    ("mode", "VARCHAR(16)", sa.String(16)),
    ("holder_limit", "INT", sa.Integer()),
)


def _mariadb() -> bool:
    dialect = op.get_bind().dialect
    return dialect.name == "mariadb" or getattr(dialect, "is_mariadb", False)


def upgrade():
    if _mariadb():
        added = ", ".join(
            f"ADD COLUMN IF NOT EXISTS {name} {sql} NULL" for name, sql, _ in COLUMNS
        )
        op.execute(f"ALTER TABLE lock_waiters {added}, ALGORITHM=INSTANT")
        return
    for name, _, kind in COLUMNS:
        op.add_column("lock_waiters", sa.Column(name, kind, nullable=True))


def downgrade():
    # SQLite's own DROP COLUMN (3.35): a batch copy of the table would lose its
    # AUTOINCREMENT, and with it the rule that a place's id is never reused.
    for name, _, _ in reversed(COLUMNS):
        if op.get_bind().dialect.name == "sqlite":
            op.execute(f"ALTER TABLE lock_waiters DROP COLUMN {name}")
        else:
            op.drop_column("lock_waiters", name)
