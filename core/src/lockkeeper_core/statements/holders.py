"""More than one holder: the holders of a semaphore (``holder_limit`` above 1) and
shared grants, rows of ``lock_holders`` (see ``LockHolder``).

Every change of a resource's holders is one transaction on every dialect, in the
style of ``TransactionalStatements``: lock the resource's ``distributed_locks``
row first, then (a new tenure) the token's, as the lock order of
``lockkeeper_core.statements`` says; read the clock after the row's lock, then decide
and write the holders, the row's ``places_until`` (the latest expiry
of its live holders: while it is in the future the exclusive path refuses the
row) and the audit event together. The row lock orders every grant, renewal and
release of the resource's holders one after another, and against the exclusive
path, which locks the same row: N+1 contenders for N holders never all commit.
A resource with no row yet gets it with its first grant, after the token's row
(a racing first grant's insert loses with an ``IntegrityError``, on MariaDB
its upsert with ``Raced``, and the service tries again): a refused acquire
writes nothing.

On PostgreSQL a grant with no session (``peek_holder`` then ``acquire_holder``),
``renew_holder`` and ``release_holder`` are one statement each instead, the
functions ``lockkeeper_acquire_place``, ``lockkeeper_renew_place`` and
``lockkeeper_release_place`` (``sql/postgresql/``): they give the same answers,
so a rule changed here changes there too.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

from sqlalchemy import BigInteger, bindparam, delete, insert, select, update

from lockkeeper_core.columns import UTCDateTime
from lockkeeper_core.engine import galera_connection
from lockkeeper_core.errors import SessionBound
from lockkeeper_core.models import EXCLUSIVE, NO_TOKEN, SHARED, LockSession
from lockkeeper_core.state import Action, holds
from lockkeeper_core.statements.common import (
    LockRow,
    Outcome,
    SessionEnded,
    clear_exclusive_grant,
    delete_where_in,
    events,
    holders,
    insert_lock_row,
    live_locks,
    locks,
    queue_columns,
    token_ended,
    waiters,
)
from lockkeeper_core.statements.details import (
    ended_bound_grant,
    mode_change,
    session_expiry_event,
    took_over_from,
    with_session,
)

_NOW = bindparam("now", type_=UTCDateTime())
_sessions = LockSession.__table__


@dataclass(frozen=True, slots=True)
class AllRemoved:
    """What ``force_remove_all`` did: the grants it ended, those it left alone
    (not confirmed: they came since), the confirmed fences no grant carried
    any more, the deciding clock, and how many wait in line."""

    released: list[LockRow]
    left_alone: list[LockRow]
    gone: list[int]
    now: datetime
    waiters: int


def holder_token(token: str | None) -> str:
    """``lock_holders.token`` of a holder: a caller with no token (tests, tools)
    is recorded as NO_TOKEN."""
    return token if token is not None else NO_TOKEN


class HoldersStatements:
    """The holders path, mixed into ``TransactionalStatements`` (whose locking
    read, clock, token row, freeze and fence it uses); SQLAlchemy connections."""

    # Provided by TransactionalStatements.
    lock_row: Any
    clock_after_lock: Any
    freeze_of: Any
    _token_row: Any
    _next_fence: Any
    _log: Any
    _grant: Any
    _server_now: Any
    force_remove: Any

    def _holder_count_statement(self):
        return select(live_locks(_NOW).label("live"))

    def _unwritten_row(self, conn, resource, now, waiter, holder_limit) -> Any:
        """A resource with no row yet, as a free row of ``holder_limit`` with
        its line (``waiters``, ``ahead``): nothing is written until a grant
        (``_written_row``), so a refused acquire writes nothing."""
        waiting, ahead = queue_columns(
            resource, _NOW, bindparam("waiter", type_=BigInteger())
        )
        line = conn.execute(
            select(waiting, ahead), {"now": now, "waiter": waiter}
        ).one()
        return SimpleNamespace(
            id=None,
            resource=resource,
            owner=None,
            token=None,
            fence=0,
            acquired_at=now,
            expires_at=now,
            session_id=None,
            holder_limit=holder_limit,
            places_until=None,
            waiters=line.waiters,
            ahead=line.ahead,
        )

    def _written_row(self, conn, row, now) -> Any:
        """``row`` as a row of the table, locked: inserted free (after the
        token's row: the lock order) when it was not there yet (the insert
        holds it). A concurrent
        first grant's insert that came first raises ``IntegrityError`` (MariaDB:
        ``Raced``, ``insert_lock_row``); the service tries again and finds its
        row."""
        if row.id is not None:
            return row
        inserted = self._insert_free_row(conn, row.resource, now, row.holder_limit)
        return SimpleNamespace(**{**vars(row), "id": inserted})

    @staticmethod
    def _insert_free_row(conn, resource, at, holder_limit) -> int:
        """Insert ``resource``'s row, free; returns its id (MariaDB: an upsert
        that raises ``Raced`` when the row is there, ``insert_lock_row``)."""
        return insert_lock_row(
            conn,
            {
                "resource": resource,
                "owner": None,
                "token": None,
                "fence": 0,
                "acquired_at": at,
                "expires_at": at,
                "holder_limit": holder_limit,
            },
        )

    def _holders_of(self, conn, resource) -> list[Any]:
        """Every holder row of ``resource``, the one that ends first first."""
        return conn.execute(
            select(holders)
            .where(holders.c.resource == resource)
            .order_by(holders.c.expires_at, holders.c.id)
        ).all()

    @staticmethod
    def _insert_holder(
        conn, resource, owner, token, mode, fence, now, expires_at, session_id
    ) -> None:
        """One grant's row of ``lock_holders``, granted at ``now``."""
        conn.execute(
            insert(holders).values(
                resource=resource,
                owner=owner,
                token=token,
                mode=mode,
                fence=fence,
                acquired_at=now,
                expires_at=expires_at,
                session_id=session_id,
            )
        )

    def _set_places_until(self, conn, row, live_expiries, holder_limit) -> None:
        """Write the resource's ``places_until`` and limit after a change of
        its holders. On a Galera node, even when neither changes (one more to
        ``guard_writes``): its lock orders holders on one node only, and
        certification compares only written rows, so two holders admitted on
        two nodes at once both committed past the limit. Written by both, the
        row fails the one the cluster orders second (1213, retried)."""
        until = max(live_expiries) if live_expiries else None
        values: dict[str, Any] = {"places_until": until, "holder_limit": holder_limit}
        if galera_connection(conn):
            values["guard_writes"] = locks.c.guard_writes + 1
        conn.execute(update(locks).where(locks.c.id == row.id).values(**values))

    @staticmethod
    def _holder_row(holder, *, holder_limit, holders_now, waiters) -> LockRow:
        return LockRow(
            resource=holder.resource,
            owner=holder.owner,
            token=holder.token,
            fence=holder.fence,
            acquired_at=holder.acquired_at,
            expires_at=holder.expires_at,
            waiters=waiters,
            holder_limit=holder_limit,
            mode=holder.mode,
            holders=holders_now,
        )

    @classmethod
    def _shown_under(cls, holder, row, holders_now: int) -> LockRow:
        """``holder`` as answered, with its resource row's limit and line."""
        return cls._holder_row(
            holder,
            holder_limit=row.holder_limit,
            holders_now=holders_now,
            waiters=row.waiters or 0,
        )

    def peek_holder(self, conn, ask, now: datetime | None) -> Outcome | None:
        """A plain read (no lock, no write) before the holders transaction: the
        refusal a semaphore that is full of other holders answers, or None
        (decide under the row lock). Refused contenders of a full semaphore
        then never queue on its row lock, before the releases that free it."""
        at = now if now is not None else self._server_now().cast(UTCDateTime())
        row = conn.execute(
            select(locks, at.label("now") if now is None else locks.c.id).where(
                locks.c.resource == ask.resource
            )
        ).one_or_none()
        if row is None:
            # Nothing to look at: a grant writes the row (a refusal, nothing).
            return None
        if ask.mode != EXCLUSIVE or ask.limit == 1:
            return None
        if (row.holder_limit or 1) != ask.limit:
            return None
        now = row.now if now is None else now
        live = conn.execute(
            select(holders)
            .where(holders.c.resource == ask.resource, holders.c.expires_at > now)
            .order_by(holders.c.expires_at, holders.c.id)
        ).all()
        wanted = holder_token(ask.token)
        if len(live) < ask.limit or any(
            p.owner == ask.owner and p.token == wanted for p in live
        ):
            return None
        shown = self._holder_row(
            live[0], holder_limit=ask.limit, holders_now=len(live), waiters=0
        )
        return Outcome(False, None, shown, now)

    def acquire_holder(
        self, conn, ask, now: datetime | None, waiter=None, session=None
    ) -> Outcome:
        """One decision of the holders path: ``ask.limit`` above 1 (a semaphore
        holder), ``ask.mode`` SHARED, or an exclusive grant of a resource held
        by holders (a promotion, or a refusal naming the holder that ends first).

        ``session``: the session's row (``SessionRow``, already locked FOR
        SHARE by the caller: the lock order is the session, then the resource's
        row, then its holders) to bind the grant to: its expiry is the session's
        and its row carries the session's id.

        :raise SessionEnded: ``session`` expired by the deciding clock.
        """
        resource, owner, token = ask.resource, ask.owner, ask.token
        limit, mode, ttl = ask.limit, ask.mode, ask.ttl
        row = self.lock_row(conn, resource, now, waiter)
        now = self.clock_after_lock(conn, now).now
        if row is None:
            row = self._unwritten_row(conn, resource, now, waiter, limit)
        session_id = None
        if session is not None:
            if session.expires_at <= now:
                raise SessionEnded(session)
            session_id = session.id
            # The exclusive grants below (``_grant``) take a ttl: the one that
            # ends at the session's instant (microseconds, exact).
            ttl = (session.expires_at - now).total_seconds()
        queued = row.waiters or 0
        holder_rows = self._holders_of(conn, resource)
        live = [p for p in holder_rows if p.expires_at > now]
        expired = [p for p in holder_rows if p.expires_at <= now]
        mine_token = holder_token(token)
        mine = next(
            (p for p in live if p.owner == owner and p.token == mine_token), None
        )
        exclusive_live = row.owner is not None and row.expires_at > now
        exclusive_mine = exclusive_live and holds(row, owner, token)
        in_use = exclusive_live or bool(live) or bool(queued)
        current_limit = row.holder_limit or 1
        holders_now = len(live) + (1 if exclusive_live else 0)

        def shown(holder, holders_count=holders_now) -> LockRow:
            return self._holder_row(
                holder,
                holder_limit=current_limit,
                holders_now=holders_count,
                waiters=queued,
            )

        def first_ending() -> Any:
            """The live grant that ends first (exclusive row or a holder)."""
            if exclusive_live:
                return LockRow.of(row, holders=holders_now)
            return shown(live[0]) if live else None

        if in_use and current_limit != limit:
            return Outcome(
                False, None, first_ending(), now, limit_mismatch=current_limit
            )

        if session is None:
            # Bound to a live session: only the session renews it, nor may a
            # demotion (a re-acquire) cut it loose.
            if mine is not None:
                self._refuse_if_bound(conn, mine)
            elif exclusive_mine:
                self._refuse_if_bound(conn, row)
        # -- a holder asking again: re-acquire, promote, demote ----------------
        if mine is not None and (mode == SHARED) == (mine.mode == SHARED):
            expires_at = self._expiry(now, ttl, session)
            conn.execute(
                update(holders)
                .where(holders.c.id == mine.id)
                .values(acquired_at=now, expires_at=expires_at, session_id=session_id)
            )
            expiries = [p.expires_at for p in live if p.id != mine.id] + [expires_at]
            self._set_places_until(conn, row, expiries, limit)
            granted = shown(mine)
            granted = LockRow.of(granted, acquired_at=now, expires_at=expires_at)
            return self._logged_holder(
                conn, granted, Action.REACQUIRED, owner, token, ask, now, waiter,
                details=with_session(None, session_id),
            )  # fmt: skip
        if mine is not None:
            # Shared → exclusive: only as the sole holder, with a new fence.
            others = [p for p in live if p.id != mine.id]
            if others or (exclusive_live and not exclusive_mine):
                blocker = (
                    LockRow.of(row, holders=holders_now)
                    if exclusive_live
                    else shown(others[0])
                )
                return Outcome(False, None, blocker, now)
            return self._promote(
                conn, row, mine, ask, now, ttl, waiter, session_id, expired
            )
        if exclusive_mine:
            if mode == SHARED:
                # Exclusive → shared: always, keeping the fence.
                expires_at = self._expiry(now, ttl, session)
                conn.execute(clear_exclusive_grant([row.id], now))
                self._log_cleared(conn, expired, now)
                conn.execute(delete(holders).where(holders.c.resource == resource))
                self._insert_holder(
                    conn, resource, owner, mine_token, SHARED, row.fence, now,
                    expires_at, session_id,
                )  # fmt: skip
                self._set_places_until(conn, row, [expires_at], 1)
                granted = LockRow(
                    resource=resource,
                    owner=owner,
                    token=mine_token,
                    fence=row.fence,
                    acquired_at=now,
                    expires_at=expires_at,
                    waiters=queued,
                    mode=SHARED,
                )
                return self._logged_holder(
                    conn, granted, Action.REACQUIRED, owner, token, ask, now, waiter,
                    details=with_session(mode_change(EXCLUSIVE), session_id),
                )  # fmt: skip
            # An exclusive re-acquire (the exclusive path's, normally).
            outcome = self._grant(
                conn, row, resource, owner, token, row.fence, now, ttl,
                Action.REACQUIRED, ask.actor,
                details=with_session(None, session_id),
            )  # fmt: skip
            self._bind_row(conn, row, resource, session_id)
            return outcome

        # -- a new grant -----------------------------------------------------
        if row.ahead:
            # Others are in line first (the row itself when none holds it).
            return Outcome(False, None, first_ending() or row, now)
        if exclusive_live:
            return Outcome(False, None, first_ending(), now)
        capacity = limit if mode == EXCLUSIVE else None
        if capacity is not None and len(live) >= capacity:
            return Outcome(False, None, first_ending(), now)
        previous_owner = previous_token = None
        taken = None
        if row.owner is not None:
            taken = row  # an expired exclusive grant taken over
        elif capacity is not None and expired and len(live) + len(expired) >= capacity:
            taken = expired[0]  # the expired holder taken over
        if taken is not None:
            previous_owner, previous_token = taken.owner, taken.token
        action = Action.TOOK_OVER if previous_owner is not None else Action.ACQUIRED
        counting = bool(ask.max_locks) and token is not None
        refused = self._new_tenure_refusal(conn, resource, token, now, counting)
        if refused is not None:
            return refused
        if counting:
            count = conn.scalar(
                self._holder_count_statement(),
                {"now": now, "quota_token": token, "max_locks": ask.max_locks},
            )
            if count >= ask.max_locks:
                return Outcome(False, None, None, now, over_quota=True)
        row = self._written_row(conn, row, now)
        if expired:
            # An exclusive grant on the row names the row's previous owner only.
            named = None if mode == EXCLUSIVE and limit == 1 else taken
            self._log_cleared(conn, expired, now, named)
            delete_where_in(conn, holders.c.id, [p.id for p in expired])
        fence = self._next_fence(conn)
        if mode == EXCLUSIVE and limit == 1:
            # No holder is live: the exclusive grant lives on the row.
            outcome = self._grant(
                conn, row, resource, owner, token, fence, now, ttl, action,
                ask.actor, details=with_session(None, session_id),
            )  # fmt: skip
            self._bind_row(conn, row, resource, session_id)
            self._dequeue_waiter(conn, waiter)
            return outcome
        if row.owner is not None:
            # Its expiry stays: the stale grant ran out then.
            conn.execute(clear_exclusive_grant([row.id]))
        expires_at = self._expiry(now, ttl, session)
        self._insert_holder(
            conn, resource, owner, mine_token, mode, fence, now, expires_at,
            session_id,
        )  # fmt: skip
        self._set_places_until(
            conn, row, [p.expires_at for p in live] + [expires_at], limit
        )
        granted = LockRow(
            resource=resource,
            owner=owner,
            token=mine_token,
            fence=fence,
            acquired_at=now,
            expires_at=expires_at,
            waiters=queued,
            holder_limit=limit,
            mode=mode,
            holders=len(live) + 1,
        )
        details = with_session(None, session_id)
        if taken is not None:
            details = took_over_from(details, previous_token)
            details = ended_bound_grant(details, taken.session_id, taken.expires_at)
        return self._logged_holder(
            conn, granted, action, previous_owner, token, ask, now, waiter,
            details=details,
        )  # fmt: skip

    @staticmethod
    def _log_cleared(conn, holder_rows, now, named=None) -> None:
        """Record that the expired holders among ``holder_rows`` bound to a session,
        which the caller's grant deletes (but ``named``, the one its own event
        names), ran out at their session's expiry (``session_expiry_event``),
        before the grant's event: once their session's row is gone nothing
        else would say when."""
        cleared = [
            session_expiry_event(p, p.mode)
            for p in holder_rows
            if p.expires_at <= now and p.session_id is not None and p is not named
        ]
        if cleared:
            conn.execute(insert(events), cleared)

    def _promote(self, conn, row, mine, ask, now, ttl, waiter, session_id, expired):
        """Shared → exclusive for the sole holder: a new exclusive tenure with
        a new fence, so refused as a new grant is (a revoked or expired token,
        a freeze). Logged ``acquired``; its details name the shared grant it
        replaced (``from_mode``, ``from_fence``), which ends with it."""
        resource, token = ask.resource, ask.token
        refused = self._new_tenure_refusal(conn, resource, token, now, False)
        if refused is not None:
            return refused
        self._log_cleared(conn, expired, now)
        conn.execute(delete(holders).where(holders.c.resource == resource))
        fence = self._next_fence(conn)
        outcome = self._grant(
            conn, row, resource, ask.owner, token, fence, now, ttl,
            Action.ACQUIRED, ask.actor,
            details=with_session(
                mode_change(mine.mode, from_fence=mine.fence), session_id
            ),
        )  # fmt: skip
        self._bind_row(conn, row, resource, session_id)
        self._dequeue_waiter(conn, waiter)
        return outcome

    def _new_tenure_refusal(
        self, conn, resource, token, now, lock_token_row: bool
    ) -> Outcome | None:
        """Why a new tenure (a new grant, a promotion: a new fence) may not
        begin, or None: its API token was revoked or expired (its row read,
        FOR UPDATE when ``lock_token_row``, for a quota count), or a freeze
        covers the resource."""
        if token is not None and token != NO_TOKEN:
            found = self._token_row(conn, token, exclusive=lock_token_row)
            if token_ended(found, now):
                return Outcome(False, None, None, now, token_ended=True)
        freeze = self.freeze_of(conn, resource, now)
        if freeze is not None:
            return Outcome(False, None, None, now, freeze)
        return None

    @staticmethod
    def _refuse_if_bound(conn, holder) -> None:
        """A holder bound to a live session is renewed by its session only: a
        plain re-acquire or renewal would move its expiry off the session's
        (and out of its heartbeat and end). One primary-key probe, made only
        for a holder with a ``session_id``.

        :raise SessionBound: it is bound (the service answers 409).
        """
        if holder.session_id is None:
            return
        bound = conn.scalar(
            select(_sessions.c.id).where(
                _sessions.c.id == holder.session_id,
                _sessions.c.expires_at == holder.expires_at,
                _sessions.c.token == holder.token,
                _sessions.c.owner == holder.owner,
            )
        )
        if bound is not None:
            raise SessionBound(holder.resource, bound)

    @staticmethod
    def _expiry(now, ttl, session) -> datetime:
        """A holder's expiry: the session's when bound, else now + ttl."""
        if session is not None:
            return session.expires_at
        return now + timedelta(seconds=ttl)

    @staticmethod
    def _bind_row(conn, row, resource, session_id) -> None:
        """An exclusive grant written by ``_grant`` carries its session's id
        (None: unbound, nothing to write)."""
        if session_id is None:
            return
        where = (
            locks.c.id == row.id if row is not None else locks.c.resource == resource
        )
        conn.execute(update(locks).where(where).values(session_id=session_id))

    def _logged_holder(
        self,
        conn,
        granted,
        action,
        previous_owner,
        token,
        ask,
        now,
        waiter,
        details=None,
    ) -> Outcome:
        self._log(
            conn, action, granted, previous_owner, token, ask.actor, None, now,
            mode=granted.mode, details=details,
        )  # fmt: skip
        self._dequeue_waiter(conn, waiter)
        return Outcome(True, action, granted, now)

    def _dequeue_waiter(self, conn, waiter) -> None:
        if waiter is not None:
            conn.execute(delete(waiters).where(waiters.c.id == waiter))

    def _my_holder(self, conn, resource, owner, token, now):
        """The resource's row locked, the clock after it, the caller's holder (or
        None) and the resource's live holders."""
        row = self.lock_row(conn, resource, now)
        now = self.clock_after_lock(conn, now).now
        if row is None:
            return None, now, None, []
        live = [p for p in self._holders_of(conn, resource) if p.expires_at > now]
        wanted = holder_token(token)
        mine = next((p for p in live if p.owner == owner and p.token == wanted), None)
        return row, now, mine, live

    def renew_holder(self, conn, resource, owner, token, ttl, actor, now) -> Outcome:
        """Extend the caller's live holder; refused (row None) when it has none."""
        row, now, mine, live = self._my_holder(conn, resource, owner, token, now)
        if mine is None:
            return Outcome(False, None, None, now)
        self._refuse_if_bound(conn, mine)
        expires_at = now + timedelta(seconds=ttl)
        conn.execute(
            update(holders).where(holders.c.id == mine.id).values(expires_at=expires_at)
        )
        expiries = [p.expires_at for p in live if p.id != mine.id] + [expires_at]
        self._set_places_until(conn, row, expiries, row.holder_limit)
        renewed = self._shown_under(mine, row, len(live))
        renewed = LockRow.of(renewed, expires_at=expires_at)
        self._log(
            conn, Action.RENEWED, renewed, owner, token, actor, None, now,
            mode=mine.mode,
        )  # fmt: skip
        return Outcome(True, Action.RENEWED, renewed, now)

    def release_holder(
        self, conn, resource, owner, token, actor, now, details=None
    ) -> Outcome:
        """End the caller's live holder; refused (row None) when it has none."""
        row, now, mine, live = self._my_holder(conn, resource, owner, token, now)
        if mine is None:
            return Outcome(False, None, None, now)
        conn.execute(delete(holders).where(holders.c.id == mine.id))
        rest = [p.expires_at for p in live if p.id != mine.id]
        self._set_places_until(conn, row, rest, row.holder_limit)
        ended = self._shown_under(mine, row, len(rest))
        ended = LockRow.of(ended, expires_at=now)
        self._log(
            conn, Action.RELEASED, ended, owner, token, actor, None, now,
            mode=mine.mode, details=details,
        )  # fmt: skip
        return Outcome(True, Action.RELEASED, ended, now)

    def force_remove_holder(
        self, conn, resource, fence, actor, reason, now
    ) -> tuple[Outcome, LockRow | None]:
        """An operator ends the holder of ``resource`` carrying ``fence`` (the one
        confirmed), whoever holds it, live or expired: deleted under the
        resource row's lock, its ``places_until`` set from the holders left, one
        ``force_released`` event. Refused (not done) when no holder carries that
        fence, with the live holder that ends first now (or None)."""
        row = self.lock_row(conn, resource, now)
        now = self.clock_after_lock(conn, now).now
        if row is None:
            return Outcome(False, None, None, now), None
        holder_rows = self._holders_of(conn, resource)
        live = [p for p in holder_rows if p.expires_at > now]
        target = next((p for p in holder_rows if p.fence == fence), None)
        if target is None:
            first = live[0] if live else None
            shown = first and self._shown_under(first, row, len(live))
            return Outcome(False, None, None, now), shown
        conn.execute(delete(holders).where(holders.c.id == target.id))
        rest = [p.expires_at for p in live if p.id != target.id]
        self._set_places_until(conn, row, rest, row.holder_limit)
        ended = self._shown_under(target, row, len(rest))
        ended = LockRow.of(ended, expires_at=min(now, target.expires_at))
        self._log(
            conn, Action.FORCE_RELEASED, ended, target.owner, target.token, actor,
            reason, now, mode=target.mode,
            details=ended_bound_grant(None, target.session_id, target.expires_at),
        )  # fmt: skip
        return Outcome(True, Action.FORCE_RELEASED, ended, now), None

    def force_remove_all(
        self, conn, resource, fences, actor, reason, now
    ) -> AllRemoved:
        """An operator ends every grant of ``resource``: its exclusive grant
        (live or stale, as ``force_remove``) and its live holders, under the
        resource row's lock, one ``force_released`` event each (with its mode
        and fence). ``fences``: the grants the operator confirmed (None: every
        grant there now); a grant carrying another fence came since and is
        left alone, a confirmed fence no grant carries is reported gone."""
        row = self.lock_row(conn, resource, now)
        now = self.clock_after_lock(conn, now).now
        if row is None:
            return AllRemoved([], [], [], now, 0)
        queued = row.waiters or 0
        limit = row.holder_limit or 1
        live = [p for p in self._holders_of(conn, resource) if p.expires_at > now]
        confirmed = None if fences is None else set(fences)

        def confirmed_grant(fence: int) -> bool:
            return confirmed is None or fence in confirmed

        released: list[LockRow] = []
        left: list[LockRow] = []
        if row.owner is not None:
            if confirmed_grant(row.fence):
                removed = self.force_remove(conn, row, now, actor=actor, reason=reason)
                released.append(removed.row)
            else:
                left.append(LockRow.of(row))
        ending = [p for p in live if confirmed_grant(p.fence)]
        staying = [p for p in live if not confirmed_grant(p.fence)]
        if ending:
            # By primary key, one by one: MariaDB read ``id IN (…)`` as the
            # whole table, waiting on other resources' holders (a deadlock).
            for holder in ending:
                conn.execute(delete(holders).where(holders.c.id == holder.id))
            rest = [p.expires_at for p in staying]
            self._set_places_until(conn, row, rest, row.holder_limit)
        for holder in ending:
            ended = self._holder_row(
                holder, holder_limit=limit, holders_now=len(staying), waiters=queued
            )
            ended = LockRow.of(ended, expires_at=now)
            self._log(
                conn, Action.FORCE_RELEASED, ended, holder.owner, holder.token, actor,
                reason, now, mode=holder.mode,
                details=ended_bound_grant(None, holder.session_id, holder.expires_at),
            )  # fmt: skip
            released.append(ended)
        left.extend(
            self._holder_row(
                p, holder_limit=limit, holders_now=len(live), waiters=queued
            )
            for p in staying
        )
        carried = {grant.fence for grant in released + left}
        gone = sorted((confirmed or set()) - carried)
        return AllRemoved(released, left, gone, now, queued)

    def live_grants(self, conn, row, now: datetime) -> list[LockRow]:
        """The live holders of ``row``'s resource (none without a row), the
        one that ends first first."""
        if row is None:
            return []
        live = [p for p in self._holders_of(conn, row.resource) if p.expires_at > now]
        return [
            self._holder_row(
                p,
                holder_limit=row.holder_limit or 1,
                holders_now=len(live),
                waiters=row.waiters or 0,
            )
            for p in live
        ]

    def write_holder_claim(
        self, conn, view, resource, owner, token, mode, ttl, *, actor, reason
    ) -> Outcome:
        """An operator's claim of one holder (``mode`` EXCLUSIVE: a semaphore's)
        or of a shared grant, for (``token``, ``owner``) with ``view``'s fence,
        under the resource row's lock (inserted free when missing); the caller
        decided it may be made. A holder the owner held is replaced, expired
        holders and a stale exclusive grant end; one ``claimed`` event."""
        row, now = view.row, view.now
        if row is None:
            self._insert_free_row(conn, resource, now, 1)
            row = self.lock_row(conn, resource, now)
        holder_rows = self._holders_of(conn, resource)
        wanted = holder_token(token)
        staying = [
            p
            for p in holder_rows
            if p.expires_at > now and not (p.owner == owner and p.token == wanted)
        ]
        ending = [p.id for p in holder_rows if p not in staying]
        self._log_cleared(conn, holder_rows, now)
        if ending:
            delete_where_in(conn, holders.c.id, ending)
        previous_owner = row.owner
        if row.owner is not None:
            conn.execute(clear_exclusive_grant([row.id], now))
        limit = (row.holder_limit or 1) if mode == EXCLUSIVE else 1
        expires_at = now + timedelta(seconds=ttl)
        self._insert_holder(
            conn, resource, owner, wanted, mode, view.fence, now, expires_at, None
        )
        expiries = [p.expires_at for p in staying] + [expires_at]
        self._set_places_until(conn, row, expiries, limit)
        granted = LockRow(
            resource=resource,
            owner=owner,
            token=wanted,
            fence=view.fence,
            acquired_at=now,
            expires_at=expires_at,
            waiters=row.waiters or 0,
            holder_limit=limit,
            mode=mode,
            holders=len(staying) + 1,
        )
        details = None
        if previous_owner is not None:
            details = ended_bound_grant(None, row.session_id, row.expires_at)
        self._log(
            conn, Action.CLAIMED, granted, previous_owner, token, actor, reason, now,
            mode=mode, details=details,
        )  # fmt: skip
        return Outcome(True, Action.CLAIMED, granted, now)
