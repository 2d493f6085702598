"""Everything but PostgreSQL's hot path: a short transaction around a locking read
(``TransactionalStatements``). The hot path's writes as SQL written once for the
drivers of SQLite and MariaDB are in ``driver_writes``; the operator's sweeps of
stale locks in ``stale``."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    Row,
    and_,
    bindparam,
    case,
    delete,
    func,
    insert,
    literal,
    literal_column,
    null,
    select,
    update,
)
from sqlalchemy.types import Integer

from lockkeeper_core.columns import UTCDateTime
from lockkeeper_core.models import (
    EXCLUSIVE,
    NO_TOKEN,
    LockSession,
    fence_sequence,
)
from lockkeeper_core.state import Action, holds
from lockkeeper_core.statements.common import (
    ClaimView,
    Clock,
    LockRow,
    Outcome,
    api_tokens,
    clear_exclusive_grant,
    covering,
    events,
    fence_counter,
    freezes,
    holders,
    insert_lock_row,
    is_frozen,
    live_locks,
    locks,
    queue_columns,
    token_ended,
    token_or_none,
    waiters,
)
from lockkeeper_core.statements.details import (
    ended_bound_grant,
    session_expiry_event,
    took_over_from,
)
from lockkeeper_core.statements.holders import HoldersStatements
from lockkeeper_core.statements.stale import StaleStatements
from lockkeeper_core.statements.tokens import TokenLook, TokenStatements
from lockkeeper_core.values import Ask

_SERVER_NOW = {
    "postgresql": func.clock_timestamp,
    "mysql": lambda: func.utc_timestamp(6),
    "mariadb": lambda: func.utc_timestamp(6),
}


# Grants of one token in flight at once: at most one per server connection.
_MARGIN = {
    "postgresql": lambda: func.current_setting("max_connections").cast(Integer()),
    "mysql": lambda: literal_column("@@max_connections"),
    "mariadb": lambda: literal_column("@@max_connections"),
}

_INSERT_EVENT = insert(events)
lock_sessions = LockSession.__table__


class TransactionalStatements(StaleStatements, HoldersStatements, TokenStatements):
    """Locking read, then the clock, decision, write, event: one transaction per call.

    The clock is read in a statement AFTER the locking read has returned, so the
    decision and the timestamps it writes come from a moment at which this
    transaction holds the row. Read in the locking statement itself, the clock can
    be older than the wait for the row lock (MariaDB evaluates ``UTC_TIMESTAMP``
    when the statement starts): a grant decided after a release would record a
    time before that release, and judge expiry by that stale reading.
    """

    # What each dialect's statements declare, so the service asks, not probes:
    # ``autocommit`` (acquire, renew and release are one statement each),
    # ``driver_transaction`` (the hot path runs on the driver's connection,
    # opened with this SQL; None: on SQLAlchemy's) and ``transactional`` (the
    # statements of the operator's actions).
    autocommit = False
    driver_transaction: str | None = None

    def __init__(self, dialect_name: str) -> None:
        self.dialect_name = dialect_name
        self.transactional = self
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
        # Keyed by (reads the server clock, counts the token's live locks). On
        # SQLite that count is the quota's (its clock is the host's, read after
        # BEGIN IMMEDIATE). Elsewhere the quota's count rides on the clock read
        # that follows the token's row lock (``clock_after_lock``), and the
        # locking read's count is a first look that only picks how that row is
        # locked (``_far``): it comes with ``margin``, the server's
        # max_connections, on a row even where the resource has none (an outer
        # join from a one-row table; the lock columns are then NULL).
        self._margin = _MARGIN.get(dialect_name)
        self._lock_row = {}
        for on_server, now_column in ((False, given_now), (True, server_now)):
            if now_column is None:
                continue
            for counting in (False, True):
                columns = list(queue_columns(bindparam("resource"), now_column, waiter))
                if counting:
                    columns.append(live_locks(now_column).label("live"))
                query = select(locks, *columns)
                if counting and self._margin is not None:
                    one = select(literal(1).label("one")).subquery("one")
                    query = query.add_columns(self._margin().label("margin"))
                    query = query.select_from(one.outerjoin(locks, by_resource))
                else:
                    query = query.where(by_resource)
                self._lock_row[on_server, counting] = query.with_for_update()
        # SQLite with no row to ride on, and a grant after its token's row lock
        # elsewhere: the count alone.
        self._live_count = select(live_locks(given_now).label("live"))
        token_row = select(api_tokens.c.revoked_at, api_tokens.c.expires_at).where(
            api_tokens.c.name == bindparam("token")
        )
        # Keyed by "near a quota": then one new grant of the token at a time (its
        # count must see the grants before it); otherwise a shared lock, which
        # only a revocation and a grant near the quota wait for (``_far``).
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
            .where(fence_counter.c.id == 1, ~is_frozen(given_now))
            .values(value=fence_counter.c.value + 1)
            .returning(fence_counter.c.value)
        )
        self._freeze_row = (
            select(freezes)
            .where(covering(given_now))
            .order_by(freezes.c.prefix)
            .limit(1)
        )
        self._clock_statements: dict[tuple[bool, bool, bool, bool], Any] = {}
        self._bound_statement = select(lock_sessions.c.id).where(
            lock_sessions.c.id == bindparam("id"),
            lock_sessions.c.expires_at == bindparam("expires_at", type_=UTCDateTime()),
            lock_sessions.c.owner == bindparam("owner"),
            lock_sessions.c.token == bindparam("token"),
        )

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
                conditions.append(~is_frozen(clock.c.now))
                columns.append(is_frozen(clock.c.now).label("frozen"))
            if quota:
                reached = live_locks(clock.c.now) >= bindparam(
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
        ``max_locks``, also ``live``: how many live locks ``quota_token`` holds,
        counted up to ``max_locks``; where there is a server (not SQLite), also
        ``margin`` (max_connections), and a row always comes back: its lock
        columns are NULL when ``resource`` has none."""
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
        details=None,
    ) -> Outcome:
        if action is not Action.REACQUIRED:
            fence = _above_replaced(fence, row)
        values = {
            "owner": owner,
            "token": token,
            "fence": fence,
            "acquired_at": now,
            "expires_at": now + timedelta(seconds=ttl),
        }
        if (
            action is not Action.REACQUIRED
            and row is not None
            and row.places_until is not None
        ):
            self._clear_holders(conn, resource, now)
        self._write_grant(
            conn, row, resource, values, new_tenure=action is not Action.REACQUIRED
        )
        granted = LockRow(
            resource=resource,
            waiters=row.waiters if row is not None else 0,
            **values,
        )
        previous_owner = row.owner if row is not None else None
        if action is Action.TOOK_OVER and previous_owner is not None:
            details = took_over_from(details, row.token)
        if action is not Action.REACQUIRED and previous_owner is not None:
            # A take-over or a claim replaced another tenure's grant.
            details = ended_bound_grant(details, row.session_id, row.expires_at)
        self._log(
            conn, action, granted, previous_owner, token, actor, reason, now,
            details=details,
        )  # fmt: skip
        return Outcome(True, action, granted, now)

    def _log(
        self,
        conn,
        action,
        lock,
        previous_owner,
        token,
        actor,
        reason,
        now,
        mode=EXCLUSIVE,
        details=None,
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
                "mode": mode,
                "details": details,
            },
        )

    # The hot path's writes, one method each so ``SQLiteStatements`` can send
    # them as fixed SQL.

    def _write_grant(self, conn, row, resource, values, *, new_tenure=True) -> None:
        """Write the exclusive grant. A new tenure makes the row exclusive, of
        limit 1, held by no holders and bound to no session (a previous tenure's
        session must not extend it)."""
        if row is None:
            insert_lock_row(conn, {"resource": resource, **values})
        elif new_tenure:
            conn.execute(
                update(locks)
                .where(locks.c.id == row.id)
                .values(**values, holder_limit=1, places_until=None, session_id=None)
            )
        else:
            conn.execute(update(locks).where(locks.c.id == row.id).values(**values))

    def _clear_holders(self, conn, resource, now) -> None:
        """A new exclusive tenure on a row that holders held, all run out (a
        live one sends the acquire down the holders path, and a claim is
        refused or takes a holder) deletes them. Those bound to a session ran
        out at their session's expiry: a ``released`` event each
        (``session_expiry_event``) before the grant's, as the holders path
        writes for the holders it clears; once the session's row is gone
        nothing else would say when."""
        for holder_row in self._holders_to_clear(conn, resource):
            if holder_row.session_id is not None and holder_row.expires_at <= now:
                self._insert_event(
                    conn, session_expiry_event(holder_row, holder_row.mode)
                )
        self._delete_holders(conn, resource)

    def _holders_to_clear(self, conn, resource) -> list[Any]:
        return conn.execute(
            select(holders)
            .where(holders.c.resource == resource)
            .order_by(holders.c.expires_at, holders.c.id)
        ).all()

    def _delete_holders(self, conn, resource) -> None:
        conn.execute(delete(holders).where(holders.c.resource == resource))

    def _write_expiry(self, conn, row, expires_at) -> None:
        conn.execute(
            update(locks).where(locks.c.id == row.id).values(expires_at=expires_at)
        )

    def _write_free(self, conn, row, now) -> None:
        conn.execute(clear_exclusive_grant([row.id], now))

    def _dequeue(self, conn, waiter) -> None:
        conn.execute(delete(waiters).where(waiters.c.id == waiter))

    def _insert_event(self, conn, params) -> None:
        conn.execute(_INSERT_EVENT, params)

    # -- operations ---------------------------------------------------------

    def acquire(self, conn, ask: Ask, now, waiter=None) -> Outcome:
        resource, owner, token = ask.resource, ask.owner, ask.token
        ttl, actor, max_locks = ask.ttl, ask.actor, ask.max_locks
        counting = bool(max_locks) and token is not None
        checks_token = token is not None and token != NO_TOKEN
        # SQLite has one writer at a time: its count rides on the locking read.
        # Elsewhere the count follows the token's row lock, so two parallel new
        # grants of one token cannot both count the same free place; the locking
        # read takes a first look (``_far``) that picks how that row is locked,
        # or on MariaDB's hot path the call that locks it picks (``in_call``).
        count_on_read = counting and not self.uses_sequence
        in_call = self._picks_token_lock_in_call(now)
        first_look = (
            counting and checks_token and self._margin is not None and not in_call
        )
        row = self.lock_row(
            conn,
            resource,
            now,
            waiter,
            quota_token=token if count_on_read or first_look else None,
            max_locks=max_locks if count_on_read or first_look else None,
        )
        # Under a quota, the limit the count after the token's row lock is held
        # to: the quota itself, or nearer when the token is far from it.
        far, limit = False, max_locks
        if first_look:
            far, limit = self._far(row, max_locks)
            if row.id is None:
                row = None  # no lock row: only the first look came back
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
                look = self._token_then_clock(
                    conn,
                    token,
                    now,
                    TokenLook(max_locks if counting else None, far, limit, in_call),
                    resource=resource,
                )
                token_row, far = look.row, look.far
                now, fence, frozen, over_quota = look.clock
                token_locked = True
            else:
                now, fence, frozen, over_quota = self.clock_after_lock(
                    conn,
                    now,
                    fence=True,
                    fence_unless_valid_until=row.expires_at if held else None,
                    unless_frozen=resource,
                    quota_token=token if count_on_read else None,
                    max_locks=limit if count_on_read else None,
                    live=row.live if count_on_read and row is not None else None,
                )
        if (
            row is not None
            and row.places_until is not None
            and row.places_until > now
            and not (held and holds(row, owner, token) and row.expires_at > now)
        ):
            # Held by holders: the holders path decides (busy, or a mismatch).
            return Outcome(False, None, row, now, held_by_holders=True)
        if not held:
            action = Action.ACQUIRED
        elif row.expires_at <= now:
            action = Action.TOOK_OVER
        elif holds(row, owner, token):
            if row.session_id is not None and self._session_bound(conn, row):
                # Bound to a session: its expiry is the session's, and a plain
                # re-acquire would cut it loose (the service says so).
                return Outcome(False, None, row, now)
            action, fence = Action.REACQUIRED, row.fence
        else:
            return Outcome(False, None, row, now)
        holder = row if held else None
        if action is not Action.REACQUIRED and checks_token:
            # A new tenure: the token must be live where the grant commits.
            if not token_locked:
                # A take-over: the token's row locked now, and the quota
                # counted after that lock.
                look = self._token_then_count(
                    conn,
                    token,
                    now,
                    TokenLook(
                        max_locks if counting and not count_on_read else None,
                        far,
                        limit,
                        in_call,
                    ),
                )
                token_row, far = look.row, look.far
                over_quota = over_quota or look.over_quota
            if token_ended(token_row, now):
                return Outcome(False, None, holder, now, token_ended=True)
        if action is not Action.REACQUIRED and frozen:
            return Outcome(False, None, row, now, self.freeze_of(conn, resource, now))
        if action is not Action.REACQUIRED and over_quota:
            if far:
                # Shared, but no longer far from the quota: not granted, nothing
                # written (no fence was drawn); the service tries again, and the
                # next first look (MariaDB's hot path: the hint its call left)
                # takes the token's row alone.
                return Outcome(False, None, holder, now)
            # Only a new grant counts against the quota; nothing is written.
            return Outcome(False, None, holder, now, over_quota=True)
        outcome = self._grant(
            conn, row, resource, owner, token, fence, now, ttl, action, actor
        )
        if waiter is not None:
            self._dequeue(conn, waiter)
        return outcome

    def renew(self, conn, resource, owner, token, ttl, actor, now) -> Outcome:
        row = self.lock_row(conn, resource, now)
        now = self.clock_after_lock(conn, now).now
        if row is None or not holds(row, owner, token) or row.expires_at <= now:
            return Outcome(False, None, row, now)
        if row.session_id is not None and self._session_bound(conn, row):
            # Renewed by its session's heartbeat only (the service says so).
            return Outcome(False, None, row, now)
        expires_at = now + timedelta(seconds=ttl)
        self._write_expiry(conn, row, expires_at)
        renewed = LockRow.of(row, expires_at=expires_at)
        self._log(conn, Action.RENEWED, renewed, owner, token, actor, None, now)
        return Outcome(True, Action.RENEWED, renewed, now)

    def _session_bound(self, conn, row) -> bool:
        """Whether ``row``'s grant is bound to its session (migration 0014's
        rule): the session's expiry is the row's, same holder. Asked only for a
        row with a ``session_id``."""
        return (
            self._scalar(
                conn,
                self._bound_statement,
                {
                    "id": row.session_id,
                    "expires_at": row.expires_at,
                    "owner": row.owner,
                    "token": row.token,
                },
            )
            is not None
        )

    def release(
        self, conn, resource, owner, token, actor, now, details=None
    ) -> Outcome:
        row = self.lock_row(conn, resource, now)
        now = self.clock_after_lock(conn, now).now
        if row is None or not holds(row, owner, token) or row.expires_at <= now:
            return Outcome(False, None, row, now)
        return self._remove(
            conn, row, Action.RELEASED, token, actor, None, now, details=details
        )

    # The operator's actions come in steps the service composes inside one
    # transaction: lock the row (and read the clock), apply its rule, write.

    def locked(self, conn, resource, now) -> tuple[Row | None, datetime]:
        """The row of ``resource`` locked until commit, and the deciding clock
        read after that lock."""
        row = self.lock_row(conn, resource, now)
        return row, self.clock_after_lock(conn, now).now

    def force_remove(self, conn, row, now, *, actor, reason) -> Outcome:
        """End the grant on the locked ``row`` whoever holds it."""
        return self._remove(
            conn, row, Action.FORCE_RELEASED, row.token, actor, reason, now
        )

    def claim_view(self, conn, resource, token, now, *, frozen_too) -> ClaimView:
        """What a claim of ``resource`` for ``token`` decides on: the locked row,
        the clock and a new fence read after that lock, the freeze in force
        (unless ``frozen_too``) and whether ``token`` (unless NO_TOKEN) has
        ended. Writes nothing; the fence is drawn unless a freeze covers it."""
        row = self.lock_row(conn, resource, now)
        now, fence, frozen, _ = self.clock_after_lock(
            conn, now, fence=True, unless_frozen=None if frozen_too else resource
        )
        if token != NO_TOKEN:
            # The token the grant is bound to must be live where it commits.
            found = self._token_row(conn, token, exclusive=False)
            if found is None or token_ended(found, now):
                return ClaimView(row, now, None, None, token_ended=True)
        freeze = self.freeze_of(conn, resource, now) if frozen else None
        return ClaimView(row, now, fence, freeze)

    def write_claim(
        self,
        conn,
        view: ClaimView,
        resource,
        owner,
        token,
        ttl,
        *,
        actor,
        reason,
        takes_from_holder: bool,
    ) -> Outcome:
        """Grant ``resource`` to (``token``, ``owner``) with ``view``'s fence;
        ``token`` NO_TOKEN: bound to no token."""
        action = Action.FORCE_CLAIMED if takes_from_holder else Action.CLAIMED
        return self._grant(
            conn,
            view.row,
            resource,
            owner,
            token,
            view.fence,
            view.now,
            ttl,
            action,
            actor,
            reason,
        )

    def _remove(
        self, conn, row, action, token, actor, reason, now, details=None
    ) -> Outcome:
        """Free the row (see ``DistributedLock``); the event says when it ended
        (and ``details``, what the releasing worker reported)."""
        self._write_free(conn, row, now)
        ended = LockRow.of(row, expires_at=now)
        if action is Action.FORCE_RELEASED:
            details = ended_bound_grant(details, row.session_id, row.expires_at)
        self._log(
            conn, action, ended, row.owner, token, actor, reason, now, details=details
        )
        return Outcome(True, action, ended, now)


def _above_replaced(fence: int, row) -> int:
    """A new tenure's fence: the sequence's draw, raised above the fence of the
    grant it replaces when the draw is not. On one server the draw always is,
    and on a Galera node too since its sequence has no cache (migration 0038: a
    node has applied the draw of the grant it replaces, with that grant). With
    a cache each node drew from its own block, below a grant another node had
    committed just before; the row is what orders them, since certification
    aborts a write of it from a node that had not seen the other's (error
    1213, retried)."""
    if row is None or row.fence is None:
        return fence
    return max(fence, row.fence + 1)
