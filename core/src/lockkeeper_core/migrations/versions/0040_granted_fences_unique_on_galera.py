"""On a Galera node a fence is granted once: ``lock_events`` keeps the fences of
its grant events in a unique index, so two nodes granting the same fence
conflict.

Each node draws fences at its own offset (``auto_increment_offset`` of
``auto_increment_increment``, ``INCREMENT BY 0``), which Galera sets anew on
each node when one leaves or joins; and certification does not compare the
sequence's writes (threads on three nodes drawing at once are never aborted for
them). For a moment two nodes can draw at offsets of different cluster sizes
and hand out the same value: a 10-minute multi-writer fault run granted fence
525 to a place of one resource and an exclusive grant of another around a
node's rejoin. Every grant writes its event in its own transaction, and a
unique key is what certification compares: of two grants of one fence
committed on two nodes at once, the one the cluster orders second fails with
1213; one on a node that has applied the other's event fails with 1062. Lock
operations retry both (a new draw), as they retry a deadlock.

``granted_fence`` is a virtual column: the fence of an event that grants it
(acquired, took over, claimed, force-claimed; a re-acquire, a renewal or a
release names the grant's fence again), NULL otherwise, and no event insert
names it. Virtual, it is added without rewriting the table, and only the
index holds its values. The index builds in place; on Galera a DDL runs on
every node at the same point of the cluster's order (TOI): writes to the
table wait for the build on every node, so a large event log is best pruned
first. Its writes are retried like a lock's (1213).

A log written by several nodes before may hold a fence granted twice: the
index covers the fences above the largest such one (every later draw is
above it), and the events keep what they recorded.

Off Galera nothing changes (one server draws from one sequence, and the hot
path writes no extra index). A database migrated off Galera and then served
from a cluster has no index: the server refuses to start on a Galera node
without it and says what to run (``app.ops.galera``).

Revision ID: 0040
Revises: 0039
Create Date: 2026-12-07
"""

from alembic import op
from sqlalchemy.exc import IntegrityError

revision = "0040"
down_revision = "0039"
branch_labels = None
depends_on = None
# A virtual column no code names, and an index: older code writes its events
# as before.
oldest_code = "0016"

TABLE = "lock_events"
COLUMN = "granted_fence"
INDEX = "uq_lock_events_granted_fence"
GRANTS = "('acquired', 'took_over', 'claimed', 'force_claimed')"
DUPLICATE_KEY = 1062


def _galera() -> bool:
    bind = op.get_bind()
    dialect = bind.dialect
    if not (dialect.name == "mariadb" or getattr(dialect, "is_mariadb", False)):
        return False
    row = bind.exec_driver_sql("SHOW VARIABLES LIKE 'wsrep_on'").first()
    return row is not None and str(row[1]).upper() == "ON"


def _largest_fence_granted_twice() -> int:
    return int(
        op.get_bind()
        .exec_driver_sql(
            f"SELECT COALESCE(MAX(fence), 0) FROM (SELECT fence FROM {TABLE}"
            f" WHERE action IN {GRANTS} GROUP BY fence HAVING COUNT(*) > 1) twice"
        )
        .scalar()
    )


def _granted_fence(above: int) -> str:
    return (
        f"BIGINT AS (CASE WHEN action IN {GRANTS} AND fence > {above}"
        " THEN fence END) VIRTUAL"
    )


def upgrade():
    if not _galera():
        return
    op.execute(
        f"ALTER TABLE {TABLE} ADD COLUMN IF NOT EXISTS {COLUMN}"
        f" {_granted_fence(_largest_fence_granted_twice())}, ALGORITHM=INSTANT"
    )
    # A fence granted twice by nodes still on older code while this runs fails
    # the build (1062): the column then starts above it, and the build again.
    for attempt in range(3):
        try:
            op.execute(
                f"ALTER TABLE {TABLE} ADD UNIQUE INDEX IF NOT EXISTS {INDEX}"
                f" ({COLUMN}), ALGORITHM=INPLACE, LOCK=NONE"
            )
            return
        except IntegrityError as exc:
            if exc.orig.args[0] != DUPLICATE_KEY or attempt == 2:
                raise
        op.execute(
            f"ALTER TABLE {TABLE} MODIFY COLUMN {COLUMN}"
            f" {_granted_fence(_largest_fence_granted_twice())}"
        )


def downgrade():
    if not _galera():
        return
    op.execute(
        f"ALTER TABLE {TABLE} DROP INDEX IF EXISTS {INDEX},"
        " ALGORITHM=INPLACE, LOCK=NONE"
    )
    op.execute(f"ALTER TABLE {TABLE} DROP COLUMN IF EXISTS {COLUMN}")
