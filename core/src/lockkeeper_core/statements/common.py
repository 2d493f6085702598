"""What every dialect's statements share: the tables as the lock core reads them,
the SQL forms of the queue and the quota, and the shapes of their answers."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import (
    and_,
    bindparam,
    delete,
    exists,
    func,
    insert,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.sql import column, table
from sqlalchemy.types import Integer, String

from lockkeeper_core.columns import UTCDateTime
from lockkeeper_core.models import (
    EXCLUSIVE,
    NO_TOKEN,
    DistributedLock,
    FenceCounter,
    LockEvent,
    LockFreeze,
    LockHolder,
    LockWaiter,
)
from lockkeeper_core.state import Action
from lockkeeper_core.transactions import Raced

locks = DistributedLock.__table__
events = LockEvent.__table__
freezes = LockFreeze.__table__
fence_counter = FenceCounter.__table__
waiters = LockWaiter.__table__
holders = LockHolder.__table__
# The API tokens, as far as a grant reads them (the lock core does not import
# ``app.auth``): a grant locks its token's row and refuses a revoked or expired
# token there, in its own transaction. A token name with no row is a caller's
# own label (tests, tools): nothing to check.
api_tokens = table(
    "api_tokens",
    column("name", String()),
    column("revoked_at", UTCDateTime()),
    column("expires_at", UTCDateTime()),
)


def queue_columns(resource, now, waiter=None):
    """The Lock's ``waiters`` (live waiters of ``resource``, ``waiter``'s own row
    excluded) and ``ahead`` (those in line before ``waiter``; everyone when
    ``waiter`` is None or binds NULL), as scalar subqueries. A row past its
    deadline never counts: it belongs to a request that gave up or an app
    instance that died."""
    live = and_(waiters.c.resource == resource, waiters.c.deadline > now)
    count = select(func.count()).select_from(waiters)
    if waiter is None:
        everyone = count.where(live).scalar_subquery()
        return everyone.label("waiters"), everyone.label("ahead")
    return (
        count.where(live, or_(waiter.is_(None), waiters.c.id != waiter))
        .scalar_subquery()
        .label("waiters"),
        count.where(live, or_(waiter.is_(None), waiters.c.id < waiter))
        .scalar_subquery()
        .label("ahead"),
    )


def covering(now, resource=None):
    """Freezes in force at ``now`` over ``resource`` (default ``:resource``)."""
    resource = bindparam("resource", type_=String()) if resource is None else resource
    return and_(
        freezes.c.prefix == func.substr(resource, 1, func.length(freezes.c.prefix)),
        or_(freezes.c.ends_at.is_(None), freezes.c.ends_at > now),
    )


def is_frozen(now):
    return exists().where(covering(now))


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one attempt did.

    ``done``: the grant/renewal/release happened. ``row``: the lock row after the
    change (for a release: the row that was removed), or on refusal the current row
    (None when there is none). ``now``: the clock reading the decision used.
    ``freeze``: on a refused grant, the freeze that covers the resource, if any.
    """

    done: bool
    action: Action | None
    row: Any
    now: datetime
    # A grant refused because a freeze covers the resource: that freeze's row.
    freeze: Any = None
    over_quota: bool = False
    # A new grant refused because its API token was revoked or has expired.
    token_ended: bool = False
    # An exclusive grant refused because the resource is held by holders
    # (shared grants, a semaphore's): the holders path decides it.
    held_by_holders: bool = False
    # Refused: the resource is in use with another limit (this one).
    limit_mismatch: int | None = None


def token_or_none(token: str | None) -> str | None:
    """The token as shown to people: ``NO_TOKEN`` is no token."""
    return token if token != NO_TOKEN else None


def token_ended(found, now: datetime) -> bool:
    """A token row (``_token_row``) that was revoked, or has expired by ``now``."""
    return found is not None and (
        found.revoked_at is not None
        or (found.expires_at is not None and found.expires_at <= now)
    )


def clear_exclusive_grant(row_ids, ended_at: datetime | None = None):
    """The update that ends the exclusive grant on the ``distributed_locks``
    rows ``row_ids``: no owner, token or session any more. ``ended_at``: the
    instant it ended, the free row's ``expires_at``; None keeps the row's
    expiry (a stale grant a new holder took over: it ran out then)."""
    values: dict[str, Any] = {"owner": None, "token": None, "session_id": None}
    if ended_at is not None:
        values["expires_at"] = ended_at
    return update(locks).where(locks.c.id.in_(row_ids)).values(**values)


# A first grant's insert of a resource's row found the row there after all: a
# concurrent first grant made it since this transaction's locking read.
LOST_FIRST_INSERT = "a concurrent first grant made the resource's row"


def delete_where_in(conn, column, keys) -> None:
    """Delete the rows of ``column``'s table whose ``column`` is one of ``keys``
    (rows the caller has locked). MariaDB reads ``column IN (…)`` as the whole
    table when the keys are about as many as its estimate of the table's rows
    (a small table: EXPLAIN says ALL), and a DELETE waits for every row it
    reads that another transaction changed: a deadlock with a grant on another
    resource, seen in the set race. There each key goes alone, by its index;
    elsewhere all in one statement."""
    keys = list(dict.fromkeys(keys))
    if not keys:
        return
    if conn.dialect.name in ("mariadb", "mysql"):
        for key in keys:
            conn.execute(delete(column.table).where(column == key))
    else:
        conn.execute(delete(column.table).where(column.in_(keys)))


