"""The atomic check-and-change of every lock operation, one module per dialect.

Two strategies give the same answers:

``PostgresStatements``
    acquire, renew and release are each ONE statement run in autocommit: a
    data-modifying CTE takes the row (insert, or conditional update/delete), writes
    the audit row and reports the outcome (or the current holder) in one round trip.
    The statements are server-side functions (migration 0007), planned once per
    connection even through a pooler that cannot keep prepared statements.
    A refused acquire locks and writes nothing: ``FOR UPDATE`` only touches a row
    that is free, expired or already ours, and ``nextval`` is only reached by a
    grant. Release keeps the row, free (``owner`` NULL): see ``DistributedLock``.

``TransactionalStatements``
    SQLite, MariaDB/MySQL (and PostgreSQL's operator actions): one short
    transaction that first takes the row with a locking read (``BEGIN IMMEDIATE``
    on SQLite, ``SELECT ... FOR UPDATE`` elsewhere), decides, then writes the row
    and its event. MariaDB has no ``UPDATE ... RETURNING`` nor data-modifying CTEs,
    so one statement cannot both decide and report; the row lock makes the
    sequence atomic instead. A first insert that loses a race to a concurrent
    insert raises ``IntegrityError`` (MariaDB: its upsert finds the winner's
    row and raises ``Raced``, ``insert_lock_row``) and the service retries: it
    then sees the winner and is refused.

Both take ``now`` = None to read the database's clock once the row lock is held
(see ``TransactionalStatements``, and for PostgreSQL migration 0007), or a datetime
(SQLite's host clock, read after ``BEGIN IMMEDIATE``; tests' fake clock).

The lock order: every operation, on every database, takes the rows it locks
in this order, and a row it may need later it takes in order or not at all:

1. the session's row (``lock_sessions``): a session-bound acquire FOR SHARE, a
   heartbeat or an end FOR UPDATE; a purge takes its sessions in expiry order;
2. the resource's row (``distributed_locks``), several in resource order (a
   session's heartbeat and end, a stale release or purge, a set); on PostgreSQL
   the database's ``ORDER BY resource``, which its collation decides and
   Python's ``sorted`` need not match: a path that then goes by name locks them
   all first in one statement (``lock_rows_in_order``). A resource with no row
   yet gets it with its first grant, after the token's row: that insert is the
   last lock its transaction may wait for (what follows only inserts new rows
   or deletes the grant's own waiter). A row is locked by name: the name's
   entry in the unique index, then the row (a locking read or delete of
   several, through that index: ``through_names``). On MariaDB the insert of a
   name whose deleted row InnoDB has not purged yet checks for a duplicate
   under next-key locks on that entry and the next name's: an upsert, which
   takes them exclusive, so two such first grants take turns
   (``insert_lock_row``). The next name's lock comes after the token's row; its
   holder waits for no token's row a first grant holds unless both are new
   tenures of one token near its quota (FOR UPDATE);
3. the API token's row (``api_tokens``), by a new tenure only, once its
   resource's row is held (FOR SHARE; FOR UPDATE near the token's quota);
   a new session's create takes it FOR UPDATE holding nothing else (its
   share of sessions), then only inserts its session's row;
4. the resource's holders (``lock_holders``), written only while the
   resource's row is held;
5. the waiting line (``lock_waiters``): a grant deletes its own waiter.

The audit log is only inserted into, the fence comes from a sequence (SQLite:
its counter row, behind ``BEGIN IMMEDIATE``, which makes one writer at a time
anyway), and a freeze's row is locked by nothing else. The guard
(``lockkeeper_guard``) holds the resource's row FOR SHARE, and only for a fence
a plain read finds live (migration 0030). Revoking a token locks its row alone.
``tests/test_deadlock_race.py`` races operations that meet on one resource and
reads the servers' deadlock counters.

The holder of a lock is the pair (token, owner): see ``holds``. An acquire that
would start a new tenure (a first acquire, the grant of a free row, a take-over;
not a re-acquire) locks its API token's row once the resource's row is held, in
the same function (PostgreSQL, migrations 0009, 0011 and 0029) or transaction:
it is refused when the token was revoked or has expired by the deciding clock
(``token_ended``), and when the token's quota of live locks is full. Near its
quota that lock is exclusive, so one token's new grants count one after another
and the quota is exact under parallel requests; far from it, or without one, it
is shared. The count is part of the same statement
(PostgreSQL), of the call that locks the token's row, a statement after that
lock (MariaDB: ``lockkeeper_token_grant``, migration 0044, with the clock and
the fence), or of the locking read (SQLite, one writer at a time), never a
round trip of its own on re-acquire or renew. Which way the row is locked is
picked by a first look at the count (PostgreSQL, and MariaDB off the hot path:
on the locking read) or, on MariaDB's hot path, by what the token's last
grant in this process counted (a count costs the token's churned index
entries there: once per grant, not twice); a shared lock whose count finds the
token near its quota grants nothing and the service tries again.
"""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from lockkeeper_core.statements.common import Outcome
from lockkeeper_core.statements.mariadb import MariaDBStatements
from lockkeeper_core.statements.postgresql import PostgresStatements
from lockkeeper_core.statements.sqlite import SQLiteStatements
from lockkeeper_core.statements.transaction import TransactionalStatements


@runtime_checkable
class LockStatements(Protocol):
    """What the service asks of every dialect's statements: the hot operations,
    and what they run on, declared rather than probed."""

    # acquire, renew and release are one statement each, on the driver's
    # autocommit connection; so is a holder's acquire then (``acquire_holder``
    # taking the driver's connection, PostgreSQL's migration 0021).
    autocommit: bool
    # The hot path runs in a transaction on the driver's connection, opened with
    # this SQL ("" when the driver opens it itself); None: on SQLAlchemy's.
    driver_transaction: str | None
    # The statements of the operator's actions and the reads (a short
    # transaction around a locking read on every dialect).
    transactional: TransactionalStatements

    def acquire(
        self, conn: Any, ask: Any, now: datetime | None, waiter: int | None = None
    ) -> Outcome: ...

    def renew(
        self,
        conn: Any,
        resource: str,
        owner: str,
        token: str | None,
        ttl: float,
        actor: str | None,
        now: datetime | None,
    ) -> Outcome: ...

    def release(
        self,
        conn: Any,
        resource: str,
        owner: str,
        token: str | None,
        actor: str | None,
        now: datetime | None,
        details: str | None = None,
    ) -> Outcome: ...


@functools.cache
def statements_for(dialect_name: str) -> LockStatements:
    """One set per dialect and process: the statements are built from the
    dialect alone and hold nothing of an engine, and building them cost each
    app about 15 ms (a test session builds thousands of apps)."""
    if dialect_name == "postgresql":
        return PostgresStatements()
    if dialect_name == "sqlite":
        return SQLiteStatements()
    if dialect_name == "mariadb":
        return MariaDBStatements()
    return TransactionalStatements(dialect_name)
