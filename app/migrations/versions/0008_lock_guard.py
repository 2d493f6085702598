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

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

# The row is locked first and the clock read after the lock is held, as the
# lock functions of 0007 do: a clock read before the wait could be older than
# a take-over the guard waited for. Under READ COMMITTED a guard that waited
# for a take-over sees the new row (and fails as lost); under REPEATABLE READ
# or SERIALIZABLE, PostgreSQL refuses the locking read of a row changed since
# the snapshot with 40001 instead: it fails closed either way.
POSTGRESQL_GUARD = """
CREATE OR REPLACE FUNCTION lockkeeper_guard(p_resource varchar, p_fence bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = {schema}, pg_temp
AS $function$
DECLARE
    v_owner varchar;
    v_fence bigint;
    v_expires_at timestamptz;
    v_now timestamptz;
BEGIN
    SELECT l.owner, l.fence, l.expires_at INTO v_owner, v_fence, v_expires_at
    FROM distributed_locks AS l
    WHERE l.resource = p_resource
    FOR SHARE;
    v_now := clock_timestamp();
    IF v_fence = p_fence AND v_owner IS NOT NULL THEN
        IF v_expires_at > v_now THEN
            RETURN;
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'LK002',
            MESSAGE = format('lockkeeper_guard: expired: the grant of %L under '
                             'fence %s expired at %s', p_resource, p_fence,
                             v_expires_at);
    END IF;
    IF EXISTS (SELECT 1 FROM lock_events AS e
               WHERE e.resource = p_resource AND e.fence = p_fence) THEN
        RAISE EXCEPTION USING ERRCODE = 'LK001',
            MESSAGE = format('lockkeeper_guard: lost: %L is no longer held under '
                             'fence %s', p_resource, p_fence),
            DETAIL = CASE WHEN v_owner IS NULL THEN 'No grant is in place.'
                          ELSE format('Fence %s holds it now.', v_fence) END;
    END IF;
    RAISE EXCEPTION USING ERRCODE = 'LK003',
        MESSAGE = format('lockkeeper_guard: never held: %L was never granted '
                         'under fence %s', p_resource, p_fence);
END
$function$
"""
POSTGRESQL_SIGNATURE = "lockkeeper_guard(varchar, bigint)"

# InnoDB: ``LOCK IN SHARE MODE`` on the unique index of ``resource`` takes a
# shared record lock held to the end of the transaction; the locking read sees
# the latest committed row whatever the isolation level. UTC_TIMESTAMP is read
# per statement inside a procedure, so ``v_now`` is read after the lock is held.
# The parameter carries the column's collation (binary, no pad): compared with
# another, the lookup would fail or match ``Job:1`` for ``job:1``. Messages stay
# under SIGNAL's 128 characters: the resource is cut to 48 of them.
MARIADB_GUARD = """
CREATE PROCEDURE lockkeeper_guard(
    IN p_resource VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin,
    IN p_fence BIGINT)
READS SQL DATA
SQL SECURITY DEFINER
COMMENT 'Fence check in the caller''s transaction (Lockkeeper migration 0008)'
BEGIN
    DECLARE v_found BOOLEAN DEFAULT TRUE;
    DECLARE v_owner VARCHAR(255) CHARACTER SET utf8mb4 DEFAULT NULL;
    DECLARE v_fence BIGINT DEFAULT NULL;
    DECLARE v_expires_at DATETIME(6) DEFAULT NULL;
    DECLARE v_now DATETIME(6);
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_found = FALSE;
    IF @@autocommit = 1 AND @@in_transaction = 0 THEN
        SIGNAL SQLSTATE 'LK004' SET MESSAGE_TEXT =
            'lockkeeper_guard: no transaction: call it inside the transaction whose writes it guards';
    END IF;
    SELECT owner, fence, expires_at INTO v_owner, v_fence, v_expires_at
    FROM distributed_locks
    WHERE resource = p_resource
    LOCK IN SHARE MODE;
    SET v_now = UTC_TIMESTAMP(6);
    IF v_found AND v_fence = p_fence AND v_owner IS NOT NULL THEN
        IF v_expires_at > v_now THEN
            SET v_found = TRUE;
        ELSE
            SET v_message = CONCAT('lockkeeper_guard: expired: the grant of ''',
                LEFT(p_resource, 48), ''' under fence ', p_fence, ' expired');
            SIGNAL SQLSTATE 'LK002' SET MESSAGE_TEXT = v_message;
        END IF;
    ELSEIF EXISTS (SELECT 1 FROM lock_events
                   WHERE resource = p_resource AND fence = p_fence) THEN
        SET v_message = CONCAT('lockkeeper_guard: lost: ''', LEFT(p_resource, 48),
            ''' is no longer held under fence ', p_fence);
        SIGNAL SQLSTATE 'LK001' SET MESSAGE_TEXT = v_message;
    ELSE
        SET v_message = CONCAT('lockkeeper_guard: never held: ''',
            LEFT(p_resource, 48), ''' was never granted under fence ', p_fence);
        SIGNAL SQLSTATE 'LK003' SET MESSAGE_TEXT = v_message;
    END IF;
END
"""


def _is_mariadb(bind) -> bool:
    return bind.dialect.name == "mariadb" or getattr(bind.dialect, "is_mariadb", False)


def upgrade():
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        schema = bind.exec_driver_sql("SELECT quote_ident(current_schema())").scalar()
        op.execute(POSTGRESQL_GUARD.replace("{schema}", schema))
    elif _is_mariadb(bind):
        op.execute("DROP PROCEDURE IF EXISTS lockkeeper_guard")
        op.execute(MARIADB_GUARD)


def downgrade():
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        op.execute(f"DROP FUNCTION IF EXISTS {POSTGRESQL_SIGNATURE}")
    elif _is_mariadb(bind):
        op.execute("DROP PROCEDURE IF EXISTS lockkeeper_guard")
