"""PostgreSQL and SQLite: an index in the natural order of lock names.

The overview's By name order is natural (``job:4100`` before ``job:20001``):
(the name without its trailing digits, how many digits, the name), the
expressions of ``lockkeeper_core.statements.listing.natural_order``. Without an index
of them every page sorted every lock (280 ms on PostgreSQL, 650 ms on SQLite at
100,000 locks); with it a page is read in order, as far as the page.

The expressions here are exactly those the listing's SQL renders (a planner
uses an expression index only for the same expression):
``tests/test_dashboard_find.py`` checks that the By name page is read from this
index on both databases.

MariaDB has no index on expressions (a generated column would be needed): its
natural order stays a sort.

Cost on the lock hot path: PostgreSQL writes every index of a row that a grant,
renewal or release updates (``expires_at`` is indexed, so those updates are
never HOT), so this is one more index entry per lock statement there; SQLite
updates only the indexes of changed columns, and a name never changes. The A/B
is in the commit that added this migration.

Under traffic: PostgreSQL builds it concurrently (``lockkeeper_core.migrations.online``).

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-03
"""

from alembic import op

from lockkeeper_core.migrations.online import create_index, drop_index

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None
oldest_code = "0016"

INDEX = "ix_distributed_locks_natural"
HEAD = "rtrim(resource, '0123456789')"


def _served() -> bool:
    return op.get_bind().dialect.name in ("postgresql", "sqlite")


def upgrade() -> None:
    if not _served():
        return
    create_index(
        INDEX,
        "distributed_locks",
        [HEAD, f"(length(resource) - length({HEAD}))", "resource"],
    )


def downgrade() -> None:
    if not _served():
        return
    drop_index(INDEX, "distributed_locks")
