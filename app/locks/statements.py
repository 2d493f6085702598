"""The atomic check-and-change of every lock operation, per dialect.

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
    insert raises ``IntegrityError`` and the service retries: it then sees the
    winner and is refused.

Both take ``now`` = None to read the database's clock once the row lock is held
(see ``TransactionalStatements``, and for PostgreSQL migration 0007), or a datetime
(SQLite's host clock, read after ``BEGIN IMMEDIATE``; tests' fake clock).

The holder of a lock is the pair (token, owner): see ``holds``. An acquire that
would start a new tenure (a first acquire, the grant of a free row, a take-over;
not a re-acquire) first locks its API token's row, in the same function
(PostgreSQL, migration 0009) or transaction: it is refused when the token was
revoked or has expired by the deciding clock (``token_ended``), and when the
token's quota of live locks is full. Under a quota that lock is exclusive, so one
token's new grants count one after another and the quota is exact under parallel
requests; without one it is shared. The count is part of the same statement
(PostgreSQL), of the clock read that follows the token's row lock (MariaDB) or of
the locking read (SQLite, one writer at a time), never a round trip of its own on
re-acquire or renew.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import (
    BigInteger,
    Connection,
    Row,
    and_,
    bindparam,
    case,
    delete,
    exists,
    func,
    insert,
    literal,
    null,
    or_,
    select,
    update,
)
from sqlalchemy.sql import column, table
from sqlalchemy.types import Integer, String

from app.database import UTCDateTime
from app.locks.driver import DriverConnection, DriverSQL, FixedSQL
from app.locks.models import (
    NO_TOKEN,
    DistributedLock,
    FenceCounter,
    LockEvent,
    LockFreeze,
    LockWaiter,
    fence_sequence,
)
from app.locks.state import Action, holds

locks = DistributedLock.__table__
events = LockEvent.__table__
freezes = LockFreeze.__table__
fence_counter = FenceCounter.__table__
waiters = LockWaiter.__table__
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


def _covering(now, resource=None):
    """Freezes in force at ``now`` over ``resource`` (default ``:resource``)."""
    resource = bindparam("resource", type_=String()) if resource is None else resource
    return and_(
        freezes.c.prefix == func.substr(resource, 1, func.length(freezes.c.prefix)),
        or_(freezes.c.ends_at.is_(None), freezes.c.ends_at > now),
    )


def _frozen(now):
    return exists().where(_covering(now))


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


def token_or_none(token: str | None) -> str | None:
    """The token as shown to people: ``NO_TOKEN`` is no token."""
    return token if token != NO_TOKEN else None


# --- PostgreSQL: one statement per hot operation ---------------------------------

# The statements live in the database as functions (migrations 0007 and 0009,
# where their SQL and its reasoning are): PostgreSQL plans each once per
# connection, with or without a pooler that cannot carry prepared statements.
# ``now`` NULL: the server's clock, read after the row lock; a datetime: a
# test's fake clock.
_PG_ACQUIRE = DriverSQL(
    "SELECT * FROM lockkeeper_acquire(:resource, :owner, :token, :ttl, :actor,"
    " :max_locks, :waiter, :now)"
)
_PG_RENEW = DriverSQL(
    "SELECT * FROM lockkeeper_renew(:resource, :owner, :token, :ttl, :actor, :now)"
)
_PG_RELEASE = DriverSQL(
    "SELECT * FROM lockkeeper_release(:resource, :owner, :token, :actor, :now)"
)
_PG_READ_NOW = DriverSQL("SELECT clock_timestamp() AS now")


class PostgresStatements:
    """Single-statement acquire/renew/release; operator actions as transactions.

    The hot operations take a ``DriverConnection`` (``app.locks.driver``), not a
    SQLAlchemy connection: their SQL is fixed, so it goes to the driver's cursor.
    """

    autocommit = True
    # What the methods send; the benchmark's driver baseline sends the same.
    acquire_sql = _PG_ACQUIRE
    renew_sql = _PG_RENEW
    release_sql = _PG_RELEASE

    def __init__(self) -> None:
        self.transactional = TransactionalStatements("postgresql")

    def _run(
        self, conn: DriverConnection, statement: DriverSQL, params: dict[str, Any]
    ) -> Outcome:
        now = params["now"]
        row = conn.one(statement, params)
        if row is None:
            return Outcome(False, None, None, now or conn.one(_PG_READ_NOW, {}).now)
        if row.done:
            return Outcome(True, Action(row.action), row, row.now)
        freeze = (
            _FreezeRow(
                row.frozen_prefix,
                row.frozen_reason,
                row.frozen_actor,
                row.frozen_at,
                row.frozen_until,
            )
            if getattr(row, "frozen_prefix", None) is not None
            else None
        )
        over_quota = bool(getattr(row, "over_quota", False))
        # A refused acquire always answers one row; fence NULL: there is no row.
        holder = row if row.fence is not None else None
        return Outcome(
            False,
            None,
            holder,
            row.now,
            freeze,
            over_quota,
            bool(getattr(row, "token_ended", False)),
        )

    def acquire(
        self, conn, resource, owner, token, ttl, actor, max_locks, now, waiter=None
    ) -> Outcome:
        return self._run(
            conn,
            self.acquire_sql,
            {
                "resource": resource,
                "owner": owner,
                "token": token,
                "ttl": ttl,
                "actor": actor,
                "max_locks": max_locks,
                "waiter": waiter,
                "now": now,
            },
        )

    def renew(self, conn, resource, owner, token, ttl, actor, now) -> Outcome:
        return self._run(
            conn,
            self.renew_sql,
            {
                "resource": resource,
                "owner": owner,
                "token": token,
                "ttl": ttl,
                "actor": actor,
                "now": now,
            },
        )

    def release(self, conn, resource, owner, token, actor, now) -> Outcome:
        return self._run(
            conn,
            self.release_sql,
            {
                "resource": resource,
                "owner": owner,
                "token": token,
                "actor": actor,
                "now": now,
            },
        )


# --- Everything else: a short transaction around a locking read ------------------


_SERVER_NOW = {
    "postgresql": func.clock_timestamp,
    "mysql": lambda: func.utc_timestamp(6),
    "mariadb": lambda: func.utc_timestamp(6),
}


_INSERT_EVENT = insert(events)


class TransactionalStatements:
    """Locking read, then the clock, decision, write, event: one transaction per call.

    The clock is read in a statement AFTER the locking read has returned, so the
    decision and the timestamps it writes come from a moment at which this
    transaction holds the row. Read in the locking statement itself, the clock can
    be older than the wait for the row lock (MariaDB evaluates ``UTC_TIMESTAMP``
    when the statement starts): a grant decided after a release would record a
    time before that release, and judge expiry by that stale reading.
    """

    autocommit = False

    def __init__(self, dialect_name: str) -> None:
        self.dialect_name = dialect_name
        self._server_now = _SERVER_NOW.get(dialect_name)
        self.uses_sequence = dialect_name != "sqlite"
        # The hot statements are built once: building Core constructs on every
        # call cost about a fifth of an acquire+release cycle's CPU on SQLite.
        # The locking read carries the row's queue (``waiters``, and ``ahead`` of
        # ``:waiter``); waiters' deadlines are judged by the clock of this read.
        by_resource = locks.c.resource == bindparam("resource")
        waiter = bindparam("waiter", type_=BigInteger())
        given_now = bindparam("now", type_=UTCDateTime())
        server_now = (
            self._server_now().cast(UTCDateTime())
            if self._server_now is not None
            else None
        )
        # Keyed by (reads the server clock, counts the token's live locks). Only
        # SQLite counts on the locking read (its clock is the host's, read after
        # BEGIN IMMEDIATE); elsewhere the count rides on the clock read that
        # follows the row lock (``clock_after_lock``).
        self._lock_row = {}
        for on_server, now_column in ((False, given_now), (True, server_now)):
            if now_column is None:
                continue
            for counting in (False, True):
                columns = list(queue_columns(bindparam("resource"), now_column, waiter))
                if counting:
                    columns.append(_live_locks(now_column).label("live"))
                self._lock_row[on_server, counting] = (
                    select(locks, *columns).where(by_resource).with_for_update()
                )
        # SQLite with no row to ride on, and a grant after its token's row lock
        # elsewhere: the count alone.
        self._live_count = select(_live_locks(given_now).label("live"))
        token_row = select(api_tokens.c.revoked_at, api_tokens.c.expires_at).where(
            api_tokens.c.name == bindparam("token")
        )
        # Keyed by "a quota applies": then one new grant of the token at a time
        # (its count must see the grant before it); otherwise a shared lock, which
        # only a revocation waits for.
        self._token_rows = {
            True: token_row.with_for_update(),
            False: token_row.with_for_update(read=True),
        }
        self._next_fence_statement = (
            select(fence_sequence.next_value())
            if self.uses_sequence
            else update(fence_counter)
            .where(fence_counter.c.id == 1)
            .values(value=fence_counter.c.value + 1)
            .returning(fence_counter.c.value)
        )
        if self._server_now is not None:
            self._read_now = select(self._server_now().cast(UTCDateTime()))
        given_now = bindparam("now", type_=UTCDateTime())
        # SQLite: the counter moves only when no freeze covers the resource, so a
        # grant costs no extra statement for the freeze (no row comes back instead).
        self._next_fence_unless_frozen = (
            update(fence_counter)
            .where(fence_counter.c.id == 1, ~_frozen(given_now))
            .values(value=fence_counter.c.value + 1)
            .returning(fence_counter.c.value)
        )
        self._freeze_row = (
            select(freezes)
            .where(_covering(given_now))
            .order_by(freezes.c.prefix)
            .limit(1)
        )
        self._clock_statements: dict[tuple[bool, bool, bool, bool], Any] = {}

    def _clock_statement(
        self, server: bool, conditional: bool, freeze: bool, quota: bool = False
    ):
        """``SELECT now, fence[, frozen][, over_quota]`` in one round trip (sequence
        dialects): the clock (the server's, or ``:now``), whether a freeze covers
        ``:resource`` by it, whether ``:quota_token`` holds ``:max_locks`` live
        locks by it, and a new fence, drawn only for a grant (with
        ``conditional``: when ``:valid_until`` has passed) that neither stops."""
        key = (server, conditional, freeze, quota)
        if key not in self._clock_statements:
            now = (
                self._server_now().cast(UTCDateTime())
                if server
                else bindparam("now", type_=UTCDateTime())
            )
            # A derived table reads the clock once: PostgreSQL's clock_timestamp()
            # would differ between two mentions.
            clock = select(now.label("now")).subquery("clock")
            conditions = []
            if conditional:
                valid_until = bindparam("valid_until", type_=UTCDateTime())
                conditions.append(valid_until <= clock.c.now)
            columns = [clock.c.now]
            if freeze:
                conditions.append(~_frozen(clock.c.now))
                columns.append(_frozen(clock.c.now).label("frozen"))
            if quota:
                reached = _live_locks(clock.c.now) >= bindparam(
                    "max_locks", type_=Integer()
                )
                conditions.append(~reached)
                columns.append(reached.label("over_quota"))
            fence = fence_sequence.next_value()
            if conditions:
                fence = case((and_(*conditions), fence), else_=null())
            self._clock_statements[key] = select(*columns, fence.label("fence"))
        return self._clock_statements[key]

    # -- reads --------------------------------------------------------------

    def read_now(self, conn: Connection) -> datetime:
        if self._server_now is None:
            raise RuntimeError("SQLite has no server clock: pass the host's time")
        return self._scalar(conn, self._read_now)

    def lock_row(
        self,
        conn: Connection,
        resource: str,
        now: datetime | None,
        waiter: int | None = None,
        *,
        quota_token: str | None = None,
        max_locks: int | None = None,
    ) -> Row | None:
        """The row of ``resource``, locked until commit (None when there is none),
        with its queue: ``waiters``, and ``ahead`` of ``waiter``. With
        ``max_locks`` (SQLite), also ``live``: how many live locks ``quota_token``
        holds, counted up to ``max_locks``."""
        counting = bool(max_locks) and quota_token is not None
        params: dict[str, Any] = {"resource": resource, "waiter": waiter}
        if now is not None:
            params["now"] = now
        if counting:
            params.update(quota_token=quota_token, max_locks=max_locks)
        return self._row(conn, self._lock_row[now is None, counting], params)

    def freeze_of(self, conn: Connection, resource: str, now: datetime) -> Row | None:
        """The freeze in force over ``resource`` at ``now``, if any."""
        return self._row(conn, self._freeze_row, {"resource": resource, "now": now})

    def clock_after_lock(
        self,
        conn: Connection,
        now: datetime | None,
        *,
        fence: bool = False,
        fence_unless_valid_until: datetime | None = None,
        unless_frozen: str | None = None,
        quota_token: str | None = None,
        max_locks: int | None = None,
        live: int | None = None,
    ) -> Clock:
        """``Clock(now, fence, frozen, over_quota)``, read now that the row is locked.

        ``now``: the deciding clock (the server's when None is given). With
        ``fence``, a new fence for a grant: drawn unless the grant in place is
        still valid at ``now`` (``fence_unless_valid_until``: its expiry), unless
        a freeze covers ``unless_frozen`` (a resource) at ``now`` (then ``frozen``
        is true), and unless ``quota_token`` already holds ``max_locks`` live
        locks (then ``over_quota`` is true; ``live``: that count, when the
        locking read made it). No fence is drawn for a refused grant.
        """
        if not fence:
            return Clock(
                now if now is not None else self.read_now(conn), None, False, False
            )
        conditional = fence_unless_valid_until is not None
        counting = bool(max_locks) and quota_token is not None
        if self.uses_sequence:
            params: dict[str, Any] = {}
            if now is not None:
                params["now"] = now
            if conditional:
                params["valid_until"] = fence_unless_valid_until
            if unless_frozen is not None:
                params["resource"] = unless_frozen
            if counting:
                params.update(quota_token=quota_token, max_locks=max_locks)
            statement = self._clock_statement(
                now is None, conditional, unless_frozen is not None, counting
            )
            row = self._row(conn, statement, params)
            return Clock(
                row.now,
                row.fence,
                bool(getattr(row, "frozen", False)),
                bool(getattr(row, "over_quota", False)),
            )
        if conditional and fence_unless_valid_until > now:
            return Clock(now, None, False, False)
        if counting:
            if live is None:
                live = conn.scalar(
                    self._live_count,
                    {"now": now, "quota_token": quota_token, "max_locks": max_locks},
                )
            if live >= max_locks:
                # Refused either way; a freeze still takes precedence, as it does
                # in the other dialects' statements.
                frozen = unless_frozen is not None and (
                    self.freeze_of(conn, unless_frozen, now) is not None
                )
                return Clock(now, None, frozen, not frozen)
        if unless_frozen is None:
            return Clock(now, self._next_fence(conn), False, False)
        drawn = conn.scalar(
            self._next_fence_unless_frozen, {"resource": unless_frozen, "now": now}
        )
        return Clock(now, drawn, drawn is None, False)

    # How a prebuilt read is run: ``MariaDBStatements`` sends the same constructs
    # compiled once on a ``DriverTransaction``.

    def _row(self, conn, statement, params: dict[str, Any]) -> Row | None:
        return conn.execute(statement, params).one_or_none()

    def _scalar(self, conn, statement, params: dict[str, Any] | None = None) -> Any:
        return conn.scalar(statement, params)

    def _next_fence(self, conn: Connection) -> int:
        return conn.scalar(self._next_fence_statement)

    # -- writes -------------------------------------------------------------

    def _grant(
        self,
        conn,
        row,
        resource,
        owner,
        token,
        fence,
        now,
        ttl,
        action,
        actor,
        reason=None,
    ) -> Outcome:
        values = {
            "owner": owner,
            "token": token,
            "fence": fence,
            "acquired_at": now,
            "expires_at": now + timedelta(seconds=ttl),
        }
        self._write_grant(conn, row, resource, values)
        granted = _LockRow(
            resource=resource,
            waiters=row.waiters if row is not None else 0,
            **values,
        )
        previous_owner = row.owner if row is not None else None
        self._log(conn, action, granted, previous_owner, token, actor, reason, now)
        return Outcome(True, action, granted, now)

    def _log(
        self, conn, action, lock, previous_owner, token, actor, reason, now
    ) -> None:
        self._insert_event(
            conn,
            {
                "resource": lock.resource,
                "action": action.value,
                "owner": lock.owner,
                "previous_owner": previous_owner,
                "token": token_or_none(token),
                "fence": lock.fence,
                "acquired_at": lock.acquired_at,
                "expires_at": lock.expires_at,
                "actor": actor,
                "reason": reason,
                "occurred_at": now,
            },
        )

    # The hot path's writes, one method each so ``SQLiteStatements`` can send
    # them as fixed SQL.

    def _write_grant(self, conn, row, resource, values) -> None:
        if row is None:
            conn.execute(insert(locks).values(resource=resource, **values))
        else:
            conn.execute(update(locks).where(locks.c.id == row.id).values(**values))

    def _write_expiry(self, conn, row, expires_at) -> None:
        conn.execute(
            update(locks).where(locks.c.id == row.id).values(expires_at=expires_at)
        )

    def _write_free(self, conn, row, now) -> None:
        conn.execute(
            update(locks)
            .where(locks.c.id == row.id)
            .values(owner=None, token=None, expires_at=now)
        )

    def _dequeue(self, conn, waiter) -> None:
        conn.execute(delete(waiters).where(waiters.c.id == waiter))

    def _insert_event(self, conn, params) -> None:
        conn.execute(_INSERT_EVENT, params)

    # -- operations ---------------------------------------------------------

    def acquire(
        self, conn, resource, owner, token, ttl, actor, max_locks, now, waiter=None
    ) -> Outcome:
        counting = bool(max_locks) and token is not None
        checks_token = token is not None and token != NO_TOKEN
        # SQLite has one writer at a time: its count rides on the locking read.
        # Elsewhere the count follows the token's row lock, so two parallel new
        # grants of one token cannot both count the same free place.
        count_on_read = counting and not self.uses_sequence
        row = self.lock_row(
            conn,
            resource,
            now,
            waiter,
            quota_token=token if count_on_read else None,
            max_locks=max_locks if count_on_read else None,
        )
        held = row is not None and row.owner is not None
        token_row, token_locked = None, False
        if row is not None and row.ahead:
            # Others are in line first: only a re-acquire of our valid lock goes on.
            now = self.clock_after_lock(conn, now).now
            if not (held and holds(row, owner, token) and row.expires_at > now):
                return Outcome(False, None, row, now)
            fence, frozen, over_quota = None, False, False
        else:
            # A free row (or none) granted is a new tenure: lock the token's row
            # before the clock read, so the quota count rides on that read. A
            # held row locks it only once it turns out expired (below).
            if not held and checks_token and self.uses_sequence:
                token_row = self._token_row(conn, token, exclusive=counting)
                token_locked = True
            count_now = count_on_read or (token_locked and counting)
            now, fence, frozen, over_quota = self.clock_after_lock(
                conn,
                now,
                fence=True,
                fence_unless_valid_until=row.expires_at if held else None,
                unless_frozen=resource,
                quota_token=token if count_now else None,
                max_locks=max_locks if count_now else None,
                live=row.live if count_on_read and row is not None else None,
            )
        if not held:
            action = Action.ACQUIRED
        elif row.expires_at <= now:
            action = Action.TOOK_OVER
        elif holds(row, owner, token):
            action, fence = Action.REACQUIRED, row.fence
        else:
            return Outcome(False, None, row, now)
        holder = row if held else None
        if action is not Action.REACQUIRED and checks_token:
            # A new tenure: the token must be live where the grant commits.
            if not token_locked:
                token_row = self._token_row(conn, token, exclusive=counting)
                if counting and not count_on_read:
                    # A take-over: counted now, after the token's row lock.
                    live = self._scalar(
                        conn,
                        self._live_count,
                        {"now": now, "quota_token": token, "max_locks": max_locks},
                    )
                    over_quota = over_quota or live >= max_locks
            if token_ended(token_row, now):
                return Outcome(False, None, holder, now, token_ended=True)
        if action is not Action.REACQUIRED and frozen:
            return Outcome(False, None, row, now, self.freeze_of(conn, resource, now))
        if action is not Action.REACQUIRED and over_quota:
            # Only a new grant counts against the quota; nothing is written.
            return Outcome(False, None, holder, now, over_quota=True)
        outcome = self._grant(
            conn, row, resource, owner, token, fence, now, ttl, action, actor
        )
        if waiter is not None:
            self._dequeue(conn, waiter)
        return outcome

    def _token_row(self, conn, token: str, *, exclusive: bool) -> Row | None:
        """The token's row (revoked_at, expires_at), locked until commit: for
        update under a quota (one new grant of the token at a time), else shared
        (only a revocation waits); a revocation that committed first is seen,
        one that comes later waits for this grant. None: no such token."""
        return self._row(conn, self._token_rows[exclusive], {"token": token})

    def renew(self, conn, resource, owner, token, ttl, actor, now) -> Outcome:
        row = self.lock_row(conn, resource, now)
        now = self.clock_after_lock(conn, now).now
        if row is None or not holds(row, owner, token) or row.expires_at <= now:
            return Outcome(False, None, row, now)
        expires_at = now + timedelta(seconds=ttl)
        self._write_expiry(conn, row, expires_at)
        renewed = _LockRow.of(row, expires_at=expires_at)
        self._log(conn, Action.RENEWED, renewed, owner, token, actor, None, now)
        return Outcome(True, Action.RENEWED, renewed, now)

    def release(self, conn, resource, owner, token, actor, now) -> Outcome:
        row = self.lock_row(conn, resource, now)
        now = self.clock_after_lock(conn, now).now
        if row is None or not holds(row, owner, token) or row.expires_at <= now:
            return Outcome(False, None, row, now)
        return self._remove(conn, row, Action.RELEASED, token, actor, None, now)

    def force_release(self, conn, resource, actor, reason, now, confirm) -> Outcome:
        """``confirm(row, now)`` raises to refuse (the service's rules)."""
        row = self.lock_row(conn, resource, now)
        now = self.clock_after_lock(conn, now).now
        confirm(row, now)
        return self._remove(
            conn, row, Action.FORCE_RELEASED, row.token, actor, reason, now
        )

    def claim(
        self,
        conn,
        resource,
        owner,
        token,
        ttl,
        actor,
        reason,
        now,
        confirm,
        *,
        frozen_too,
    ) -> Outcome:
        """Grant to (``token``, ``owner``); ``token`` NO_TOKEN: bound to no token.

        ``confirm(row, now, freeze)`` raises to refuse, or says whether the claim
        takes the lock from another valid holder. ``frozen_too``: claim even if a
        freeze covers the resource (``freeze`` is then None)."""
        row = self.lock_row(conn, resource, now)
        now, fence, frozen, _ = self.clock_after_lock(
            conn, now, fence=True, unless_frozen=None if frozen_too else resource
        )
        if token != NO_TOKEN:
            # The token the grant is bound to must be live where it commits.
            found = self._token_row(conn, token, exclusive=False)
            if found is None or token_ended(found, now):
                return Outcome(False, None, row, now, token_ended=True)
        freeze = self.freeze_of(conn, resource, now) if frozen else None
        takes_from_holder = confirm(row, now, freeze)
        action = Action.FORCE_CLAIMED if takes_from_holder else Action.CLAIMED
        return self._grant(
            conn, row, resource, owner, token, fence, now, ttl, action, actor, reason
        )

    def _remove(self, conn, row, action, token, actor, reason, now) -> Outcome:
        """Free the row (see ``DistributedLock``); the event says when it ended."""
        self._write_free(conn, row, now)
        ended = _LockRow.of(row, expires_at=now)
        self._log(conn, action, ended, row.owner, token, actor, reason, now)
        return Outcome(True, action, ended, now)

    def release_stale_batch(
        self, conn, prefix, owner, actor, reason, now, batch: int
    ) -> StaleBatch:
        """Force-release up to ``batch`` stale locks matching ``prefix``/``owner``:
        lock the candidates (in resource order, so concurrent batches do not
        deadlock), read the clock, free those still stale by it."""
        query = (
            select(locks)
            .where(
                locks.c.owner.is_not(None),
                locks.c.expires_at <= (now if now is not None else self._server_now()),
            )
            .order_by(locks.c.resource)
            .limit(batch)
            .with_for_update()
        )
        if prefix:
            query = query.where(
                locks.c.resource.startswith(prefix, autoescape=True),
                func.substr(locks.c.resource, 1, len(prefix)) == prefix,
            )
        if owner is not None:
            query = query.where(locks.c.owner == owner)
        candidates = conn.execute(query).all()
        now = self.clock_after_lock(conn, now).now
        stale = [row for row in candidates if row.expires_at <= now]
        if stale:
            conn.execute(
                update(locks)
                .where(locks.c.id.in_([row.id for row in stale]))
                .values(owner=None, token=None, expires_at=now)
            )
            conn.execute(
                _INSERT_EVENT,
                [
                    {
                        "resource": row.resource,
                        "action": Action.FORCE_RELEASED.value,
                        "owner": row.owner,
                        "previous_owner": row.owner,
                        "token": token_or_none(row.token),
                        "fence": row.fence,
                        "acquired_at": row.acquired_at,
                        "expires_at": now,
                        "actor": actor,
                        "reason": reason,
                        "occurred_at": now,
                    }
                    for row in stale
                ],
            )
        released = [_LockRow.of(row, expires_at=now) for row in stale]
        return StaleBatch(len(candidates), released, now)

    def purge_stale_batch(self, conn, cutoff: datetime, batch: int) -> list[Row]:
        """Delete up to ``batch`` rows that expired (or were released) at or before
        ``cutoff``; returns their (resource, owner), owner None for free rows.

        The rows are locked first, so a row re-acquired meanwhile is not taken.
        """
        candidates = conn.execute(
            select(locks.c.id, locks.c.resource, locks.c.owner)
            .where(locks.c.expires_at <= cutoff)
            .order_by(locks.c.expires_at)
            .limit(batch)
            .with_for_update()
        ).all()
        if candidates:
            conn.execute(
                delete(locks).where(locks.c.id.in_([c.id for c in candidates]))
            )
        return candidates


def token_ended(found, now: datetime) -> bool:
    """A token row (``_token_row``) that was revoked, or has expired by ``now``."""
    return found is not None and (
        found.revoked_at is not None
        or (found.expires_at is not None and found.expires_at <= now)
    )


def _live_locks(now_column):
    """How many live locks the token ``:quota_token`` holds, counted no further
    than ``:max_locks`` (an index range on (token, expires_at), bounded)."""
    mine = locks.alias("mine")
    live = (
        select(literal(1))
        .select_from(mine)
        .where(
            mine.c.token == bindparam("quota_token"),
            mine.c.expires_at > now_column,
        )
        .limit(bindparam("max_locks", type_=Integer()))
        .subquery("live")
    )
    return select(func.count()).select_from(live).scalar_subquery()


class Clock(NamedTuple):
    """What ``clock_after_lock`` read once the row lock was held."""

    now: datetime
    fence: int | None
    frozen: bool
    over_quota: bool


@dataclass(frozen=True, slots=True)
class StaleBatch:
    candidates: int  # rows the batch locked (fewer than asked: the last batch)
    released: list[Any]
    now: datetime


@dataclass(frozen=True, slots=True)
class _FreezeRow:
    prefix: str
    reason: str
    actor: str
    frozen_at: datetime
    ends_at: datetime | None


@dataclass(frozen=True, slots=True)
class _LockRow:
    resource: str
    owner: str
    token: str | None
    fence: int
    acquired_at: datetime
    expires_at: datetime
    waiters: int = 0

    @classmethod
    def of(cls, row, **changes) -> _LockRow:
        values = {name: getattr(row, name, 0) for name in cls.__slots__}
        values.update(changes)
        return cls(**values)


# --- SQLite: the same transaction as fixed SQL on the sqlite3 connection ----------

# Waiters of :resource live at :now, :waiter's own row excluded (``waiters``) and
# those ahead of it (``ahead``): see ``queue_columns``.
_SQLITE_QUEUE = """
       (SELECT count(*) FROM lock_waiters AS w
        WHERE w.resource = :resource AND w.deadline > :now
          AND (:waiter IS NULL OR w.id != :waiter)) AS waiters,
       (SELECT count(*) FROM lock_waiters AS w
        WHERE w.resource = :resource AND w.deadline > :now
          AND (:waiter IS NULL OR w.id < :waiter)) AS ahead"""
# The live locks of :quota_token, counted no further than :max_locks.
_SQLITE_LIVE = """(SELECT count(*) FROM (
        SELECT 1 FROM distributed_locks AS mine
        WHERE mine.token = :quota_token AND mine.expires_at > :now
        LIMIT :max_locks))"""
_SQLITE_LOCK_ROW = """SELECT l.id, l.resource, l.owner, l.token, l.fence,
       l.acquired_at, l.expires_at,{queue}{live}
FROM distributed_locks AS l WHERE l.resource = :resource"""
_SQLITE_COVERING = """SELECT {columns} FROM lock_freezes AS f
    WHERE f.prefix = substr(:resource, 1, length(f.prefix))
      AND (f.ends_at IS NULL OR f.ends_at > :now)"""
_SQLITE_NEXT_FENCE = (
    "UPDATE lock_fence_counter SET value = value + 1 WHERE id = 1{unless} "
    "RETURNING value"
)


_SQLITE_INSERT_LOCK = """INSERT INTO distributed_locks
    (resource, owner, token, fence, acquired_at, expires_at)
VALUES (:resource, :owner, :token, :fence, :acquired_at, :expires_at)"""
_SQLITE_UPDATE_LOCK = """UPDATE distributed_locks
SET owner = :owner, token = :token, fence = :fence, acquired_at = :acquired_at,
    expires_at = :expires_at
WHERE id = :id"""
_SQLITE_SET_EXPIRY = (
    "UPDATE distributed_locks SET expires_at = :expires_at WHERE id = :id"
)
_SQLITE_FREE = (
    "UPDATE distributed_locks SET owner = NULL, token = NULL, expires_at = :expires_at "
    "WHERE id = :id"
)
_SQLITE_DEQUEUE = "DELETE FROM lock_waiters WHERE id = :id"
_SQLITE_TOKEN_ROW = "SELECT revoked_at, expires_at FROM api_tokens WHERE name = :token"
_SQLITE_INSERT_EVENT = """INSERT INTO lock_events
    (resource, action, owner, previous_owner, token, fence, acquired_at,
     expires_at, actor, reason, occurred_at)
VALUES (:resource, :action, :owner, :previous_owner, :token, :fence, :acquired_at,
        :expires_at, :actor, :reason, :occurred_at)"""
# The hot path's writes: SQL that both SQLite and MariaDB take (``DriverWrites``).
_WRITES = {
    "insert_lock": _SQLITE_INSERT_LOCK,
    "update_lock": _SQLITE_UPDATE_LOCK,
    "set_expiry": _SQLITE_SET_EXPIRY,
    "free": _SQLITE_FREE,
    "dequeue": _SQLITE_DEQUEUE,
    "insert_event": _SQLITE_INSERT_EVENT,
}


class DriverWrites:
    """The hot path's writes as SQL written once, which SQLite and MariaDB both
    take; ``_writes`` holds it in the form the dialect's ``DriverTransaction``
    runs (``:name`` text for sqlite3, ``FixedSQL`` for PyMySQL)."""

    _writes: dict[str, Any]

    def _write_grant(self, conn, row, resource, values) -> None:
        if row is None:
            conn.execute(self._writes["insert_lock"], {"resource": resource, **values})
        else:
            conn.execute(self._writes["update_lock"], {"id": row.id, **values})

    def _write_expiry(self, conn, row, expires_at) -> None:
        conn.execute(
            self._writes["set_expiry"], {"id": row.id, "expires_at": expires_at}
        )

    def _write_free(self, conn, row, now) -> None:
        conn.execute(self._writes["free"], {"id": row.id, "expires_at": now})

    def _dequeue(self, conn, waiter) -> None:
        conn.execute(self._writes["dequeue"], {"id": waiter})

    def _insert_event(self, conn, params) -> None:
        conn.execute(self._writes["insert_event"], params)


class SQLiteStatements(DriverWrites, TransactionalStatements):
    """``TransactionalStatements``' acquire, renew and release, run by the service
    on a ``DriverTransaction`` (``app.locks.driver``): the same BEGIN IMMEDIATE
    transaction and statements, as SQL written once. Through SQLAlchemy each
    statement's execution context, cache key and result object cost about three
    quarters of an acquire+release cycle's CPU. Operator actions stay on
    SQLAlchemy connections (``transactional``).
    """

    driver_transaction = "BEGIN IMMEDIATE"
    _writes = _WRITES

    def __init__(self) -> None:
        super().__init__("sqlite")
        self.transactional = TransactionalStatements("sqlite")
        # Read by ``clock_after_lock`` and ``_next_fence`` through conn.scalar.
        self._live_count = "SELECT " + _SQLITE_LIVE
        self._next_fence_statement = _SQLITE_NEXT_FENCE.format(unless="")
        self._next_fence_unless_frozen = _SQLITE_NEXT_FENCE.format(
            unless=" AND NOT EXISTS (" + _SQLITE_COVERING.format(columns="1") + ")"
        )
        self._sqlite_lock_row = {
            counting: _SQLITE_LOCK_ROW.format(
                queue=_SQLITE_QUEUE,
                live=",\n       " + _SQLITE_LIVE + " AS live" if counting else "",
            )
            for counting in (False, True)
        }
        self._sqlite_freeze_row = (
            _SQLITE_COVERING.format(
                columns="f.id, f.prefix, f.reason, f.actor, f.frozen_at, f.ends_at"
            )
            + " ORDER BY f.prefix LIMIT 1"
        )

    def lock_row(
        self, conn, resource, now, waiter=None, *, quota_token=None, max_locks=None
    ):
        counting = bool(max_locks) and quota_token is not None
        params: dict[str, Any] = {"resource": resource, "waiter": waiter, "now": now}
        if counting:
            params.update(quota_token=quota_token, max_locks=max_locks)
        return conn.one(self._sqlite_lock_row[counting], params)

    def freeze_of(self, conn, resource, now):
        return conn.one(self._sqlite_freeze_row, {"resource": resource, "now": now})

    def _token_row(self, conn, token, *, exclusive):
        # BEGIN IMMEDIATE already made this the only writer.
        return conn.one(_SQLITE_TOKEN_ROW, {"token": token})


class MariaDBStatements(DriverWrites, TransactionalStatements):
    """``TransactionalStatements``' acquire, renew and release on a
    ``DriverTransaction`` over PyMySQL, as ``SQLiteStatements`` does for SQLite:
    the same transaction and statements, each compiled once (the reads, from the
    same constructs, on first use) or written once (the writes, ``DriverWrites``).
    Through SQLAlchemy each of the 4–6 statements per operation cost 80–100 µs
    of Python for a round trip PyMySQL makes in about 15. Operator actions stay
    on SQLAlchemy connections (``transactional``).
    """

    # PyMySQL opens the transaction with the first statement; no BEGIN is sent.
    driver_transaction = ""
    _writes = {name: FixedSQL.written(sql) for name, sql in _WRITES.items()}

    def __init__(self, dialect_name: str = "mariadb") -> None:
        super().__init__(dialect_name)
        self.transactional = TransactionalStatements(dialect_name)
        self._dialect = _pyformat_mariadb_dialect()
        self._fixed_reads: dict[Any, FixedSQL] = {}

    def _row(self, conn, statement, params):
        return conn.one(self._compiled(statement), params)

    def _scalar(self, conn, statement, params=None):
        return conn.scalar(self._compiled(statement), params)

    def _compiled(self, statement) -> FixedSQL:
        """``statement`` (one of the prebuilt reads) as compiled SQL, once."""
        fixed = self._fixed_reads.get(statement)
        if fixed is None:
            fixed = self._fixed_reads[statement] = FixedSQL.compiled(
                statement, self._dialect
            )
        return fixed


def _pyformat_mariadb_dialect():
    """The MariaDB dialect of PyMySQL with ``%(name)s`` parameters, for
    compiling the hot reads once (no server is asked: 10.3 is the oldest
    supported, the first with sequences)."""
    from sqlalchemy.dialects.mysql.mariadb import loader

    dialect = loader("pymysql")(paramstyle="pyformat")
    dialect.server_version_info = (10, 3)
    dialect.supports_sequences = True
    return dialect


def statements_for(dialect_name: str):
    if dialect_name == "postgresql":
        return PostgresStatements()
    if dialect_name == "sqlite":
        return SQLiteStatements()
    if dialect_name == "mariadb":
        return MariaDBStatements()
    return TransactionalStatements(dialect_name)