def insert_lock_row(conn, values: dict[str, Any]) -> int:
    """Insert a resource's row (``values``, ``resource`` among them) on a
    SQLAlchemy connection, after the transaction's locking read found none;
    returns its id.

    MariaDB: ``INSERT ... ON DUPLICATE KEY UPDATE id = id`` (which changes
    nothing), not a plain insert. A deleted row's entry in the unique index of
    names stays, delete-marked, until InnoDB purges it; an insert of that name
    checks for a duplicate under next-key locks on that entry and on the next
    name's. A plain insert takes them shared: two first grants of the name
    both hold them before either inserts, then each waits for the other's to
    insert before the next entry, a deadlock (certain while a third
    transaction holds the next name's row). The upsert takes them exclusive:
    the second waits for the first, then finds its row (insert id 0) and
    raises ``Raced``, as a plain insert's duplicate key error would have: the
    service tries again and decides on the winner's row. Elsewhere a plain
    insert (a lost race: a unique violation, retried the same way)."""
    if conn.dialect.name in ("mariadb", "mysql"):
        made = conn.execute(
            mysql_insert(locks).values(**values).on_duplicate_key_update(id=locks.c.id)
        ).lastrowid
        if not made:
            raise Raced(LOST_FIRST_INSERT)
        return made
    return conn.execute(insert(locks).values(**values)).inserted_primary_key[0]


def through_names(query):
    """``query`` (a locking read of ``distributed_locks`` by ``resource``) told,
    on MariaDB, to find its rows through the unique index of names: every
    locking read of a lock's row finds it by name, which locks the name's index
    entry, then the row, in resource order. Found through another index (the
    optimizer picks one its other conditions name, or the primary key on a
    table of a few rows), a statement locks the rows first, then waits for
    their names' entries when it deletes them: the other order."""
    hint = "FORCE INDEX (uq_distributed_locks_resource)"
    return query.with_hint(locks, hint, "mariadb").with_hint(locks, hint, "mysql")


def lock_rows_in_order(conn, resources) -> None:
    """PostgreSQL: lock the rows of ``resources`` that exist, in one
    statement, in the database's ``ORDER BY resource``: the order its other
    paths that lock several rows take them in (a set's acquire and release
    functions, a heartbeat, a session's end, a stale release). A loop over
    Python's ``sorted`` locks them by code point, which the database's
    collation need not follow (ICU's "en" puts 'a' before 'B'): a set's
    renewal so took two rows in the other order from a set's acquire, a
    deadlock each time they met."""
    conn.execute(
        select(locks.c.id)
        .where(locks.c.resource.in_(sorted(resources)))
        .order_by(locks.c.resource)
        .with_for_update()
    )


def live_locks(now_column):
    """How many live grants the token ``:quota_token`` holds (exclusive grants
    and holders), each kind counted no further than ``:max_locks`` (index ranges
    on (token, expires_at), bounded)."""

    def bounded(table, name):
        mine = table.alias("mine_" + name)
        live = (
            select(literal(1))
            .select_from(mine)
            .where(
                mine.c.token == bindparam("quota_token"),
                mine.c.expires_at > now_column,
            )
            .limit(bindparam("max_locks", type_=Integer()))
            .subquery(name)
        )
        return select(func.count()).select_from(live).scalar_subquery()

    return bounded(locks, "live") + bounded(holders, "places")


class Clock(NamedTuple):
    """What ``clock_after_lock`` read once the row lock was held."""

    now: datetime
    fence: int | None
    frozen: bool
    over_quota: bool


@dataclass(frozen=True, slots=True)
class ClaimView:
    """What a claim decides on, read under the row lock (``claim_view``)."""

    row: Any
    now: datetime
    fence: int | None
    freeze: Any
    token_ended: bool = False


@dataclass(frozen=True, slots=True)
class StaleBatch:
    candidates: int  # rows the batch found (fewer than asked: the last batch)
    released: list[Any]
    now: datetime


@dataclass(frozen=True, slots=True)
class FreezeRow:
    prefix: str
    reason: str
    actor: str
    frozen_at: datetime
    ends_at: datetime | None


@dataclass(frozen=True, slots=True)
class LockRow:
    resource: str
    owner: str
    token: str | None
    fence: int
    acquired_at: datetime
    expires_at: datetime
    waiters: int = 0
    # The resource's limit, this grant's mode, and how many live grants the
    # resource has (this one included).
    holder_limit: int = 1
    mode: str = EXCLUSIVE
    holders: int = 1
    # The ttl it was last granted or renewed for, where a read selected it
    # (``listing.granted_ttl``).
    granted_ttl: float | None = None

    @classmethod
    def of(cls, row, **changes) -> LockRow:
        values = {
            name: getattr(row, name, None)
            for name in cls.__slots__
            if name not in _ROW_DEFAULTS or getattr(row, name, None) is not None
        }
        values.update(changes)
        return cls(**values)


# LockRow's fields a row may lack (or carry NULL in), taken as their defaults.
_ROW_DEFAULTS = frozenset({"waiters", "holder_limit", "mode", "holders", "granted_ttl"})


class SessionEnded(Exception):
    """Raised inside a transaction: the session has expired."""

    def __init__(self, session: Any):  # a sessions.SessionRow
        self.session = session
        super().__init__(session.id)
