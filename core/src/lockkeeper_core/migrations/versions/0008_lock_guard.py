"""The guard: a fence check inside the caller's own transaction.

A worker whose data lives in the lock database calls, in the transaction that
writes its data::

    SELECT lockkeeper_guard('job:42', 17);      -- PostgreSQL
    CALL lockkeeper_guard('job:42', 17);        -- MariaDB

It succeeds only while the grant of ``job:42`` under fence 17 is valid by the
database's clock, and it leaves the grant's row locked with a SHARED row lock
until that transaction ends. Every change of a grant (take-over, release,
force-release, claim, the waiting line's hand-over, renew, release-stale,
purge) first takes the row with ``FOR UPDATE`` (or updates it), which waits for
a shared lock: nothing can end or replace the grant between the check and the
caller's commit. Two guarded transactions of the same holder do not wait for
each other (shared locks coexist).

When it fails it raises, which aborts the caller's statement (and on PostgreSQL
the whole transaction):

=======  =====================================================================
LK001    lost: the grant of that fence ended (released, force-released, taken
         over, claimed); another fence, or none, is in place now
LK002    expired: the grant is still the row's, but its ttl has passed
LK003    never held: no grant of that fence on that resource is on record
LK004    no transaction: called outside a transaction it could protect
         (MariaDB; see below)
=======  =====================================================================

The message starts with ``lockkeeper_guard: <reason>:`` on both databases
(PyMySQL reports the MySQL error number, 1644, and the message, not the
SQLSTATE). "Lost" and "never held" are told apart by the audit log
(``lock_events``), read only on that failure path.

Outside a transaction the row lock would end with the statement and guard
nothing. MariaDB's procedure refuses then (``@@autocommit`` on and no transaction
open); PostgreSQL cannot tell an autocommit statement from the first statement
of a transaction (the extended protocol starts both the same way), so there it
is the caller's part: the client's helpers refuse a connection in autocommit
before they call the guard.

Both run with their owner's rights (``SECURITY DEFINER``; MariaDB's default
``SQL SECURITY DEFINER``): a worker's role needs only ``EXECUTE`` on the guard,
not ``UPDATE`` on ``distributed_locks`` (which ``FOR SHARE`` would need). The
PostgreSQL function pins its ``search_path`` to the schema it was created in.
No session state is used: it works through a transaction-pooling PgBouncer.

SQLite has no row locks (a writer locks the whole database) and no functions in
SQL: there is no guard there.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from alembic import op

from lockkeeper_core.migrations.replaceable import install, routine_dialect

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None
oldest_code = "0007"

POSTGRESQL_SIGNATURE = "lockkeeper_guard(varchar, bigint)"


def upgrade():
    if routine_dialect() is not None:
        install("0008", "lockkeeper_guard")


def downgrade():
    dialect = routine_dialect()
    if dialect == "postgresql":
        op.execute(f"DROP FUNCTION IF EXISTS {POSTGRESQL_SIGNATURE}")
    elif dialect == "mariadb":
        op.execute("DROP PROCEDURE IF EXISTS lockkeeper_guard")
