"""On a Galera node the fence sequence has no cache: every draw is written, and
replicated with the grant that drew it.

With a cache (0034 kept MariaDB's 1000) each node hands out values from a
block it reserved, and only a reservation writes the sequence's row. A node
still drawing from an older block hands out values below those another node
drew from a newer one: with several nodes writing, fences of one resource
could go backwards (places, shared and session-bound grants take the draw
as it is). Without a cache every ``NEXTVAL`` writes the row: the grant's
writeset carries it, a node that applied a grant (which it has before its
locking read of that resource returns: ``wsrep_sync_wait``) draws above it,
and the fences of a resource increase in the order the cluster commits its
grants, whichever node grants them. MariaDB itself supports sequences on
Galera only so (MDEV-27862).

Off Galera nothing changes (one server's cache hands out increasing values,
and the hot path keeps it). A database migrated off Galera and then served
from a cluster keeps its cache: the server refuses to start on a Galera node
with a cached sequence and says what to run (``app.ops.galera``).

``ALTER SEQUENCE`` without ``RESTART`` keeps the sequence's next value, the
first not handed out to any node's cache: no fence is drawn twice. On Galera
it runs in total order on every node; a grant in flight that it aborts fails
with 1213 and is retried.

Revision ID: 0038
Revises: 0037
Create Date: 2026-12-07
"""

from alembic import op

revision = "0038"
down_revision = "0037"
branch_labels = None
depends_on = None
# The code reads nothing new: any code that ran on 0037 draws fences the same.
oldest_code = "0016"


def _galera() -> bool:
    bind = op.get_bind()
    dialect = bind.dialect
    if not (dialect.name == "mariadb" or getattr(dialect, "is_mariadb", False)):
        return False
    row = bind.exec_driver_sql("SHOW VARIABLES LIKE 'wsrep_on'").first()
    return row is not None and str(row[1]).upper() == "ON"


def upgrade():
    if _galera():
        op.execute("ALTER SEQUENCE lock_fence_seq NOCACHE")


def downgrade():
    # A cache is what Galera's nodes cannot order across writers: the sequence
    # stays without one (0037's code draws from it the same).
    pass
