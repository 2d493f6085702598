"""SQLite: an index of each held lock's first prefix, its expiry and owner.

The overview's By prefix view counts the held locks per state (by
``expires_at``) in groups of their first prefix (``job:`` for ``job:4100``,
``lockkeeper_core.statements.listing.next_prefix`` under no prefix). SQLite has no
hash aggregate: it computed the prefix of every lock and sorted 100,000 of them
into a temporary b-tree (70 ms of the view's statement at 100,000 locks). Read
from this index the groups come in order, with their expiries: 33 ms.

The expression here is exactly the one the listing's SQL renders (a planner
uses an expression index only for the same expression); the index holds the
held locks only (``owner IS NOT NULL``), as the view counts. The owner is in it
for the view searched by owner: read in this order, each lock's row looked up
for its owner took 148 ms (47 ms sorted, before); from the index, 36 ms.
``tests/test_dashboard_find.py`` checks that By prefix is read from it.

PostgreSQL hashes the groups from a sequential scan (41 ms); from this index it
took 64 ms (an index scan: renewals keep its pages from being all-visible), so
it has none. MariaDB has no index on expressions.

Cost on the lock hot path (SQLite): a grant, a renewal and a release write one
more index entry (the held lock's expiry moves, or it stops being held). The
A/B is in the commit that added this migration.

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-05
"""

import sqlalchemy as sa
from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None
oldest_code = "0016"

INDEX = "ix_distributed_locks_prefix_expires_at"
FIRST_PREFIX = (
    "CASE WHEN (instr(resource, ':') > 0) "
    "THEN substr(resource, 1, instr(resource, ':')) END"
)


def _served() -> bool:
    return op.get_bind().dialect.name == "sqlite"


def upgrade() -> None:
    if not _served():
        return
    op.create_index(
        INDEX,
        "distributed_locks",
        [sa.text(f"({FIRST_PREFIX})"), sa.text("expires_at"), sa.text("owner")],
        sqlite_where=sa.text("owner IS NOT NULL"),
    )


def downgrade() -> None:
    if not _served():
        return
    op.drop_index(INDEX, table_name="distributed_locks")
