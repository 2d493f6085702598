"""The guard passes any live grant's fence, and refuses holding nothing.

``lockkeeper_guard`` knew only the exclusive grant on the resource's row: the
fence of a shared grant or of a semaphore's place (a row of ``lock_holders``)
was refused as lost, so those holders could never write through it. It now
passes the fence of any live grant of the resource, exclusive, shared or a
place, and holds the resource's row shared as before: every change of a
resource's places takes that row first (the lock order,
``lockkeeper_core.statements``), so none can end or replace the guarded place
before the caller's transaction ends either.

It locked the row before it looked, so a refused fence kept the row locked
until the caller's transaction ended: on MariaDB a failed ``CALL`` does not
end the transaction, and the holder's renew waited behind a stranger's
mistake. It now looks first with a plain read and locks the row only for a
fence that read finds live, then looks again under the lock (a change
committed in between is refused, as before). Under READ COMMITTED a plain read
sees the latest committed rows. Under a stricter isolation it sees the
transaction's snapshot, which may be older than the grant: a fence newer than
any the snapshot knows for the resource fails on PostgreSQL with 40001 (as a
locking read of a row changed since the snapshot did), holding nothing; on
MariaDB, whose locking reads see the latest rows whatever the isolation, such
a fence (or one the snapshot shows but not live) is looked up under the lock,
and only its refusal holds the row.

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-06
"""

from lockkeeper_core.migrations.replaceable import install, routine_dialect

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None
# Same signature, and the same answers to every grant it passed before.
oldest_code = "0016"


def upgrade():
    if routine_dialect() is not None:
        install("0030", "lockkeeper_guard")


def downgrade():
    if routine_dialect() is not None:
        install("0008", "lockkeeper_guard")
