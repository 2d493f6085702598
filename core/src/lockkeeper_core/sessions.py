"""Sessions: one heartbeat renews every grant bound to it, one end releases them.

``SessionService`` is reached as ``LockService.sessions``; the API, the dashboard
and the CLI call it, never the statements (``lockkeeper_core.statements.sessions``).
A grant bound to a session is acquired by ``lockkeeper_core.commands``. A session
belongs to the API token that made it: another token's session is unknown to it
(404), as it would be if it did not exist.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from lockkeeper_core import rules
from lockkeeper_core.core import LockCore, check_session_id
from lockkeeper_core.errors import SessionExpired, SessionQuotaReached, UnknownSession
from lockkeeper_core.instrumentation import held_for
from lockkeeper_core.results import Lock
from lockkeeper_core.set_names import name_sets
from lockkeeper_core.state import Action
from lockkeeper_core.statements.sessions import SessionRow, SessionsFull

# secrets.token_urlsafe(24): 32 characters of [A-Za-z0-9_-].
SESSION_ID_BYTES = 24


@dataclass(frozen=True, slots=True)
class Session:
    id: str
    owner: str
    token: str
    ttl: float
    created_at: datetime
    expires_at: datetime
    ttl_remaining: float
    locks: list[Lock]

    @property
    def last_heartbeat(self) -> datetime:
        """When it was created or last renewed (its expiry is that plus ttl)."""
        return self.expires_at - timedelta(seconds=self.ttl)

    @property
    def expired(self) -> bool:
        return self.ttl_remaining <= 0


@dataclass(frozen=True, slots=True)
class ListedSession:
    """A session in the operator's list, with how many grants are bound to it."""

    session: Session
    bound: int
    overdue_seconds: float  # since it expired (0 while it lives)

    @property
    def overdue_ttls(self) -> float:
        """How many of its ttls its heartbeat is late by, past its expiry."""
        return self.overdue_seconds / self.session.ttl if self.session.ttl else 0.0


