"""The SQL of sessions: create, heartbeat, end, read, and the session-bound acquire.

A grant is bound to a session when its row carries the session's id, its holder
is (the session's token, the session's owner) and its ``expires_at`` is the
session's: a heartbeat moves all three expiries together, so "is the grant
stale" stays one comparison of the grant's own ``expires_at``. A row whose
``session_id`` outlived its binding (a take-over after expiry, a re-acquire or a
release through the lock statements, which do not clear the column) no longer
has the session's expiry, so nothing here takes it for a bound grant.

Lock order (``lockkeeper_core.statements``), every dialect: the session's row first,
then the resources' rows in resource order, then their ``lock_holders`` rows
(and, a new tenure, the token's row before those). A session-bound acquire takes
the session's row ``FOR SHARE`` (parallel acquires in one session go on side by
side; a heartbeat or an end waits for them, and they for it), then the resource's
row; the clock is read after both, so a grant never outlives its session. A
create under a share of sessions locks its token's row alone, then inserts.

The heartbeat is one statement on PostgreSQL (a function,
``sql/postgresql/lockkeeper_heartbeat.sql``, on the driver's autocommit
connection); elsewhere one short transaction. It reads the clock once the
session's row and its resources' rows are held, as an acquire does once its
rows are.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import (
    and_,
    bindparam,
    delete,
    func,
    insert,
    or_,
    select,
    update,
)

from lockkeeper_core.columns import UTCDateTime
from lockkeeper_core.driver import DriverSQL
from lockkeeper_core.errors import InvalidInput
from lockkeeper_core.models import EXCLUSIVE, NO_TOKEN, LockHolder, LockSession
from lockkeeper_core.state import Action, holds
from lockkeeper_core.statements.common import (
    LockRow,
    Outcome,
    SessionEnded,
    api_tokens,
    clear_exclusive_grant,
    delete_where_in,
    events,
    insert_lock_row,
    locks,
    queue_columns,
    through_names,
    token_ended,
    token_or_none,
)
from lockkeeper_core.statements.details import (
    ended_bound_grant,
    session_expiry_event,
    took_over_from,
    with_session,
)
from lockkeeper_core.statements.transaction import TransactionalStatements
from lockkeeper_core.values import Ask

sessions = LockSession.__table__
holders = LockHolder.__table__

# PostgreSQL: the heartbeat is one call of a function (its SQL in
# ``sql/postgresql/lockkeeper_heartbeat.sql``, why it is a function in migration
# 0013): lock the session's row, read the clock after that lock, move the
# session's expiry and with it every grant still bound to it.
# A refused heartbeat changes nothing; no row at all: unknown or another token's.
_PG_HEARTBEAT = DriverSQL("SELECT * FROM lockkeeper_heartbeat(:id, :token, :now)")


@dataclass(frozen=True, slots=True)
class SessionRow:
    id: str
    owner: str
    token: str
    ttl: float
    created_at: datetime
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """What a heartbeat found: ``session`` (None: unknown or another token's),
    ``done`` (renewed; false with a session: it had expired), ``renewed`` (how
    many grants moved with it) and the deciding clock."""

    session: SessionRow | None
    done: bool
    renewed: int
    now: datetime


@dataclass(frozen=True, slots=True)
class Ended:
    """What ending a session did: the session as it was, the grants released
    (exclusive rows and holders, each with its waiters), and the clock."""

    session: SessionRow | None
    released: list[LockRow]
    now: datetime
    expired: bool = False


@dataclass(frozen=True, slots=True)
class SessionsFull:
    """A create refused: the token already has ``limit`` live sessions, the
    soonest of which expires at ``soonest``, by the deciding clock ``now``."""

    limit: int
    soonest: datetime
    now: datetime


class SessionNotFound(Exception):
    """Raised inside a transaction: no session of this id for this token."""


def _session(row) -> SessionRow:
    return SessionRow(
        row.id, row.owner, row.token, row.ttl, row.created_at, row.expires_at
    )


def bound_to(session_id, owner, token, expires_at):
    """The exclusive rows bound to the session (see the module's docstring)."""
    return and_(
        locks.c.session_id == session_id,
        locks.c.owner == owner,
        locks.c.token == token,
        locks.c.expires_at == expires_at,
    )


def holders_of(session_id, token, expires_at):
    return and_(
        holders.c.session_id == session_id,
        holders.c.token == token,
        holders.c.expires_at == expires_at,
    )


def _still_bound(row, session: SessionRow) -> bool:
    """``row`` (an exclusive row) is bound to ``session``: ``bound_to``."""
    return (
        row.session_id == session.id
        and row.owner == session.owner
        and row.token == session.token
        and row.expires_at == session.expires_at
    )


def _still_bound(row, session: SessionRow) -> bool:
    """``row`` (a holder) is bound to ``session``: ``holders_of``."""
    return (
        row.session_id == session.id
        and row.token == session.token
        and row.expires_at == session.expires_at
    )


def _ending(
    grant: LockRow,
    action: Action,
    at: datetime,
    modes,
    *,
    actor: str | None,
    reason: str | None,
    details: str | None = None,
) -> dict:
    """The event of ``grant``'s end at ``at``."""
    return {
        "resource": grant.resource,
        "action": action.value,
        "owner": grant.owner,
        "previous_owner": grant.owner,
        "token": token_or_none(grant.token),
        "fence": grant.fence,
        "acquired_at": grant.acquired_at,
        "expires_at": at,
        "actor": actor,
        "reason": reason,
        "occurred_at": at,
        "mode": modes.get(grant.resource, EXCLUSIVE),
        "details": details,
    }


def _log_expiries(
    conn,
    ran_out: dict[str, SessionRow],
    rows,
    holder_rows,
    *,
    remove: bool,
    remove_holders: bool | None = None,
) -> None:
    """End the grants among ``rows`` (exclusive, locked) and ``holder_rows``
    (locked) still bound to one of the expired sessions ``ran_out`` (by id) as
    of its expiry, as their sessions' rows are deleted: a ``released`` event
    at that instant each, its details naming the session and that it expired
    (``SESSION_EXPIRED``), and with ``remove`` the grant gone (the row free
    with its expiry kept, the place deleted; a purge deletes them next).
    Without the event, once the session's row is gone, nothing would say when
    its heartbeats stopped renewing them; without the grant gone, a row still
    stale would contradict it (a later force-release would end the same
    tenure a second time). ``remove_holders``: the holders only (None: as
    ``remove``)."""
    if remove_holders is None:
        remove_holders = remove
    exclusive = [
        row
        for row in rows
        if row.session_id in ran_out and _still_bound(row, ran_out[row.session_id])
    ]
    from_holders = [
        row
        for row in holder_rows
        if row.session_id in ran_out and _still_bound(row, ran_out[row.session_id])
    ]
    if not exclusive and not from_holders:
        return
    # Still bound: each one's expiry is its session's.
    conn.execute(
        insert(events),
        [
            *(session_expiry_event(row, EXCLUSIVE) for row in exclusive),
            *(session_expiry_event(row, row.mode) for row in from_holders),
        ],
    )
    if remove_holders:
        _remove_holders(conn, from_holders)
    if remove and exclusive:
        conn.execute(clear_exclusive_grant([row.id for row in exclusive]))


def _remove_holders(conn, holder_rows) -> None:
    """Delete the holder rows ``holder_rows`` (locked, their resources' rows first)
    and bring their resources' ``places_until`` down to the holders left."""
    if not holder_rows:
        return
    delete_where_in(conn, holders.c.id, [row.id for row in holder_rows])
    latest = (
        select(func.max(holders.c.expires_at))
        .where(holders.c.resource == locks.c.resource)
        .scalar_subquery()
    )
    conn.execute(
        update(locks)
        .where(locks.c.resource.in_({row.resource for row in holder_rows}))
        .values(places_until=latest)
    )


class SessionStatements:
    """The sessions' statements, on top of a dialect's ``TransactionalStatements``
    (its locking reads, clock and fences)."""

    def __init__(self, transactional: TransactionalStatements) -> None:
        self.t = transactional
        self.dialect_name = transactional.dialect_name
        self._session_row = {
            share: select(sessions)
            .where(sessions.c.id == bindparam("id"))
            .with_for_update(read=share)
            for share in (False, True)
        }
        self._token_row = (
            select(api_tokens.c.name)
            .where(api_tokens.c.name == bindparam("token"))
            .with_for_update()
        )
        of_token = and_(
            sessions.c.token == bindparam("token"),
            sessions.c.expires_at > bindparam("now", type_=UTCDateTime()),
        )
        self._live_of_token = select(
            func.count().label("count"),
            func.min(sessions.c.expires_at).label("soonest"),
        ).where(of_token)

    # -- reads ---------------------------------------------------------------

    def _lock_resources(self, conn, exclusive, from_holders, *columns) -> list:
        """The rows (with ``columns``) of the resources that ``exclusive`` (a
        condition on ``distributed_locks``) or ``from_holders`` (one on
        ``lock_holders``) find, locked in resource order (the lock order).
        Which resources is read first, without locks: a locking read whose
        condition reads ``lock_holders`` would lock the rows it reads there
        too, before the resources' rows (MariaDB turns such a subquery into a
        join, all of whose rows FOR UPDATE locks). The caller holds the
        session's row, so no grant binds itself to the session meanwhile."""
        resources = set(conn.scalars(select(locks.c.resource).where(exclusive)))
        resources.update(conn.scalars(select(holders.c.resource).where(from_holders)))
        if not resources:
            return []
        return conn.execute(
            through_names(
                select(locks, *columns)
                .where(locks.c.resource.in_(sorted(resources)))
                .order_by(locks.c.resource)
                .with_for_update()
            )
        ).all()

    def lock_session(
        self, conn, session_id: str, *, share: bool = False
    ) -> SessionRow | None:
        row = conn.execute(self._session_row[share], {"id": session_id}).one_or_none()
        return _session(row) if row is not None else None

    def read(self, conn, session_id: str, now: datetime | None):
        """The session (None: unknown), its live grants and the clock, unlocked."""
        found = conn.execute(
            select(sessions).where(sessions.c.id == session_id)
        ).one_or_none()
        now = now if now is not None else self.t.read_now(conn)
        if found is None:
            return None, [], now
        session = _session(found)
        waiting, _ = queue_columns(locks.c.resource, now)
        exclusive = conn.execute(
            select(locks, waiting)
            .where(
                bound_to(session.id, session.owner, session.token, session.expires_at)
            )
            .order_by(locks.c.resource)
        ).all()
        waiting, _ = queue_columns(holders.c.resource, now)
        holder_rows = conn.execute(
            select(holders, waiting)
            .where(holders_of(session.id, session.token, session.expires_at))
            .order_by(holders.c.resource)
        ).all()
        grants = sorted([*exclusive, *holder_rows], key=lambda row: row.resource)
        return session, grants, now

    def listing(
        self, conn, limit: int, now: datetime | None
    ) -> tuple[list[tuple[SessionRow, int]], datetime]:
        """The sessions, the longest overdue first (the earliest expiry), each
        with how many grants are still bound to it (live, or stale once it
        expired and before it is purged), and the clock; unlocked."""
        bound = (
            select(func.count())
            .select_from(locks)
            .where(
                bound_to(
                    sessions.c.id,
                    sessions.c.owner,
                    sessions.c.token,
                    sessions.c.expires_at,
                )
            )
            .scalar_subquery()
        )
        from_holders = (
            select(func.count())
            .select_from(holders)
            .where(holders_of(sessions.c.id, sessions.c.token, sessions.c.expires_at))
            .scalar_subquery()
        )
        rows = conn.execute(
            select(sessions, bound.label("bound"), from_holders.label("from_holders"))
            .order_by(sessions.c.expires_at, sessions.c.id)
            .limit(limit)
        ).all()
        now = now if now is not None else self.t.read_now(conn)
        return [(_session(row), row.bound + row.from_holders) for row in rows], now

    def live_count(self, conn, now: datetime | None) -> int:
        at = now if now is not None else self.t._server_now().cast(UTCDateTime())
        return conn.scalar(
            select(func.count()).select_from(sessions).where(sessions.c.expires_at > at)
        )

    def session_of(self, conn, resource: str) -> SessionRow | None:
        """The session the grant on ``resource`` is bound to (exclusive row or a
        holder), if any; unlocked."""
        exclusive = (
            select(sessions)
            .join(locks, locks.c.session_id == sessions.c.id)
            .where(
                locks.c.resource == resource,
                bound_to(
                    sessions.c.id,
                    sessions.c.owner,
                    sessions.c.token,
                    sessions.c.expires_at,
                ),
            )
        )
        found = conn.execute(exclusive).first()
        if found is None:
            holder_rows = (
                select(sessions)
                .join(holders, holders.c.session_id == sessions.c.id)
                .where(
                    holders.c.resource == resource,
                    holders_of(sessions.c.id, sessions.c.token, sessions.c.expires_at),
                )
                .order_by(sessions.c.expires_at.desc())
            )
            found = conn.execute(holder_rows).first()
        return _session(found) if found is not None else None

    # -- writes --------------------------------------------------------------

    def create(
        self, conn, session_id, owner, token, ttl, now, *, max_sessions: int = 0
    ) -> SessionRow | SessionsFull:
        """Insert the session, or with ``max_sessions`` (0: no limit) refuse it
        when ``token`` already has that many live ones by the deciding clock.

        The count is exact under parallel creates: the token's row is locked
        for update first (nothing else is locked before it), so one new session
        of a token is decided at a time, and each counts after the ones before
        it committed (READ COMMITTED; SQLite: one writer)."""
        if max_sessions:
            conn.execute(self._token_row, {"token": token})
        now = self.t.clock_after_lock(conn, now).now
        if max_sessions:
            live = conn.execute(
                self._live_of_token, {"token": token, "now": now, "limit": max_sessions}
            ).one()
            if live.count >= max_sessions:
                return SessionsFull(max_sessions, live.soonest, now)
        session = SessionRow(
            session_id, owner, token, ttl, now, now + timedelta(seconds=ttl)
        )
        conn.execute(
            insert(sessions).values(
                id=session.id,
                owner=owner,
                token=token,
                ttl=ttl,
                created_at=session.created_at,
                expires_at=session.expires_at,
            )
        )
        return session

    def heartbeat_statement(self, driver, session_id, token, now) -> Heartbeat:
        """PostgreSQL: the heartbeat as one statement on ``driver``."""
        row = driver.one(_PG_HEARTBEAT, {"id": session_id, "token": token, "now": now})
        if row is None:
            return Heartbeat(None, False, 0, now or self._pg_now(driver))
        return Heartbeat(_session(row), row.done, row.renewed or 0, row.now)

    @staticmethod
    def _pg_now(driver) -> datetime:
        return driver.one(DriverSQL("SELECT clock_timestamp() AS now"), {}).now

    def heartbeat(self, conn, session_id, token, now) -> Heartbeat:
        """Elsewhere: the same steps in one transaction."""
        session = self.lock_session(conn, session_id)
        if session is None or session.token != token:
            return Heartbeat(None, False, 0, self.t.clock_after_lock(conn, now).now)
        was = session.expires_at
        # The resources' rows in resource order, before their holders (the
        # lock order): the updates below would take them in whatever order
        # their plans meet them. SQLite's one writer needs no row locks.
        bound = bound_to(session.id, session.owner, session.token, was)
        if self.dialect_name != "sqlite":
            self._lock_resources(
                conn, bound, holders_of(session.id, session.token, was)
            )
        # The clock once those rows are held (migration 0031): a grant of the
        # session taken over while this waited for its row (its session run
        # out by the taker's clock) makes this clock later still, and the
        # heartbeat is refused rather than renewing a session whose grant went.
        now = self.t.clock_after_lock(conn, now).now
        if session.expires_at <= now:
            return Heartbeat(session, False, 0, now)
        expires_at = now + timedelta(seconds=session.ttl)
        conn.execute(
            update(sessions)
            .where(sessions.c.id == session.id)
            .values(expires_at=expires_at)
        )
        on_holders = (
            select(holders.c.resource)
            .where(holders_of(session.id, session.token, was))
            .scalar_subquery()
        )
        grants = conn.execute(
            update(locks).where(bound).values(expires_at=expires_at)
        ).rowcount
        conn.execute(
            update(locks)
            .where(
                locks.c.resource.in_(on_holders),
                or_(
                    locks.c.places_until.is_(None),
                    locks.c.places_until < expires_at,
                ),
            )
            .values(places_until=expires_at)
        )
        holder_rows = conn.execute(
            update(holders)
            .where(holders_of(session.id, session.token, was))
            .values(expires_at=expires_at)
        ).rowcount
        renewed = SessionRow(
            session.id,
            session.owner,
            session.token,
            session.ttl,
            session.created_at,
            expires_at,
        )
        return Heartbeat(renewed, True, grants + holder_rows, now)

    def end(
        self,
        conn,
        session_id: str,
        token: str | None,
        now: datetime | None,
        *,
        actor: str | None,
        reason: str | None,
        action: Action,
    ) -> Ended:
        """Release every grant bound to the session (one event each) and delete
        it. ``token`` None: an operator's end, whoever's session it is."""
        session = self.lock_session(conn, session_id)
        if session is None or (token is not None and session.token != token):
            now = self.t.clock_after_lock(conn, now).now
            return Ended(None, [], now)
        # The resources' rows first (in resource order), then their holders.
        waiting, _ = queue_columns(
            locks.c.resource,
            now if now is not None else self.t._server_now().cast(UTCDateTime()),
        )
        bound = bound_to(session.id, session.owner, session.token, session.expires_at)
        rows = self._lock_resources(
            conn,
            bound,
            holders_of(session.id, session.token, session.expires_at),
            waiting,
        )
        holder_rows = conn.execute(
            select(holders)
            .where(holders_of(session.id, session.token, session.expires_at))
            .order_by(holders.c.resource)
            .with_for_update()
        ).all()
        now = self.t.clock_after_lock(conn, now).now
        conn.execute(delete(sessions).where(sessions.c.id == session.id))
        exclusive = [row for row in rows if _still_bound(row, session)]
        if session.expires_at <= now:
            # Its grants went stale with it; a late end revives none of them,
            # and ends them as of its expiry (its row, which said when, is gone).
            _log_expiries(
                conn, {session.id: session}, exclusive, holder_rows, remove=True
            )
            return Ended(session, [], now, expired=True)
        released: list[LockRow] = []
        waiters_of = {row.resource: row.waiters for row in rows}
        if exclusive:
            conn.execute(clear_exclusive_grant([row.id for row in exclusive], now))
            for row in exclusive:
                released.append(LockRow.of(row, expires_at=now))
        if holder_rows:
            _remove_holders(conn, holder_rows)
            for row in holder_rows:
                released.append(
                    LockRow.of(
                        row, expires_at=now, waiters=waiters_of.get(row.resource, 0)
                    )
                )
        modes = {row.resource: getattr(row, "mode", EXCLUSIVE) for row in holder_rows}
        if released:
            conn.execute(
                insert(events),
                [
                    _ending(grant, action, now, modes, actor=actor, reason=reason)
                    for grant in released
                ],
            )
        return Ended(session, released, now)

    def purge_expired_batch(
        self, conn, cutoff: datetime, batch: int
    ) -> tuple[int, list[str]]:
        """Delete up to ``batch`` sessions expired at or before ``cutoff`` (their
        grants went stale with them, and each still bound is recorded as run
        out at its session's expiry), with the rows of their exclusive grants
        that a purge at ``cutoff`` deletes; returns how many sessions, and the
        resources whose rows went with them."""
        found = conn.execute(
            select(sessions)
            .where(sessions.c.expires_at <= cutoff)
            .order_by(sessions.c.expires_at)
            .limit(batch)
            .with_for_update()
        ).all()
        if not found:
            return 0, []
        ran_out = {row.id: _session(row) for row in found}
        ids = list(ran_out)
        # The lock order: the sessions' rows (above), the resources' rows in
        # resource order, then their holders.
        rows = self._lock_resources(
            conn,
            locks.c.session_id.in_(ids),
            holders.c.session_id.in_(ids),
            self.t.purgeable(cutoff).label("purgeable"),
        )
        holder_rows = conn.execute(
            select(holders)
            .where(holders.c.session_id.in_(ids))
            .order_by(holders.c.resource)
            .with_for_update()
        ).all()
        _log_expiries(
            conn,
            ran_out,
            [r for r in rows if r.session_id in ran_out],
            holder_rows,
            # The exclusive rows are deleted below, as the stale purge would
            # (it reports them). A holder goes now: its resource's row stays
            # while another holder lives past the cutoff, and a holder left
            # behind would be ended a second time by a later force-release.
            remove=False,
            remove_holders=True,
        )
        # In this transaction, not the stale purge's next one: a row left
        # stale after its end was recorded could be taken over or
        # force-released meanwhile, ending the same tenure a second time.
        purged = [r for r in rows if r.session_id in ran_out and r.purgeable]
        self.t.delete_purged(conn, purged)
        delete_where_in(conn, sessions.c.id, ids)
        return len(ids), [r.resource for r in purged if r.owner is not None]

    # -- the session-bound acquire -------------------------------------------

    def acquire(
        self, conn, ask: Ask, session_id: str, now: datetime | None, waiter=None
    ) -> Outcome:
        """``TransactionalStatements.acquire`` for a grant bound to the session:
        its expiry is the session's and its row carries the session's id.

        :raise SessionNotFound: no such session of ``ask.token``.
        :raise SessionEnded: the session has expired by the deciding clock.
        :raise InvalidInput: ``ask.owner`` is not the session's owner.
        """
        t = self.t
        resource, owner, token = ask.resource, ask.owner, ask.token
        session = self.lock_session(conn, session_id, share=True)
        if session is None or session.token != (token or NO_TOKEN):
            raise SessionNotFound(session_id)
        if session.owner != owner:
            raise InvalidInput(
                [("owner", f"must be the session's owner, {session.owner!r}")]
            )
        if ask.limit != 1 or ask.mode != EXCLUSIVE:
            # A semaphore's holder or a shared grant: the holders path, bound.
            return t.acquire_holder(conn, ask, now, waiter, session=session)
        max_locks = ask.max_locks
        counting = bool(max_locks) and token is not None
        checks_token = token is not None and token != NO_TOKEN
        # The grant is the session's holder's, recorded under the session's
        # token: a caller with none (None) binds to a session of NO_TOKEN, and
        # a NULL token would be a grant its heartbeat and end do not find.
        token = session.token
        row = t.lock_row(conn, resource, now, waiter)
        held = row is not None and row.owner is not None
        token_row = None
        if checks_token:
            token_row = t._token_row(conn, token, exclusive=counting)
        clock = t.clock_after_lock(
            conn,
            now,
            fence=True,
            fence_unless_valid_until=row.expires_at if held else None,
            unless_frozen=resource,
            quota_token=token if counting else None,
            max_locks=max_locks if counting else None,
        )
        now = clock.now
        if session.expires_at <= now:
            raise SessionEnded(session)
        holders_held = (
            row is not None and row.places_until is not None and row.places_until > now
        )
        if not held:
            action = Action.ACQUIRED
        elif row.expires_at <= now:
            action = Action.TOOK_OVER
        elif holds(row, owner, token):
            action = Action.REACQUIRED
        else:
            return Outcome(False, None, row, now)
        if holders_held:
            # Held by holders: the holders path answers as it does an unbound
            # acquire (the grant that ends first, a limit mismatch, a
            # promotion of the session's own sole shared grant), bound.
            return t.acquire_holder(conn, ask, now, waiter, session=session)
        behind = row is not None and row.ahead and action is not Action.REACQUIRED
        if behind:
            return Outcome(False, None, row, now)
        holder = row if held else None
        if action is not Action.REACQUIRED:
            if checks_token and token_ended(token_row, now):
                return Outcome(False, None, holder, now, token_ended=True)
            if clock.frozen:
                return Outcome(False, None, row, now, t.freeze_of(conn, resource, now))
            if clock.over_quota:
                return Outcome(False, None, holder, now, over_quota=True)
            fence = clock.fence
        else:
            fence = row.fence
        values = {
            "owner": owner,
            "token": token,
            "fence": fence,
            "acquired_at": now,
            "expires_at": session.expires_at,
            "session_id": session.id,
        }
        if row is None:
            insert_lock_row(conn, {"resource": resource, **values})
        else:
            # The resource is free of holders (``holders_held`` above): the grant
            # sets its kind, as an unbound exclusive grant does, not the limit
            # of a semaphore whose holders all ran out.
            conn.execute(
                update(locks)
                .where(locks.c.id == row.id)
                .values(**values, holder_limit=1, places_until=None)
            )
        values.pop("session_id")
        granted = LockRow(
            resource=resource,
            waiters=row.waiters if row is not None else 0,
            **values,
        )
        details = with_session(None, session.id)
        if action is Action.TOOK_OVER:
            details = took_over_from(details, row.token)
            details = ended_bound_grant(details, row.session_id, row.expires_at)
        t._log(
            conn,
            action,
            granted,
            row.owner if row is not None else None,
            token,
            ask.actor,
            None,
            now,
            details=details,
        )
        if waiter is not None:
            t._dequeue(conn, waiter)
        return Outcome(True, action, granted, now)


__all__ = [
    "Ended",
    "Heartbeat",
    "SessionEnded",
    "SessionNotFound",
    "SessionRow",
    "SessionStatements",
]
