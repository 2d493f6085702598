"""Sessions: one heartbeat renews every grant bound to it, one end releases them.

``SessionService`` is reached as ``LockService.sessions``; the API, the dashboard
and the CLI call it, never the statements (``app.locks.statements.sessions``). A
session belongs to the API token that made it: another token's session is
unknown to it (404), as it would be if it did not exist.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from app.locks import rules, validation
from app.locks.errors import InvalidInput, LockError, SessionBound
from app.locks.models import SESSION_ID_LENGTH
from app.locks.results import AcquireResult, Lock
from app.locks.state import Action
from app.locks.statements.sessions import (
    SessionEnded,
    SessionNotFound,
    SessionRow,
    SessionStatements,
)
from app.locks.values import Ask

if TYPE_CHECKING:
    from app.locks.service import LockService

# secrets.token_urlsafe(24): 32 characters of [A-Za-z0-9_-].
SESSION_ID_BYTES = 24
SESSION_ID_CHARACTERS = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"
)


class UnknownSession(LockError):
    """No session of this id belongs to the asking token (or it has ended)."""

    def __init__(self, session_id: str):
        self.session_id = session_id
        super().__init__(f"no session {session_id!r} of this API token")


class SessionExpired(LockError):
    """The session ran out before this call: its grants are already stale, and a
    late heartbeat does not revive them."""

    def __init__(self, session_id: str):
        self.session_id = session_id
        super().__init__(
            f"the session {session_id!r} has expired; its locks are stale: "
            "start a new session and acquire them again"
        )


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


def session_id_error(session_id: Any) -> str | None:
    if (
        not isinstance(session_id, str)
        or not session_id
        or len(session_id) > SESSION_ID_LENGTH
        or not set(session_id) <= SESSION_ID_CHARACTERS
    ):
        return "is not a session id"
    return None


class SessionService:
    def __init__(self, locks: LockService) -> None:
        self.locks = locks
        self.statements = SessionStatements(locks._transactional)
        self._pg = locks.dialect == "postgresql"

    def _session(self, row: SessionRow, now: datetime, grants=()) -> Session:
        expiring = self.locks.settings.expiring_within
        return Session(
            id=row.id,
            owner=row.owner,
            token=row.token,
            ttl=row.ttl,
            created_at=row.created_at,
            expires_at=row.expires_at,
            ttl_remaining=max((row.expires_at - now).total_seconds(), 0.0),
            locks=[
                replace(Lock.from_row(grant, now, expiring), session=row.id)
                for grant in grants
            ],
        )

    @staticmethod
    def _check_id(session_id: Any) -> None:
        error = session_id_error(session_id)
        if error:
            raise InvalidInput([("session", error)])

    # -- the worker's operations -----------------------------------------------

    def create(self, owner: str, ttl: float | None, *, token: str) -> Session:
        """A new session of (``token``, ``owner``) that expires ``ttl`` seconds
        from now unless renewed."""
        self.locks.validate(owner=owner, ttl=ttl)
        ttl = self.locks._ttl(ttl)
        session_id = secrets.token_urlsafe(SESSION_ID_BYTES)
        row = self.locks.run_transaction(
            lambda conn: self.statements.create(
                conn, session_id, owner, token, ttl, self.locks._now()
            )
        )
        self.locks.metrics.session("created")
        return self._session(row, row.created_at)

    def heartbeat(self, session_id: str, *, token: str) -> Session:
        """Renew the session, and so every grant bound to it, to now + its ttl.

        :raise UnknownSession: no such session of ``token``.
        :raise SessionExpired: it ran out before this heartbeat.
        """
        self._check_id(session_id)
        if self._pg:
            beat = self.locks.run_transaction(
                lambda driver: self.statements.heartbeat_statement(
                    driver, session_id, token, self.locks._now()
                ),
                autocommit=True,
            )
        else:
            beat = self.locks.run_transaction(
                lambda conn: self.statements.heartbeat(
                    conn, session_id, token, self.locks._now()
                )
            )
        if beat.session is None:
            self.locks.metrics.session("heartbeat_unknown")
            raise UnknownSession(session_id)
        if not beat.done:
            self.locks.metrics.session("heartbeat_expired")
            raise SessionExpired(session_id)
        # Counted in lockkeeper_sessions_total{outcome="heartbeat"}, and not
        # logged: an audit event per heartbeat would write a row per heartbeat
        # per worker (every few seconds each, forever), burying the grants and
        # releases the log is for. The grants' expiries say the same thing.
        self.locks.metrics.session("heartbeat")
        return self._session(beat.session, beat.now)

    def get(self, session_id: str, *, token: str | None) -> Session:
        """The session with its live grants; ``token`` None: any token's (an
        operator's read)."""
        self._check_id(session_id)
        with self.locks._autocommit_engine.connect() as conn:
            row, grants, now = self.statements.read(conn, session_id, self.locks._now())
        if row is None or (token is not None and row.token != token):
            raise UnknownSession(session_id)
        return self._session(row, now, grants if row.expires_at > now else ())

    def purge_expired(self, cutoff: datetime, batch: int) -> list[str]:
        """Delete the sessions that expired at or before ``cutoff``, with the
        rows of their grants that a purge at ``cutoff`` deletes; returns the
        resources whose held (stale) rows went with them."""
        purged: list[str] = []
        while True:
            count, resources = self.locks.run_transaction(
                lambda conn: self.statements.purge_expired_batch(conn, cutoff, batch)
            )
            purged += resources
            if count < batch:
                return purged

    def live(self) -> int:
        """How many sessions have not expired (metrics)."""
        with self.locks._autocommit_engine.connect() as conn:
            return self.statements.live_count(conn, self.locks._now())

    def bound_session(self, resource: str) -> str | None:
        """The id of the session the exclusive grant on ``resource`` is bound
        to, if any (a renewal's refusal path)."""
        with self.locks._autocommit_engine.connect() as conn:
            row = self.statements.session_of(conn, resource)
        return row.id if row is not None else None

    def of_lock(self, resource: str) -> Session | None:
        """The session the grant on ``resource`` is bound to, if any (for the
        dashboard's lock page: its owner, last heartbeat and expiry)."""
        with self.locks._autocommit_engine.connect() as conn:
            row = self.statements.session_of(conn, resource)
        if row is None:
            return None
        return self._session(row, self.locks.now())

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
        self._check_id(session_id)
        self.locks.validate(actor=actor, reason=reason)
        operator = token is None
        if operator:
            rules.require_reason(reason, "to end a session")
        action = Action.FORCE_RELEASED if operator else Action.RELEASED
        ended = self.locks.run_transaction(
            lambda conn: self.statements.end(
                conn,
                session_id,
                token,
                self.locks._now(),
                actor=actor,
                reason=reason,
                action=action,
            )
        )
        if ended.session is None:
            raise UnknownSession(session_id)
        for grant in ended.released:
            if operator:
                self.locks.metrics.operator_action(action)
            else:
                self.locks.metrics.release("released")
            self.locks.queue.notify_released(grant.resource, grant.waiters)
        self.locks.metrics.session("ended")
        return self._session(ended.session, ended.now, ended.released)

    # -- the session-bound acquire (from ``LockService.acquire``) -------------

    def attempt(self, ask: Ask, session_id: str, waiter: int | None) -> AcquireResult:
        locks = self.locks

        def work(conn):
            try:
                return self.statements.acquire(
                    conn, ask, session_id, locks._now(), waiter
                )
            except SessionNotFound:
                raise UnknownSession(session_id) from None
            except SessionEnded:
                raise SessionExpired(session_id) from None

        def decide(outcome) -> AcquireResult:
            if outcome.done:
                if waiter is not None and getattr(outcome.row, "waiters", 0):
                    # The next in line may be granted too (a shared head, a
                    # semaphore's free place): wake it now.
                    locks.queue.notify_released(ask.resource, outcome.row.waiters)
                lock = replace(
                    locks._lock(outcome.row, outcome.now), session=session_id
                )
                return AcquireResult(True, lock, outcome.action)
            return locks._refusal(ask, outcome)

        return locks.run_transaction(work, decide=decide)


def refuse_both_ttl_and_session(ttl: Any, session: Any) -> None:
    if ttl is not None and session is not None:
        raise InvalidInput(
            [("session", "give either a ttl or a session (its ttl is the session's)")]
        )


__all__ = [
    "Session",
    "SessionBound",
    "SessionExpired",
    "SessionService",
    "UnknownSession",
    "refuse_both_ttl_and_session",
    "session_id_error",
    "validation",
]