class SessionService:
    """Handed the core and ``notify_released(resource, waiters)`` (the waiting
    line's: an ended session's grants wake their waiters)."""

    def __init__(
        self, core: LockCore, notify_released: Callable[[str, int], None]
    ) -> None:
        self.core = core
        self.statements = core.session_statements
        self._notify_released = notify_released
        self._pg = core.dialect == "postgresql"

    def _session(self, row: SessionRow, now: datetime, grants=()) -> Session:
        expiring = self.core.settings.expiring_within
        return Session(
            id=row.id,
            owner=row.owner,
            token=row.token,
            ttl=row.ttl,
            created_at=row.created_at,
            expires_at=row.expires_at,
            ttl_remaining=max((row.expires_at - now).total_seconds(), 0.0),
            locks=[
                replace(Lock.from_row(grant, now, expiring, row.ttl), session=row.id)
                for grant in grants
            ],
        )

    # -- the worker's operations -----------------------------------------------

    def create(self, owner: str, ttl: float | None, *, token: str) -> Session:
        """A new session of (``token``, ``owner``) that expires ``ttl`` seconds
        from now unless renewed.

        :raise SessionQuotaReached: ``token`` already has
            ``LOCKKEEPER_MAX_SESSIONS_PER_TOKEN`` live sessions."""
        self.core.validate(owner=owner, ttl=ttl)
        ttl = self.core.ttl(ttl)
        session_id = secrets.token_urlsafe(SESSION_ID_BYTES)
        limit = self.core.settings.max_sessions_per_token
        row = self.core.run(
            lambda conn: self.statements.create(
                conn,
                session_id,
                owner,
                token,
                ttl,
                self.core.given_now(),
                max_sessions=limit,
            )
        )
        if isinstance(row, SessionsFull):
            self.core.metrics.session("refused_quota")
            raise SessionQuotaReached(
                token, row.limit, (row.soonest - row.now).total_seconds()
            )
        self.core.metrics.session("created")
        return self._session(row, row.created_at)

    def heartbeat(self, session_id: str, *, token: str) -> Session:
        """Renew the session, and so every grant bound to it, to now + its ttl.

        :raise UnknownSession: no such session of ``token``.
        :raise SessionExpired: it ran out before this heartbeat.
        """
        check_session_id(session_id)
        if self._pg:
            beat = self.core.run(
                lambda driver: self.statements.heartbeat_statement(
                    driver, session_id, token, self.core.given_now()
                ),
                autocommit=True,
            )
        else:
            beat = self.core.run(
                lambda conn: self.statements.heartbeat(
                    conn, session_id, token, self.core.given_now()
                )
            )
        if beat.session is None:
            self.core.metrics.session("heartbeat_unknown")
            raise UnknownSession(session_id)
        if not beat.done:
            self.core.metrics.session("heartbeat_expired")
            raise SessionExpired(session_id)
        # Counted in lockkeeper_sessions_total{outcome="heartbeat"}, and not
        # logged: an audit event per heartbeat would write a row per heartbeat
        # per worker (every few seconds each, forever), burying the grants and
        # releases the log is for. The grants' expiries say the same thing.
        self.core.metrics.session("heartbeat")
        return self._session(beat.session, beat.now)

    def get(self, session_id: str, *, token: str | None) -> Session:
        """The session with its live grants; ``token`` None: any token's (an
        operator's read)."""
        check_session_id(session_id)
        with self.core.reads.connect() as conn:
            row, grants, now = self.statements.read(
                conn, session_id, self.core.given_now()
            )
        if row is None or (token is not None and row.token != token):
            raise UnknownSession(session_id)
        return self._session(row, now, grants if row.expires_at > now else ())

    def purge_expired(self, cutoff: datetime, batch: int) -> list[str]:
        """Delete the sessions that expired at or before ``cutoff``, with the
        rows of their grants that a purge at ``cutoff`` deletes; returns the
        resources whose held (stale) rows went with them."""
        purged: list[str] = []
        while True:
            count, resources = self.core.run(
                lambda conn: self.statements.purge_expired_batch(conn, cutoff, batch)
            )
            purged += resources
            if count < batch:
                return purged

    def listing(self, limit: int = 200) -> tuple[list[ListedSession], datetime]:
        """The sessions, the longest overdue first, with their bound grants
        counted (the dashboard's page of sessions), and the clock."""
        with self.core.reads.connect() as conn:
            rows, now = self.statements.listing(conn, limit, self.core.given_now())
        return [
            ListedSession(
                session=self._session(row, now),
                bound=bound,
                overdue_seconds=max((now - row.expires_at).total_seconds(), 0.0),
            )
            for row, bound in rows
        ], now

    def live(self) -> int:
        """How many sessions have not expired (metrics)."""
        with self.core.reads.connect() as conn:
            return self.statements.live_count(conn, self.core.given_now())

    def bound_session(self, resource: str) -> str | None:
        """The id of the session the exclusive grant on ``resource`` is bound
        to, if any (a renewal's refusal path)."""
        with self.core.reads.connect() as conn:
            row = self.statements.session_of(conn, resource)
        return row.id if row is not None else None

    def of_lock(self, resource: str) -> Session | None:
        """The session the grant on ``resource`` is bound to, if any (for the
        dashboard's lock page: its owner, last heartbeat and expiry)."""
        with self.core.reads.connect() as conn:
            row = self.statements.session_of(conn, resource)
        if row is None:
            return None
        return self._session(row, self.core.now())

    def end(
        self,
        session_id: str,
        *,
        token: str | None,
        actor: str | None,
        reason: str | None = None,
    ) -> Session:
        """End the session: every grant bound to it released (one event each, in
        the same transaction) and the session gone; returns it as it was, with
        the grants released. ``token`` None: an operator ends it (a reason is
        required; the events are ``force_released``). A session that had
        expired releases nothing: its grants still bound end as of its expiry
        (``released`` events at that instant, ``SessionStatements.end``).

        :raise UnknownSession: no such session (of ``token``).
        """
        check_session_id(session_id)
        self.core.validate(actor=actor, reason=reason)
        operator = token is None
        if operator:
            rules.require_reason(reason, "to end a session")
        action = Action.FORCE_RELEASED if operator else Action.RELEASED

        def work(conn):
            ended = self.statements.end(
                conn,
                session_id,
                token,
                self.core.given_now(),
                actor=actor,
                reason=reason,
                action=action,
            )
            # A set bound to the session ends with it: its members' events
            # name it, as a release of the set does.
            name_sets(
                conn,
                [
                    (grant.resource, grant.fence, grant.acquired_at, None)
                    for grant in ended.released
                ],
            )
            return ended

        ended = self.core.run(work)
        if ended.session is None:
            raise UnknownSession(session_id)
        for grant in ended.released:
            if operator:
                self.core.metrics.operator_action(action)
            else:
                self.core.metrics.release(
                    "released", grant.resource, held_for(grant, ended.now)
                )
            self._notify_released(grant.resource, grant.waiters)
        self.core.metrics.session("ended")
        return self._session(ended.session, ended.now, ended.released)


__all__ = [
    "ListedSession",
    "Session",
    "SessionExpired",
    "SessionQuotaReached",
    "SessionService",
    "UnknownSession",
]
