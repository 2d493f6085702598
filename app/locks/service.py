"""LockService: every lock rule and every lock transaction, for every face.

The API, the dashboard and the CLI call these methods and map the exceptions of
``app.locks.errors``; none of them touches SQL. Each changing call is one
transaction holding the change and its audit event (see ``statements``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from flask import current_app
from sqlalchemy import (
    Connection,
    Engine,
    and_,
    case,
    delete,
    event,
    func,
    insert,
    literal,
    select,
    union_all,
    update,
)

from app.database import SERVER_CLOCK_DIALECTS, UTCDateTime, autocommit
from app.locks import rules, validation
from app.locks.clock import Clock, DatabaseClock, SystemClock
from app.locks.driver import DriverConnection
from app.locks.errors import (
    FenceMismatch,
    InvalidInput,
    LimitMismatch,
    LockChanged,
    LockExpired,
    LockNotFound,
    NotFrozen,
    NotOwner,
    QuotaExceeded,
    ResourceFrozen,
    TokenEnded,
)
from app.locks.instrumentation import NO_METRICS, NoMetrics
from app.locks.models import EXCLUSIVE, NO_TOKEN, SHARED
from app.locks.pagination import (
    DEFAULT_PAGE,
    after,
    encode_cursor,
    page_limit_error,
    read_cursor,
    starts_with,
    within,
)
from app.locks.queue import LineClock, WaitQueue
from app.locks.results import AcquireResult, Freeze, Lock, Page
from app.locks.sessions import (
    SessionBound,
    SessionService,
    refuse_both_ttl_and_session,
)
from app.locks.state import (
    Action,
    LockState,
    held_by_another,
    holds,
    state_condition,
)
from app.locks.statements import listing, statements_for
from app.locks.statements.common import (
    LockRow,
    Outcome,
    events,
    freezes,
    holders,
    locks,
    queue_columns,
)
from app.locks.transactions import Raced, TransactionRunner
from app.locks.values import Ask

T = TypeVar("T")
R = TypeVar("R")

PURGE_BATCH = 500
MIN_PURGE_AGE = timedelta(minutes=1)
MAX_FREEZE = timedelta(days=366)
RELEASE_BATCH = 200
MAX_HOLDER_LIMIT = 1000
MODES = (EXCLUSIVE, SHARED)
# What one entry of a lock list is (``LockService._sources``).
ENTRIES_EXCLUSIVE = "exclusive"
ENTRIES_GRANTS = "grants"
ENTRIES_RESOURCES = "resources"


def holder_errors(limit: Any, mode: Any) -> list[tuple[str, str]]:
    """What is wrong with an acquire's ``limit`` and ``mode``."""
    errors = []
    if (
        isinstance(limit, bool)
        or not isinstance(limit, int)
        or not 1 <= limit <= MAX_HOLDER_LIMIT
    ):
        errors.append(("limit", f"must be an integer from 1 to {MAX_HOLDER_LIMIT}"))
    if mode not in MODES:
        errors.append(("mode", "must be exclusive or shared"))
    elif mode == SHARED and not errors and limit > 1:
        errors.append(("mode", "shared grants have no limit: leave limit at 1"))
    return errors


@dataclass(frozen=True, slots=True)
class LockSettings:
    default_ttl: float = 30.0
    max_ttl: float = 86400.0
    expiring_within: float = 15.0
    retries: int = 5
    max_wait: float = 30.0
    max_waiters: int = 16
    max_waiters_per_token: int = 8
    wait_poll_interval: float = 0.05
    listen_url: str | None = None
    listen: bool = True

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> LockSettings:
        return cls(
            default_ttl=float(config["LOCKKEEPER_DEFAULT_TTL"]),
            max_ttl=float(config["LOCKKEEPER_MAX_TTL"]),
            expiring_within=float(config["LOCKKEEPER_EXPIRING_WITHIN"]),
            retries=int(config["LOCKKEEPER_DEADLOCK_RETRIES"]),
            max_wait=float(config["LOCKKEEPER_MAX_WAIT"]),
            max_waiters=int(config["LOCKKEEPER_MAX_WAITERS"]),
            max_waiters_per_token=int(config["LOCKKEEPER_MAX_WAITERS_PER_TOKEN"]),
            wait_poll_interval=float(config["LOCKKEEPER_WAIT_POLL_INTERVAL"]),
            listen_url=config.get("LOCKKEEPER_LISTEN_DATABASE_URL") or None,
            # LISTEN through a transaction-pooling PgBouncer hears nothing: without
            # a direct URL for it, waiters poll instead.
            listen=bool(
                config.get("LOCKKEEPER_LISTEN_DATABASE_URL")
                or not config.get("LOCKKEEPER_PGBOUNCER")
            ),
        )


class LockService:
    def __init__(
        self,
        engine: Engine,
        clock: Clock,
        settings: LockSettings,
        metrics: NoMetrics = NO_METRICS,
    ):
        self.engine = engine
        self.metrics = metrics
        self.clock = clock
        self.settings = settings
        self.dialect = engine.dialect.name
        self.statements = statements_for(self.dialect)
        self._transactional = self.statements.transactional
        # Where a place is acquired, renewed or released: the statements where
        # those are one statement each (PostgreSQL), else the transactional ones.
        self._places = (
            self.statements if self.statements.autocommit else self._transactional
        )
        self._has_server_clock = self.dialect in SERVER_CLOCK_DIALECTS
        self._autocommit_engine = autocommit(engine)
        self._driver = DriverConnection(self._autocommit_engine)
        self._write_engine = engine.execution_options(sqlite_immediate=True)
        # SQLite's hot path: its transaction on the driver's connection.
        self._driver_begin = self.statements.driver_transaction
        self._write_driver = DriverConnection(self._write_engine)
        self._runner = TransactionRunner(settings.retries)
        self.queue = WaitQueue(
            reads=self._autocommit_engine,
            run=self.run_transaction,
            clock=LineClock(
                now=self.now,
                given=self._now,
                server_now=self._server_now() if self._has_server_clock else None,
            ),
            metrics=metrics,
            max_waiters=settings.max_waiters,
            max_waiters_per_token=settings.max_waiters_per_token,
            poll_interval=settings.wait_poll_interval,
            listen_url=settings.listen_url,
            listen=settings.listen,
        )
        self.sessions = SessionService(self)
        # Disposing of the app's engine (a shutdown, a test's teardown) also ends
        # the queue's listener connection and threads.
        queue = self.queue
        event.listen(engine, "engine_disposed", lambda _engine: queue.stop())

    def close(self) -> None:
        """Stop the background threads of waiting (the LISTEN connection)."""
        self.queue.stop()

    # -- plumbing ------------------------------------------------------------

    def _now(self) -> datetime | None:
        """The caller-side clock reading, or None for "the server's, in SQL"."""
        now = self.clock.now()
        if now is None and not self._has_server_clock:
            return datetime.now(UTC)
        return now

    def run_transaction(
        self,
        work: Callable[[Connection], T],
        *,
        autocommit: bool = False,
        driver: bool = False,
        decide: Callable[[T], R] | None = None,
    ) -> R:
        """Run ``work`` in its own transaction and ``decide`` on its result, the
        pair retried by ``app.locks.transactions`` (deadlocks, lost first
        inserts, a row that changed before the decision: ``decide`` raises
        ``Raced``).

        ``autocommit``: ``work`` is one statement and gets the ``DriverConnection``.
        ``driver`` (and a statements class with ``driver_transaction``: SQLite,
        MariaDB):
        ``work`` gets a ``DriverTransaction`` instead of a SQLAlchemy connection.
        """

        def attempt():
            if autocommit:
                result = work(self._driver)
            elif driver and self._driver_begin is not None:
                with self._write_driver.transaction(self._driver_begin) as transaction:
                    result = work(transaction)
            else:
                with self._write_engine.connect() as conn, conn.begin():
                    result = work(conn)
            return result if decide is None else decide(result)

        return self._runner(attempt)

    def _lock(self, row, now: datetime) -> Lock:
        return Lock.from_row(row, now, self.settings.expiring_within)

    def _ttl(self, ttl: Any) -> float:
        return self.settings.default_ttl if ttl is None else ttl

    def validate(
        self,
        *,
        resource: Any = ...,
        owner: Any = ...,
        ttl: Any = ...,
        reason: Any = ...,
        actor: Any = ...,
        wait: Any = ...,
    ) -> None:
        """Raise ``InvalidInput`` naming every bad field among those given."""
        errors: list[tuple[str, str]] = []
        checks = (
            ("resource", resource, validation.resource_error),
            ("owner", owner, validation.name_error),
            ("actor", actor, lambda v: None if v is None else validation.name_error(v)),
            ("reason", reason, validation.reason_error),
            (
                "ttl",
                ttl,
                lambda v: (
                    None
                    if v is None
                    else validation.ttl_error(v, self.settings.max_ttl)
                ),
            ),
            (
                "wait",
                wait,
                lambda v: (
                    None
                    if v is None
                    else validation.wait_error(v, self.settings.max_wait)
                ),
            ),
        )
        for field, value, check in checks:
            if value is not ...:
                message = check(value)
                if message:
                    errors.append((field, message))
        if errors:
            raise InvalidInput(errors)

    # -- the worker's operations -------------------------------------------

    def acquire(
        self,
        resource: str,
        owner: str,
        ttl: float | None = None,
        actor: str | None = None,
        *,
        wait: float | None = None,
        still_wanted: Callable[[], bool] | None = None,
        token: str | None = None,
        max_locks: int | None = None,
        token_live: Callable[[], bool] | None = None,
        session: str | None = None,
        limit: int = 1,
        mode: str = EXCLUSIVE,
    ) -> AcquireResult:
        """Take ``resource`` for (``token``, ``owner``) if it is free, stale, or
        already theirs, and no one waits in line before us.

        ``wait`` = 0 (or None) never blocks, and a refusal names the current
        holder and writes nothing. ``wait`` > 0 waits in line up to that many
        seconds (see ``app.locks.queue``) while ``still_wanted()`` holds.
        ``max_locks``: the token's quota of live locks; a new grant beyond it
        raises ``QuotaExceeded`` (a re-acquire never does). ``token`` None: the
        caller has no token (tests, tools): it holds only locks with none recorded.
        ``token_live()``: whether the token is still live, asked again before every
        attempt in line and while waiting; the grant itself also refuses a token
        revoked or expired by then (``TokenEnded``), whatever this says.

        :raise WaitersFull: ``wait`` > 0 and this worker's waiting room is full.
        :raise ResourceFrozen: a freeze covers it and this would be a new grant
            (a same-owner re-acquire of a valid lock goes on).
        :raise TokenEnded: the token was revoked or expired before the grant.
        :raise LimitMismatch: the resource is in use with another ``limit``
            (or as a semaphore, asked ``shared``).

        ``session``: the id of a session of ``token`` to bind the grant to (its
        expiry is then the session's; ``ttl`` must be None), decided in a short
        transaction on every dialect (``app.locks.sessions``).

        ``limit``: how many holders the resource allows at once (1: an
        exclusive or read/write lock; above 1 a counting semaphore, whose
        places are its grants); ``mode`` SHARED: a grant that coexists with
        other shared grants (limit 1 only). Both take the places path
        (``app.locks.statements.places``); the exclusive lock keeps its own.

        :raise UnknownSession: no such session of ``token``.
        :raise SessionExpired: the session ran out before the grant.
        """
        self.validate(resource=resource, owner=owner, ttl=ttl, actor=actor, wait=wait)
        errors = holder_errors(limit, mode)
        if errors:
            raise InvalidInput(errors)
        places = limit != 1 or mode != EXCLUSIVE
        if session is not None:
            refuse_both_ttl_and_session(ttl, session)
            self.sessions._check_id(session)
        ask = Ask(resource, owner, token, self._ttl(ttl), actor, max_locks, limit, mode)
        if session is not None:

            def attempt(waiter: int | None) -> AcquireResult:
                return self.sessions.attempt(ask, session, waiter)

        elif places:

            def attempt(waiter: int | None) -> AcquireResult:
                return self._attempt_places(ask, waiter)

        else:

            def attempt(waiter: int | None) -> AcquireResult:
                return self._attempt(ask, waiter)

        try:
            result = attempt(None)
        except QuotaExceeded:
            self.metrics.acquire_refused("over_quota")
            raise
        if not result.acquired and wait:
            # The line's identity is the token (the actor may be a session's).
            result = self.queue.wait(
                attempt,
                resource=resource,
                owner=owner,
                token=token,
                seconds=wait,
                still_wanted=still_wanted or (lambda: True),
                token_live=token_live or (lambda: True),
            )
        if result.acquired:
            self.metrics.acquired(result.action)
        else:
            self.metrics.acquire_refused()
        return result

    def _attempt(self, ask: Ask, waiter: int | None) -> AcquireResult:
        """One decision; ``waiter``: our place in line, None for "not in line"."""

        def decide(outcome) -> AcquireResult:
            if outcome.done:
                return AcquireResult(
                    True, self._lock(outcome.row, outcome.now), outcome.action
                )
            if outcome.places:
                # Held by places: the places path decides (a promotion, a
                # refusal naming the place that ends first, a mismatch).
                return self._attempt_places(ask, waiter)
            return self._refusal(ask, outcome)

        return self.run_transaction(
            lambda conn: self.statements.acquire(conn, ask, self._now(), waiter),
            autocommit=self.statements.autocommit,
            driver=True,
            decide=decide,
        )

    def _attempt_places(self, ask: Ask, waiter: int | None) -> AcquireResult:
        """One decision of the places path: one statement where acquire is one
        (PostgreSQL), a plain read then one transaction elsewhere."""

        def decide(outcome) -> AcquireResult:
            if outcome.done:
                if waiter is not None and getattr(outcome.row, "waiters", 0):
                    # The next in line may be granted too (a shared head, a
                    # semaphore's free place): wake it now.
                    self.queue.notify_released(ask.resource, outcome.row.waiters)
                return AcquireResult(
                    True, self._lock(outcome.row, outcome.now), outcome.action
                )
            return self._refusal(ask, outcome)

        if self.statements.autocommit:
            return self.run_transaction(
                lambda conn: self._places.acquire_place(conn, ask, self._now(), waiter),
                autocommit=True,
                driver=True,
                decide=decide,
            )
        if waiter is None:
            with self._autocommit_engine.connect() as conn:
                full = self._transactional.peek_place(conn, ask, self._now())
            if full is not None:
                return self._refusal(ask, full)
        return self.run_transaction(
            lambda conn: self._transactional.acquire_place(
                conn, ask, self._now(), waiter
            ),
            decide=decide,
        )

    def _refusal(self, ask: Ask, outcome: Outcome) -> AcquireResult:
        """A refused attempt's answer (or its exception)."""
        resource, owner, token, max_locks = (
            ask.resource,
            ask.owner,
            ask.token,
            ask.max_locks,
        )
        row = outcome.row
        if outcome.limit_mismatch is not None:
            raise LimitMismatch(
                resource,
                outcome.limit_mismatch,
                ask.limit,
                self._lock(row, outcome.now) if row is not None else None,
            )
        queued = getattr(row, "waiters", 0) or 0
        if held_by_another(row, owner, token, outcome.now):
            return AcquireResult(False, self._lock(row, outcome.now), None, queued)
        if outcome.token_ended:
            raise TokenEnded(token)
        if outcome.freeze is not None:
            self.metrics.acquire_refused("frozen")
            raise ResourceFrozen(resource, Freeze.from_row(outcome.freeze))
        if outcome.over_quota:
            raise QuotaExceeded(
                token, max_locks, self._quota_retry_after(token, outcome.now)
            )
        if row is not None and queued:
            # Free or expired, but others are in line before us.
            holder = self._lock(row, outcome.now) if row.owner else None
            return AcquireResult(False, holder, None, queued)
        if (
            row is not None
            and row.owner is not None
            and row.expires_at > outcome.now
            and holds(row, owner, token)
        ):
            # Our own valid grant, refused: bound to a session (read only on
            # this refusal path), which alone renews it.
            bound = self.sessions.bound_session(resource)
            if bound is not None:
                raise SessionBound(resource, bound)
        places_until = getattr(row, "places_until", None)
        if places_until is not None and places_until > outcome.now:
            # Held by places (a refusal of the session-bound path, which does
            # not take the places path): the grant that ends first.
            grants = self.holders(resource).holders
            if grants:
                return AcquireResult(False, grants[0], None, queued)
        # The row we were refused on is gone or expired: it changed under us.
        raise Raced(f"acquire of {resource!r} kept racing", AcquireResult(False, None))

    def _quota_retry_after(self, token: str | None, now: datetime) -> float:
        """Seconds until the token's soonest lock expires (the refusal path only)."""
        soonest = None
        with self._autocommit_engine.connect() as conn:
            for table in (locks, holders):
                found = conn.scalar(
                    select(func.min(table.c.expires_at)).where(
                        table.c.token == token, table.c.expires_at > now
                    )
                )
                if found is not None and (soonest is None or found < soonest):
                    soonest = found
        if soonest is None:
            return 1.0
        return max((soonest - now).total_seconds(), 1.0)

    def renew(
        self,
        resource: str,
        owner: str,
        ttl: float | None = None,
        actor: str | None = None,
        *,
        token: str | None = None,
    ) -> Lock:
        """Extend the valid lock of (``token``, ``owner``) to ``now + ttl``; fence
        and acquired_at stay.

        :raise LockNotFound: no row. :raise LockExpired: the lock ran out (someone
            else may hold it). :raise NotOwner: validly held by another holder.
        """
        self.validate(resource=resource, owner=owner, ttl=ttl, actor=actor)
        ttl = self._ttl(ttl)

        def decide(outcome) -> Lock:
            row, now = outcome.row, outcome.now
            if outcome.done:
                self.metrics.renewal("renewed")
                return self._lock(row, now)
            if row is not None and (row.owner is None or row.expires_at <= now):
                # Not the exclusive grant's holder: the caller's place, if any
                # (a round trip only places pay).
                placed = self._place_operation(
                    lambda conn: self._places.renew_place(
                        conn, resource, owner, token, ttl, actor, self._now()
                    )
                )
                if placed is not None:
                    self.metrics.renewal("renewed")
                    return placed
            if row is None or row.owner is None:
                self.metrics.renewal("not_found")
                raise LockNotFound(resource)
            if row.expires_at <= now:
                self.metrics.renewal("expired")
                raise LockExpired(resource, owner)
            if not holds(row, owner, token):
                self.metrics.renewal("not_owner")
                raise NotOwner(resource, self._lock(row, now))
            # Valid and ours, yet refused: bound to a session (the refusal path
            # alone reads it), or it changed under us.
            bound = self.sessions.bound_session(resource)
            if bound is not None:
                self.metrics.renewal("session_bound")
                raise SessionBound(resource, bound)
            raise Raced(f"renewal of {resource!r} kept racing; try again")

        return self.run_transaction(
            lambda conn: self.statements.renew(
                conn, resource, owner, token, ttl, actor, self._now()
            ),
            autocommit=self.statements.autocommit,
            driver=True,
            decide=decide,
        )

    def release(
        self,
        resource: str,
        owner: str,
        actor: str | None = None,
        *,
        token: str | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> Lock:
        """Release the valid lock of (``token``, ``owner``); returns it as it was.
        ``details``: what the releasing worker reports (``lockkeeper exec``: how
        its command ended), kept as JSON with the ``released`` event.

        :raise LockNotFound: no row, or it expired (the caller has lost it).
        :raise NotOwner: validly held by another holder.
        """
        self.validate(resource=resource, owner=owner, actor=actor)
        reported = None if details is None else json.dumps(details, sort_keys=True)

        def decide(outcome) -> Lock:
            row, now = outcome.row, outcome.now
            if outcome.done:
                self.metrics.release("released")
                self.queue.notify_released(resource, getattr(row, "waiters", 0))
                return self._lock(row, now)
            if row is not None and (row.owner is None or row.expires_at <= now):
                placed = self._place_operation(
                    lambda conn: self._places.release_place(
                        conn, resource, owner, token, actor, self._now(), reported
                    )
                )
                if placed is not None:
                    self.metrics.release("released")
                    # A freed place goes to the head of the line at once.
                    self.queue.notify_released(resource, placed.waiters)
                    return placed
            if row is None or row.owner is None or row.expires_at <= now:
                free = row is None or row.owner is None
                self.metrics.release("not_found" if free else "expired")
                raise LockNotFound(
                    resource, f"no valid lock on {resource!r} to release"
                )
            if not holds(row, owner, token):
                self.metrics.release("not_owner")
                raise NotOwner(resource, self._lock(row, now))
            raise Raced(f"release of {resource!r} kept racing; try again")

        return self.run_transaction(
            lambda conn: self.statements.release(
                conn, resource, owner, token, actor, self._now(), reported
            ),
            autocommit=self.statements.autocommit,
            driver=True,
            decide=decide,
        )

    def _place_operation(self, work: Callable[[Connection], Outcome]) -> Lock | None:
        """Renew or release the caller's place (``work``: one statement on
        PostgreSQL, one transaction elsewhere): the place as it now is, or None
        when the caller holds none."""
        one_statement = self.statements.autocommit
        outcome = self.run_transaction(
            work, autocommit=one_statement, driver=one_statement
        )
        return self._lock(outcome.row, outcome.now) if outcome.done else None

    # -- the operator's actions --------------------------------------------

    def force_release(
        self,
        resource: str,
        *,
        actor: str,
        reason: str | None = None,
        expected_fence: int | None = None,
    ) -> Lock:
        """Remove the grant on ``resource`` whoever holds it, stale or not.

        ``expected_fence``: the fence of the grant the operator confirmed; compared
        under the row lock, in the transaction that removes it.

        :raise InvalidInput: no reason. :raise LockNotFound: nobody holds it.
        :raise LockChanged: it is held under another fence than ``expected_fence``.
        """
        self.validate(resource=resource, actor=actor, reason=reason)
        self._validate_fence(expected_fence)
        self._require_reason(reason, "to force-release a lock")

        statements = self._transactional

        def work(conn):
            row, now = statements.locked(conn, resource, self._now())
            rules.refuse_force_release(
                row,
                resource=resource,
                expected_fence=expected_fence,
                show=lambda found: self._lock(found, now),
            )
            return statements.force_remove(conn, row, now, actor=actor, reason=reason)

        outcome = self.run_transaction(work)
        self.metrics.operator_action(outcome.action)
        self.queue.notify_released(resource, getattr(outcome.row, "waiters", 0))
        return self._lock(outcome.row, outcome.now)

    def force_release_place(
        self, resource: str, fence: int, *, actor: str, reason: str | None
    ) -> Lock:
        """Remove the one grant of ``resource`` carrying ``fence`` (a place of a
        semaphore, or a shared grant), whoever holds it; the others stay. The
        fence is the one the operator confirmed, looked for under the resource
        row's lock in the transaction that removes it (one event).

        :raise InvalidInput: no reason, or a bad fence.
        :raise LockChanged: no grant of the resource carries ``fence`` now
            (``holder``: the live grant that ends first, or None).
        """
        self.validate(resource=resource, actor=actor, reason=reason)
        if fence is None:
            raise InvalidInput([("fence", "is required")])
        self._validate_fence(fence)
        self._require_reason(reason, "to force-release a lock")
        statements = self._transactional

        def decide(found) -> Outcome:
            outcome, first = found
            if not outcome.done:
                shown = self._lock(first, outcome.now) if first is not None else None
                raise LockChanged(resource, fence, shown)
            return outcome

        outcome = self.run_transaction(
            lambda conn: statements.force_remove_place(
                conn, resource, fence, actor, reason, self._now()
            ),
            decide=decide,
        )
        self.metrics.operator_action(outcome.action)
        self.queue.notify_released(resource, getattr(outcome.row, "waiters", 0))
        return self._lock(outcome.row, outcome.now)

    def force_release_all(
        self,
        resource: str,
        *,
        actor: str,
        reason: str | None,
        fences: Collection[int] | None = None,
    ) -> AllReleased:
        """Remove every grant of ``resource`` whoever holds it: its places,
        its shared grants and its exclusive grant (stale too, as
        ``force_release``), decided under the resource row's lock in one
        transaction, one ``force_released`` event each.

        ``fences``: the grants the operator confirmed; a grant carrying another
        fence came since and is left alone (and reported), as is a confirmed
        fence no grant carries any more. None: every grant there now.

        :raise InvalidInput: no reason, or a bad fence.
        :raise LockNotFound: nobody holds it.
        """
        self.validate(resource=resource, actor=actor, reason=reason)
        if fences is not None:
            fences = list(fences)
            if not fences:
                raise InvalidInput([("fence", "confirm at least one grant")])
            for fence in fences:
                self._validate_fence(fence)
        self._require_reason(reason, "to force-release a lock")
        statements = self._transactional

        def decide(found) -> Any:
            if not found.released and not found.left_alone:
                raise LockNotFound(resource)
            return found

        done = self.run_transaction(
            lambda conn: statements.force_remove_all(
                conn, resource, fences, actor, reason, self._now()
            ),
            decide=decide,
        )
        for _ in done.released:
            self.metrics.operator_action(Action.FORCE_RELEASED)
        if done.released:
            self.queue.notify_released(resource, done.waiters)
        return AllReleased(
            [self._lock(grant, done.now) for grant in done.released],
            [self._lock(grant, done.now) for grant in done.left_alone],
            done.gone,
        )

    def force_release_fenced(
        self,
        grants: Sequence[tuple[str, int]],
        *,
        actor: str,
        reason: str | None,
    ) -> FencedRelease:
        """Force-release each ``(resource, fence)`` the operator selected: an
        exclusive grant, a semaphore's place or a shared grant, each by its
        fence. Per resource one transaction under its row lock
        (``force_release_all`` with the fences selected there, one event per
        grant); a selected fence no grant carries any more (the grant changed
        hands or ended since) is left alone and reported with the grant there
        now, and the resource's other grants, not selected, stay. Every input
        is checked before anything changes."""
        self.validate(actor=actor, reason=reason)
        self._require_reason(reason, "to force-release a lock")
        if not grants:
            raise InvalidInput([("locks", "choose at least one lock")])
        by_resource: dict[str, list[int]] = {}
        for resource, fence in grants:
            self.validate(resource=resource)
            self._validate_fence(fence)
            by_resource.setdefault(resource, []).append(fence)
        released: list[Lock] = []
        left: list[LockChanged] = []
        for resource, fences in by_resource.items():
            try:
                done = self.force_release_all(
                    resource, actor=actor, reason=reason, fences=fences
                )
            except LockNotFound:
                left.extend(LockChanged(resource, fence, None) for fence in fences)
                continue
            released.extend(done.released)
            there = done.left_alone[0] if done.left_alone else None
            left.extend(LockChanged(resource, fence, there) for fence in done.gone)
        return FencedRelease(released, left)

    def claim(
        self,
        resource: str,
        owner: str,
        ttl: float | None = None,
        *,
        actor: str,
        reason: str | None = None,
        force: bool = False,
        expected_fence: int | None = None,
        for_token: str | None = None,
        mode: str = EXCLUSIVE,
    ) -> Lock:
        """Grant ``resource`` to ``owner`` with a new fence, as an operator.

        Taking a lock another holder validly holds needs ``force`` and a reason.
        ``expected_fence``: the fence of the grant the operator saw (stale or
        valid); the claim is refused if another one, or none, is in place.
        ``for_token``: the name of the live API token whose workers may renew
        and release the grant; None binds it to no token (only an operator can
        end it then).

        :raise LockHeld: validly held by another holder and ``force`` is false.
        :raise InvalidInput: taking it from a valid holder without a reason.
        :raise LockChanged: the grant is no longer the one of ``expected_fence``.
        :raise ResourceFrozen: a freeze covers it and ``force`` is false.

        Held by places, a claim takes one of them, a grant of its own beside
        the others (never one of theirs, ``force`` or not): a free place of a
        semaphore, or with ``mode`` SHARED a shared grant among the readers
        (of a free resource too); an exclusive claim of shared grants, and
        a shared one of a semaphore or an exclusive grant, are refused.

        :raise PlacesHeld: a semaphore with no free place, or the wrong mode.
        """
        self.validate(
            resource=resource, owner=owner, ttl=ttl, actor=actor, reason=reason
        )
        self._validate_fence(expected_fence)
        if mode not in MODES:
            raise InvalidInput([("mode", f"must be one of {', '.join(MODES)}")])
        token_error = for_token is not None and validation.name_error(
            for_token, "for_token"
        )
        if token_error:
            raise InvalidInput([("for_token", token_error)])
        token = for_token if for_token is not None else NO_TOKEN
        ttl = self._ttl(ttl)

        statements = self._transactional

        def work(conn):
            view = statements.claim_view(
                conn, resource, token, self._now(), frozen_too=force
            )
            if view.token_ended:
                return Outcome(False, None, view.row, view.now, token_ended=True)
            row = view.row
            places = (
                statements.live_grants(conn, row, view.now)
                if row is not None
                and row.places_until is not None
                and row.places_until > view.now
                else []
            )
            if places or mode == SHARED:
                rules.refuse_place_claim(
                    view,
                    places,
                    resource=resource,
                    owner=owner,
                    token=token,
                    mode=mode,
                    expected_fence=expected_fence,
                    show=lambda found: self._lock(found, view.now),
                )
                return statements.write_place_claim(
                    conn, view, resource, owner, token, mode, ttl,
                    actor=actor, reason=reason,
                )  # fmt: skip
            taking = rules.claim_takes_from_holder(
                view.row,
                view.now,
                resource=resource,
                owner=owner,
                token=token,
                expected_fence=expected_fence,
                force=force,
                freeze=view.freeze,
                reason=reason,
                show=lambda found: self._lock(found, view.now),
            )
            return statements.write_claim(
                conn,
                view,
                resource,
                owner,
                token,
                ttl,
                actor=actor,
                reason=reason,
                takes_from_holder=taking,
            )

        outcome = self.run_transaction(work)
        if outcome.token_ended:
            raise InvalidInput([("for_token", f"no live API token is named {token!r}")])
        self.metrics.operator_action(outcome.action)
        return self._lock(outcome.row, outcome.now)

    @staticmethod
    def _require_reason(reason: str | None, why: str) -> None:
        rules.require_reason(reason, why)

    @staticmethod
    def _validate_fence(fence: Any) -> None:
        if fence is None:
            return
        if isinstance(fence, bool) or not isinstance(fence, int) or fence < 1:
            raise InvalidInput([("fence", "must be a positive integer")])

    def release_stale(
        self,
        *,
        actor: str,
        reason: str | None,
        prefix: str | None = None,
        owner: str | None = None,
        owner_contains: str | None = None,
    ) -> list[Lock]:
        """Force-release every stale lock (matching ``prefix`` and ``owner``, or
        owners containing ``owner_contains`` as ``list_locks`` matches them) with
        one reason, a batch per transaction, one ``force_released`` event per
        lock; returns the locks released. A lock renewed or taken over before its
        batch locks it is left alone: staleness is judged under the row lock."""
        self.validate(actor=actor, reason=reason)
        self._validate_filters(prefix, owner, owner_contains)
        self._require_reason(reason, "to force-release locks")
        released: list[Lock] = []
        while True:
            batch = self.run_transaction(
                lambda conn: self._transactional.release_stale_batch(
                    conn,
                    prefix,
                    owner,
                    actor,
                    reason,
                    self._now(),
                    RELEASE_BATCH,
                    owner_contains=owner_contains,
                )
            )
            for outcome in batch.released:
                self.metrics.operator_action(Action.FORCE_RELEASED)
                released.append(self._lock(outcome, batch.now))
            if batch.candidates < RELEASE_BATCH:
                return released

    def count_stale(
        self,
        *,
        prefix: str | None = None,
        owner: str | None = None,
        owner_contains: str | None = None,
    ) -> int:
        """How many stale locks ``release_stale`` with these filters would
        release right now."""
        self._validate_filters(prefix, owner, owner_contains)
        query = select(func.count()).select_from(locks)
        query = query.where(
            locks.c.owner.is_not(None),
            self._state_condition(LockState.STALE, self.now()),
        )
        if prefix:
            query = query.where(starts_with(locks.c.resource, prefix))
        if owner is not None:
            query = query.where(locks.c.owner == owner)
        if owner_contains:
            query = query.where(listing.owner_contains(owner_contains))
        with self._autocommit_engine.connect() as conn:
            return conn.scalar(query)

    @staticmethod
    def _validate_filters(
        prefix: str | None, owner: str | None, owner_contains: str | None = None
    ) -> None:
        errors = []
        if _filter_error(prefix):
            errors.append(("prefix", _filter_error(prefix)))
        if _filter_error(owner_contains):
            errors.append(("owner", _filter_error(owner_contains)))
        if owner is not None and validation.name_error(owner):
            errors.append(("owner", validation.name_error(owner)))
        if errors:
            raise InvalidInput(errors)

    # -- freezes --------------------------------------------------------------

    def freeze(
        self,
        prefix: str,
        *,
        actor: str,
        reason: str | None,
        duration: timedelta | None = None,
    ) -> Freeze:
        """Stop new grants of every resource starting with ``prefix``, until
        unfrozen or, with ``duration``, until that much later by the deciding
        clock. Freezing a frozen prefix again replaces its reason and end."""
        self.validate(actor=actor, reason=reason)
        errors = []
        if validation.resource_error(prefix):
            errors.append(("prefix", validation.resource_error(prefix)))
        if duration is not None and not (timedelta(0) < duration <= MAX_FREEZE):
            errors.append(("for", f"must be more than 0 and at most {MAX_FREEZE}"))
        if errors:
            raise InvalidInput(errors)
        self._require_reason(reason, "to freeze")

        def work(conn) -> Freeze:
            existing = conn.execute(
                select(freezes.c.id).where(freezes.c.prefix == prefix).with_for_update()
            ).one_or_none()
            now = self._clock_in(conn)
            ends_at = now + duration if duration is not None else None
            values = {
                "reason": reason,
                "actor": actor,
                "frozen_at": now,
                "ends_at": ends_at,
            }
            if existing is None:
                conn.execute(insert(freezes).values(prefix=prefix, **values))
            else:
                conn.execute(
                    update(freezes).where(freezes.c.id == existing.id).values(**values)
                )
            self._log_freeze(conn, Action.FROZEN, prefix, actor, reason, now, ends_at)
            return Freeze(prefix, reason, actor, now, ends_at)

        return self.run_transaction(work)

    def unfreeze(self, prefix: str, *, actor: str, reason: str | None) -> Freeze:
        """End the freeze of ``prefix`` now; returns it as it was.

        :raise NotFrozen: no freeze of ``prefix`` is in force.
        """
        self.validate(actor=actor, reason=reason)
        if validation.resource_error(prefix):
            raise InvalidInput([("prefix", validation.resource_error(prefix))])
        self._require_reason(reason, "to unfreeze")

        def work(conn) -> Freeze:
            row = conn.execute(
                select(freezes).where(freezes.c.prefix == prefix).with_for_update()
            ).one_or_none()
            now = self._clock_in(conn)
            if row is None or (row.ends_at is not None and row.ends_at <= now):
                raise NotFrozen(prefix)
            conn.execute(delete(freezes).where(freezes.c.id == row.id))
            self._log_freeze(conn, Action.UNFROZEN, prefix, actor, reason, now, now)
            return Freeze.from_row(row)

        return self.run_transaction(work)

    def list_freezes(
        self, *, scope: tuple[str, ...] | None = None, at: datetime | None = None
    ) -> list[Freeze]:
        """The freezes in force now (``at``: the instant a page judges
        everything at, read once for it), by prefix; ``scope``: the asking
        token's prefixes, and only the freezes that cover one of its resources
        (a freeze inside the scope, or one over all of a scope prefix, which
        its acquires would be refused with anyway)."""
        now = self._read_at(at)
        query = (
            select(freezes)
            .where(freezes.c.ends_at.is_(None) | (freezes.c.ends_at > now))
            .order_by(freezes.c.prefix)
        )
        with self._autocommit_engine.connect() as conn:
            found = [Freeze.from_row(row) for row in conn.execute(query)]
        if scope is None:
            return found
        return [
            freeze
            for freeze in found
            if any(
                freeze.prefix.startswith(mine) or mine.startswith(freeze.prefix)
                for mine in scope
            )
        ]

    def freezes_over(self, resource: str) -> list[Freeze]:
        """The freezes in force now whose prefix ``resource`` starts with."""
        return [f for f in self.list_freezes() if resource.startswith(f.prefix)]

    def _clock_in(self, conn) -> datetime:
        """The deciding clock, inside ``conn``'s transaction (after its locks)."""
        now = self._now()
        return now if now is not None else self._transactional.read_now(conn)

    def _log_freeze(self, conn, action, prefix, actor, reason, now, ends_at) -> None:
        conn.execute(
            insert(events).values(
                resource=prefix,
                action=action.value,
                expires_at=ends_at,
                actor=actor,
                reason=reason,
                occurred_at=now,
            )
        )

    def purge_stale(self, older_than: timedelta) -> list[str]:
        """Delete rows expired (or released) longer than ``older_than`` ago, and
        sessions expired as long ago; returns the resources whose stale locks
        were removed.

        Fences come from a database-wide sequence, not from the row, so they keep
        increasing. The minimum age keeps purges away from grants in flight: a
        first insert draws its fence before it owns the row, and must not find a
        row that was granted, released and purged in that instant.
        """
        if older_than < MIN_PURGE_AGE:
            raise InvalidInput([("older_than", "must be at least one minute")])
        cutoff = self.now() - older_than
        # Sessions first: deleting one records when its grants still bound
        # ran out, which it finds on their rows (purged with it).
        purged = self.sessions.purge_expired(cutoff, PURGE_BATCH)
        while True:
            batch = self.run_transaction(
                lambda conn: self._transactional.purge_stale_batch(
                    conn, cutoff, PURGE_BATCH
                )
            )
            purged += [row.resource for row in batch if row.owner is not None]
            if len(batch) < PURGE_BATCH:
                return purged

    # -- reads --------------------------------------------------------------

    def now(self) -> datetime:
        """The deciding clock's current reading."""
        now = self._now()
        if now is not None:
            return now
        with self._autocommit_engine.connect() as conn:
            return self._transactional.read_now(conn)

    def _read_at(self, at: datetime | None) -> datetime:
        """``at``, the instant a page's reads are all judged at (one reading of
        the clock per page: on PostgreSQL and MariaDB each is a round trip),
        or the clock's reading now when a caller gives none."""
        return at if at is not None else self.now()

    def get(self, resource: str, *, include_stale: bool = False) -> Lock:
        """The lock on ``resource``; :raise LockNotFound: absent (or stale, unless
        ``include_stale``)."""
        self.validate(resource=resource)
        now = self._now()
        now_column = (
            literal(now, UTCDateTime()) if now is not None else self._server_now()
        ).label("now")
        waiting, _ = queue_columns(locks.c.resource, now_column.element)
        bound = None
        with self._autocommit_engine.connect() as conn:
            row = conn.execute(
                select(locks, now_column, waiting).where(locks.c.resource == resource)
            ).one_or_none()
            if row is not None and row.session_id is not None and row.owner:
                # A probe only a row with a session id pays: still bound?
                found = self.sessions.statements.session_of(conn, resource)
                bound = found.id if found is not None else None
            places = (
                self._live_places(conn, row)
                if row is not None
                and row.places_until is not None
                and row.places_until > row.now
                else []
            )
        if places:
            # Held by places: the one that ends first.
            return places[0]
        if row is None or row.owner is None:
            raise LockNotFound(resource)
        lock = self._lock(row, row.now)
        if bound is not None:
            lock = dataclasses.replace(lock, session=bound)
        if lock.state is LockState.STALE and not include_stale:
            raise LockNotFound(resource, f"the lock on {resource!r} has expired")
        return lock

    def _live_places(self, conn, row) -> list[Lock]:
        """The live places of ``row``'s resource (read with ``row.now``), the
        one that ends first first."""
        bound = listing.bound_session(
            holders.c.session_id,
            holders.c.owner,
            holders.c.token,
            holders.c.expires_at,
        ).label("session")
        found = conn.execute(
            select(holders, bound)
            .where(holders.c.resource == row.resource, holders.c.expires_at > row.now)
            .order_by(holders.c.expires_at, holders.c.id)
        ).all()
        return [
            dataclasses.replace(
                self._lock(
                    LockRow.of(
                        place,
                        waiters=row.waiters,
                        holder_limit=row.holder_limit,
                        holders=len(found),
                    ),
                    row.now,
                ),
                session=place.session,
            )
            for place in found
        ]

    def holders(self, resource: str) -> Holders:
        """Every live grant of ``resource`` (the one that ends first first), its
        limit and mode, and how many wait in line."""
        self.validate(resource=resource)
        now = self._now()
        now_column = (
            literal(now, UTCDateTime()) if now is not None else self._server_now()
        ).label("now")
        waiting, _ = queue_columns(locks.c.resource, now_column.element)
        bound = listing.bound_session(
            locks.c.session_id, locks.c.owner, locks.c.token, locks.c.expires_at
        ).label("session")
        with self._autocommit_engine.connect() as conn:
            row = conn.execute(
                select(locks, now_column, waiting, bound).where(
                    locks.c.resource == resource
                )
            ).one_or_none()
            if row is None:
                return Holders(resource, 1, EXCLUSIVE, [], 0)
            grants = self._live_places(conn, row)
        if row.owner is not None and row.expires_at > row.now:
            grants = [self._lock(row, row.now)]
        mode = grants[0].mode if grants else EXCLUSIVE
        return Holders(resource, row.holder_limit or 1, mode, grants, row.waiters)

    def check_fence(self, resource: str, fence: Any) -> Lock:
        """The lock on ``resource`` if its valid grant carries ``fence``.

        :raise FenceMismatch: it does not (another grant, an expired one, none).
        """
        self.validate(resource=resource)
        self._validate_fence(fence)
        if fence is None:
            raise InvalidInput([("fence", "is required")])
        try:
            lock = self.get(resource, include_stale=True)
        except LockNotFound:
            raise FenceMismatch(resource, fence, None) from None
        if lock.holders > 1 or lock.mode == SHARED:
            # Any live grant carrying the fence.
            for grant in self.holders(resource).holders:
                if grant.fence == fence:
                    return grant
            raise FenceMismatch(resource, fence, lock)
        if lock.fence != fence or lock.state is LockState.STALE:
            raise FenceMismatch(resource, fence, lock)
        return lock

    def _server_now(self):
        return self._transactional._server_now().cast(UTCDateTime())

    def _state_condition(
        self, state: LockState | None, now: datetime, expires_at=locks.c.expires_at
    ):
        if state is None:
            return None
        return state_condition(state, expires_at, now, self.settings.expiring_within)

    def _state_counts(self, now: datetime, expires_at=locks.c.expires_at) -> list:
        """One ``count`` column per state, labelled by its name."""
        return [
            func.count(case((self._state_condition(state, now, expires_at), 1))).label(
                state.value
            )
            for state in LockState
        ]

    @staticmethod
    def _sources(entries: str) -> list[Any]:
        """The grant sources (``listing.GRANT_COLUMNS``) a list of ``entries``
        reads: ``exclusive`` the exclusive grants only (what a whole-lock
        operator action takes); ``grants`` every place and shared grant as an
        entry of its own too; ``resources`` a resource held by places as one
        entry, its grant that ends first. A statement reading them binds
        ``listing.LISTED_AT``, the instant whose live places they are."""
        return SOURCES[entries]

    def list_locks(
        self,
        *,
        state: LockState | str | None = None,
        prefix: str | None = None,
        owner: str | None = None,
        limit: int = DEFAULT_PAGE,
        cursor: str | None = None,
        scope: tuple[str, ...] | None = None,
        owner_contains: str | None = None,
        sort: str = "resource",
        contended: bool = False,
        offset: int | None = None,
        entries: str = ENTRIES_EXCLUSIVE,
        at: datetime | None = None,
    ) -> Page[Lock]:
        """Locks a page at a time, ordered by ``sort`` (a key of ``SORT_KEYS``,
        ``-`` first for descending; ties by resource, then fence) with a keyset
        cursor, or from ``offset`` (numbered pages; no cursor then);
        ``scope``: the asking token's prefixes, outside which nothing is listed;
        ``owner_contains``: owners containing this text, ignoring case (any
        holder's, for a resource held by places); ``contended``: only locks
        with a live waiter; ``entries``: what one entry is (``_sources``);
        ``at``: the instant to judge the locks at (``_read_at``)."""
        errors = []
        descending = sort.startswith("-")
        sort_key = sort.removeprefix("-")
        if sort_key not in SORT_KEYS:
            errors.append(("sort", "must be one of " + ", ".join(SORT_KEYS)))
            sort_key = "resource"
        state, filter_errors = self._list_filters(state, prefix, owner, owner_contains)
        errors += filter_errors
        limit_error = page_limit_error(limit)
        if limit_error:
            errors.append(("limit", limit_error))
        if offset is not None and (
            isinstance(offset, bool) or not isinstance(offset, int) or offset < 0
        ):
            errors.append(("offset", "must be a whole number, 0 or more"))
        now = self._read_at(at)
        position = None
        if cursor is not None:
            try:
                position = read_cursor(cursor, lambda p: _read_position(sort_key, p))
            except ValueError as exc:
                errors.append(("cursor", str(exc)))
        if errors:
            raise InvalidInput(errors)

        # The urgent order ranks by the instant of the first page, so that the
        # pages after it continue the same order while time moves on.
        ranked_at = position["at"] if position and "at" in position else now
        waiting_counts = listing.waiter_counts(literal(now, UTCDateTime()))
        filters = {
            "state": state,
            "prefix": prefix,
            "owner": owner,
            "owner_contains": owner_contains,
            "scope": scope,
            "contended": contended,
        }
        # Each source's page is chosen on its own (in the order of its
        # indexes, limited first), then the pages are merged: no sort of every
        # lock. The rows' waiters are counted only then: a count in the ordered
        # select is one probe of the line per lock sorted (100,000 of them),
        # not per lock shown.
        fetch = limit + 1 if offset is None else offset + limit
        page = PageAsked(position, descending, fetch)
        branches = []
        for source in self._sources(entries):
            if sort_key == "urgent":
                branches += self._urgent_branches(source, now, ranked_at, filters, page)
            elif sort_key == "waiters":
                branches += self._waiters_branches(
                    source, now, waiting_counts, filters, page
                )
            else:
                order = _order(sort_key, source)
                branches.append(self._one_range(source, order, now, filters, page))
        merged = union_all(*branches).subquery("merged")
        keys = [c for c in merged.c if c.name.startswith("sort_")]
        query = select(merged).order_by(
            *(c.desc() if descending else c.asc() for c in keys),
            merged.c.fence.desc() if descending else merged.c.fence.asc(),
        )
        if offset is not None:
            query = query.offset(offset).limit(limit)
        else:
            query = query.limit(limit + 1)
        chosen = query.subquery("chosen")
        at = literal(now, UTCDateTime())
        waiting, _ = queue_columns(chosen.c.resource, at)
        held_now = case(
            (chosen.c.placed == 1, listing.live_holder_count(chosen.c.resource, at)),
            else_=1,
        ).label("holders")
        bound = listing.bound_session(
            chosen.c.session_id, chosen.c.owner, chosen.c.token, chosen.c.expires_at
        ).label("session")
        shown = select(chosen, waiting, held_now, bound).order_by(
            *(
                chosen.c[key.name].desc() if descending else chosen.c[key.name].asc()
                for key in keys
            ),
            chosen.c.fence.desc() if descending else chosen.c.fence.asc(),
        )

        def position_of(row) -> dict[str, Any]:
            found: dict[str, Any] = {"resource": row.resource, "fence": row.fence}
            if sort_key == "urgent":
                found["at"] = ranked_at.isoformat()
                found["key"] = [row.sort_0, row.expires_at.isoformat()]
            elif sort_key == "waiters":
                found["key"] = row.sort_0
            elif sort_key not in ("resource", "natural"):
                value = getattr(row, SORT_KEYS[sort_key])
                found["key"] = (
                    value.isoformat() if isinstance(value, datetime) else value
                )
            return found

        with self._autocommit_engine.connect() as conn:
            rows = conn.execute(shown, {listing.LISTED_AT: now}).all()
        next_cursor = None
        if offset is None and len(rows) > limit:
            rows = rows[:limit]
            next_cursor = encode_cursor(position_of(rows[-1]))
        items = [self._lock(row, now) for row in rows]
        return Page(items, next_cursor)

    def _one_range(
        self,
        source,
        order: list[Any],
        now: datetime,
        filters: dict[str, Any],
        page: PageAsked,
        joined=None,
    ):
        """``source``'s page in ``order`` (``joined``: read from that join of
        it): an index range of the exclusive grants (the unique resource
        last), or a few places (ordered by their fence after it too)."""
        keys = [column.label(f"sort_{n}") for n, column in enumerate(order)]
        query = select(source, *keys)
        if joined is not None:
            query = query.select_from(joined)
        query = self._filtered(query, source, now, **filters)
        if page.position is not None:
            query = query.where(page.after(order, source))
        by = page.ordered(order, source)
        return select(query.order_by(*by).limit(page.fetch).subquery())

    def _urgent_branches(
        self,
        source,
        now: datetime,
        ranked_at: datetime,
        filters: dict[str, Any],
        page: PageAsked,
    ) -> list[Any]:
        """The urgent order's page of ``source`` as three index ranges, one per
        rank (contended; live, by expiry; stale, by expiry), each ordered by
        (expires_at, resource) as ``ix_distributed_locks_expires_at_resource``
        is, and limited before they are merged: no sort of every lock."""
        at = literal(ranked_at, UTCDateTime())
        contended_now = listing.is_contended(at, source.c.resource)
        expires_at = source.c.expires_at
        ranks = {
            URGENT_CONTENDED: contended_now,
            URGENT_LIVE: and_(~contended_now, expires_at > at),
            URGENT_STALE: and_(~contended_now, expires_at <= at),
        }
        if listing.only_live(source):
            # A few live places: one range, ranked as it is read (never stale).
            rank = case((contended_now, URGENT_CONTENDED), else_=URGENT_LIVE)
            order = [rank, expires_at, source.c.resource]
            return [self._one_range(source, order, now, filters, page)]
        within_rank = [expires_at, source.c.resource]
        branches = []
        for rank, condition in ranks.items():
            query = select(
                source,
                literal(rank).label("sort_0"),
                expires_at.label("sort_1"),
                source.c.resource.label("sort_2"),
            ).where(condition)
            query = self._filtered(query, source, now, **filters)
            fetch: Any = page.fetch
            if rank == URGENT_STALE and page.position is None and not page.descending:
                fetch = self._stale_fetch(source, at, now, filters, page)
            if page.position is not None:
                at_rank, *rest = page.position["values"]
                if (rank < at_rank) != page.descending and rank != at_rank:
                    continue  # a rank the cursor is past
                if rank == at_rank:
                    query = query.where(page.after(within_rank, source, rest))
            order = page.ordered(within_rank, source)
            branches.append(select(query.order_by(*order).limit(fetch).subquery()))
        return branches

    def _stale_fetch(
        self,
        source,
        at,
        now: datetime,
        filters: dict[str, Any],
        page: PageAsked,
    ):
        """How many stale entries of ``source`` a page from the first (by
        offset, urgent first) reads: none when its live entries alone (the
        ranks before the stale one) fill the ``page.fetch`` rows, else
        ``page.fetch``. A deep page (``?page=40``) then skips its offset's
        worth of stale locks it would only drop. The limit is a scalar
        subquery, read once before the range (a PostgreSQL init plan; SQLite
        evaluates LIMIT first), over at most ``page.fetch`` entries of the
        expiry index. MariaDB takes only a number there: it reads the stale
        rank as before. Only for an unfiltered list: a name, owner or
        contended filter would make the count probe the live range row by row
        for its few matches (more than the stale rows it saves), and a state
        leaves one of the two ranges empty, found at no cost without it."""
        if self.dialect not in ("sqlite", "postgresql") or any(filters.values()):
            return page.fetch
        live = self._filtered(
            select(source.c.resource).where(source.c.expires_at > at),
            source,
            now,
            **filters,
        ).limit(page.fetch)
        counted = select(func.count()).select_from(live.subquery("live_first"))
        return case((counted.scalar_subquery() >= page.fetch, 0), else_=page.fetch)

    def _waiters_branches(
        self,
        source,
        now: datetime,
        waiting_counts,
        filters: dict[str, Any],
        page: PageAsked,
    ) -> list[Any]:
        """The waiters order's page of ``source`` as two parts: the few locks
        with waiters (joined to their counts) and the rest (no waiters), read
        in the resource index's order, each limited to the page first."""
        waiting = waiting_counts.c.waiting
        resource = source.c.resource
        if listing.only_live(source):
            # A few live places: one range, their counts joined as they are read.
            order = [func.coalesce(waiting, 0), resource]
            joined = source.outerjoin(
                waiting_counts, waiting_counts.c.resource == resource
            )
            return [self._one_range(source, order, now, filters, page, joined)]
        waited = select(
            source, waiting.label("sort_0"), resource.label("sort_1")
        ).select_from(
            source.join(waiting_counts, waiting_counts.c.resource == resource)
        )
        alone = select(source, literal(0).label("sort_0"), resource.label("sort_1"))
        alone = alone.where(resource.not_in(select(waiting_counts.c.resource)))
        parts = []
        for part, count in ((waited, waiting), (alone, None)):
            query = self._filtered(part, source, now, **filters)
            order = [count, resource] if count is not None else [resource]
            if page.position is not None:
                at_count, at_resource = page.position["values"]
                if count is None:
                    if at_count != 0 and (at_count > 0) != page.descending:
                        continue  # past every lock without waiters
                    if at_count == 0:
                        query = query.where(page.after(order, source, [at_resource]))
                else:
                    query = query.where(page.after(order, source))
            by = page.ordered(order, source)
            parts.append(select(query.order_by(*by).limit(page.fetch).subquery()))
        return parts

    def count_locks(
        self,
        *,
        state: LockState | str | None = None,
        prefix: str | None = None,
        owner_contains: str | None = None,
        contended: bool = False,
    ) -> int:
        """How many locks ``list_locks`` with these filters would list in all,
        one per resource (the count behind the overview's numbered pages)."""
        state, errors = self._list_filters(state, prefix, None, owner_contains)
        if errors:
            raise InvalidInput(errors)
        now = self.now()
        counts = [
            self._filtered(
                select(func.count()).select_from(source),
                source,
                now,
                state=state,
                prefix=prefix,
                owner_contains=owner_contains,
                contended=contended,
            ).scalar_subquery()
            for source in self._sources(ENTRIES_RESOURCES)
        ]
        exclusive, placed = counts
        with self._autocommit_engine.connect() as conn:
            return conn.scalar(select(exclusive + placed), {listing.LISTED_AT: now})

    def _list_filters(
        self,
        state: LockState | str | None,
        prefix: str | None,
        owner: str | None,
        owner_contains: str | None,
    ) -> tuple[LockState | None, list[tuple[str, str]]]:
        """The state a list asks for, and what is wrong with its filters."""
        errors = []
        if _filter_error(owner_contains):
            errors.append(("owner", _filter_error(owner_contains)))
        chosen = None
        if state not in (None, "all"):
            try:
                chosen = LockState(state)
            except ValueError:
                errors.append(("state", "must be one of held, expiring, stale, all"))
        if prefix is not None and (
            len(prefix) > validation.MAX_NAME
            or validation.has_control_characters(prefix)
        ):
            errors.append(("prefix", "must be at most 255 printable characters"))
        if owner is not None and validation.name_error(owner):
            errors.append(("owner", validation.name_error(owner)))
        return chosen, errors

    def _filtered(
        self,
        query,
        source,
        now: datetime,
        *,
        state: LockState | None = None,
        prefix: str | None = None,
        owner: str | None = None,
        owner_contains: str | None = None,
        scope: tuple[str, ...] | None = None,
        contended: bool = False,
    ):
        """``query`` narrowed to the entries of ``source`` a list's filters
        select."""
        resource = source.c.resource
        condition = self._state_condition(state, now, source.c.expires_at)
        if condition is not None:
            query = query.where(condition)
        if prefix:
            query = query.where(starts_with(resource, prefix))
        if scope is not None:
            query = query.where(within(resource, scope))
        at = literal(now, UTCDateTime())
        if owner is not None:
            query = query.where(
                listing.held_by_owner(source, lambda column: column == owner, at)
            )
        if owner_contains:
            query = query.where(
                listing.held_by_owner(
                    source,
                    lambda column: listing.owner_contains(owner_contains, column),
                    at,
                )
            )
        if contended:
            query = query.where(listing.is_contended(at, resource))
        return query

    def _grouped_counts(
        self,
        entries: str,
        group,
        prefix,
        owner_contains,
        at: datetime | None = None,
        contended: bool = False,
    ) -> list:
        """(name, held, expiring, stale) over ``entries`` (``_sources``) per
        ``group`` (a function of a source's columns), the sources' counts of
        one name summed; ``group`` None: one row named ``""``, every entry;
        ``contended``: and how many of them have a live waiter, last, counted
        in the same pass (each source, the place-held window above all, is
        evaluated once for both)."""
        now = self._read_at(at)
        waited = []
        parts = []
        everywhere = group is None and not prefix and not owner_contains
        for source in self._sources(entries):
            if everywhere and source is listing.EXCLUSIVE_SOURCE:
                parts.append(self._exclusive_totals(now, contended))
                continue
            column = literal("") if group is None else group(source)
            if contended:
                waited_for = listing.is_contended(
                    literal(now, UTCDateTime()), source.c.resource
                )
                waited = [func.count(case((waited_for, 1))).label("contended")]
            query = self._filtered(
                select(
                    column.label("name"),
                    *self._state_counts(now, source.c.expires_at),
                    *waited,
                ),
                source,
                now,
                prefix=prefix,
                owner_contains=owner_contains,
            )
            parts.append(query if group is None else query.group_by(column))
        with self._autocommit_engine.connect() as conn:
            rows = conn.execute(union_all(*parts), {listing.LISTED_AT: now}).all()
        summed: dict[Any, list[int]] = {}
        for name, *numbers in rows:
            total = summed.setdefault(name, [0] * len(numbers))
            for n, number in enumerate(numbers):
                total[n] += number
        return [(name, *numbers) for name, numbers in summed.items()]

    def _exclusive_totals(self, now: datetime, contended: bool):
        """The row of ``_grouped_counts`` for every exclusive grant, counted
        without judging each one. A grant is a row with an owner: the rows of a
        range less the free rows in it (``owner`` NULL, their release time as
        expiry), each an index-only count (the range in
        ``ix_distributed_locks_expires_at_resource``, the free rows in
        ``ix_distributed_locks_owner_expires_at``). Held and expiring are
        ranges of expiries; stale is every grant less the held and expiring
        ones, as a count of a whole table tests nothing per row and the stale
        range is the largest. docs/benchmarks-audit.md has the A/B and the
        plans.
        ``contended``: the grants with a live waiter, found from the few
        waited-for resources."""

        def owned(*conditions):
            every = select(func.count()).select_from(locks).where(*conditions)
            free = every.where(locks.c.owner.is_(None))
            return every.scalar_subquery() - free.scalar_subquery()

        ranges = [
            owned(self._state_condition(LockState.HELD, now)).label("held"),
            owned(self._state_condition(LockState.EXPIRING, now)).label("expiring"),
            owned().label("grants"),
        ]
        if contended:
            waited_for = listing.is_contended(literal(now, UTCDateTime()))
            ranges.append(
                select(func.count())
                .select_from(locks)
                .where(locks.c.owner.is_not(None), waited_for)
                .scalar_subquery()
                .label("contended")
            )
        # Stale from the held and expiring counts already made: counting the
        # live range again costs as much as both of them. A materialized CTE,
        # as PostgreSQL would merge a derived table into the select and
        # evaluate each count once per reference.
        counted = (
            select(*ranges)
            .cte("exclusive_ranges")
            .prefix_with("MATERIALIZED", dialect="postgresql")
            .prefix_with("MATERIALIZED", dialect="sqlite")
        )
        return select(
            literal("").label("name"),
            counted.c.held,  # in the order of LockState, as _state_counts
            counted.c.expiring,
            (counted.c.grants - counted.c.held - counted.c.expiring).label("stale"),
            *([counted.c.contended] if contended else []),
        )

    def owner_counts(
        self,
        *,
        prefix: str | None = None,
        owner_contains: str | None = None,
        at: datetime | None = None,
    ) -> list[OwnerCounts]:
        """Each owner of a grant with how many it holds in each state (each
        place or shared grant counts for its own owner), most stale first (what
        needs attention), then most locks; ``owner_contains``: only owners
        containing it, as ``list_locks`` matches them."""
        self._validate_filters(prefix, None, owner_contains)
        rows = self._grouped_counts(
            ENTRIES_GRANTS, lambda source: source.c.owner, prefix, owner_contains, at
        )
        return sorted((OwnerCounts(*row) for row in rows), key=_attention_order)

    def prefix_counts(
        self,
        *,
        prefix: str | None = None,
        owner_contains: str | None = None,
        at: datetime | None = None,
    ) -> list[OwnerCounts]:
        """The locks under ``prefix`` (one per resource) grouped by their next
        prefix (up to the next ``:``, ``listing.next_prefix``), with how many
        are in each state, most stale first, then most locks; names with no
        ``:`` after ``prefix`` are one group named ``""`` (last among equals)."""
        self._validate_filters(prefix, None, owner_contains)
        rows = self._grouped_counts(
            ENTRIES_RESOURCES,
            lambda source: listing.next_prefix(prefix or "", source.c.resource),
            prefix,
            owner_contains,
            at,
        )
        groups = [OwnerCounts(name or "", *numbers) for name, *numbers in rows]
        return sorted(groups, key=_prefix_order)

    def grouped_with_counts(
        self,
        group: str,
        *,
        prefix: str | None = None,
        owner_contains: str | None = None,
        at: datetime | None = None,
    ) -> tuple[list[OwnerCounts], dict[LockState, int], int]:
        """``owner_counts`` (``group`` "owner") or ``prefix_counts`` ("prefix")
        with the ``counts_and_contended`` of the same search, from one
        statement: a grouped page shows both, and read apart the exclusive
        grants (nearly every lock) were read twice. Each exclusive grant is one
        resource, so their groups summed are their totals; places are grouped
        per grant by owner but count once per resource in the totals, so
        there the place-held resources are counted on their own as well."""
        self._validate_filters(prefix, None, owner_contains)
        now = self._read_at(at)
        by_prefix = group == "prefix"
        grouped_places = (
            listing.PLACE_HELD_SOURCE if by_prefix else listing.PLACE_GRANTS_SOURCE
        )
        at_now = literal(now, UTCDateTime())

        def counted(part: int, source, grouped: bool, contended: bool):
            """The part's (number, name, held, expiring, stale, contended)."""
            name = (
                listing.next_prefix(prefix or "", source.c.resource)
                if by_prefix
                else source.c.owner
            )
            column = name if grouped else literal("")
            waited = func.count(
                case((listing.is_contended(at_now, source.c.resource), 1))
            )
            query = self._filtered(
                select(
                    column.label("name"),
                    *self._state_counts(now, source.c.expires_at),
                    *([waited.label("contended")] if contended else []),
                ),
                source,
                now,
                prefix=prefix,
                owner_contains=owner_contains,
            )
            # The part's number (and a contended count not made) outside the
            # aggregate: a wider row made PostgreSQL sort 100 000 rows on disk
            # instead of hashing them (it guesses a group per row).
            rows = (query.group_by(column) if grouped else query).subquery()
            return select(
                literal(part).label("part"),
                *rows.c,
                *([] if contended else [literal(0).label("contended")]),
            )

        def contended_grants(part: int):
            """The exclusive grants with a live waiter: found from the few
            waited-for resources, not tested on every grant."""
            query = self._filtered(
                select(func.count().label("contended")),
                listing.EXCLUSIVE_SOURCE,
                now,
                prefix=prefix,
                owner_contains=owner_contains,
                contended=True,
            ).subquery()
            zero = literal(0)
            return select(
                literal(part).label("part"),
                literal("").label("name"),
                *(zero.label(state.value) for state in LockState),
                query.c.contended,
            )

        exclusive, places, place_held, waited_for = 0, 1, 2, 3
        parts = [
            counted(exclusive, listing.EXCLUSIVE_SOURCE, grouped=True, contended=False),
            counted(places, grouped_places, grouped=True, contended=by_prefix),
            contended_grants(waited_for),
        ]
        # The totals count each resource once: the exclusive grants and the
        # place-held resources (grouped already when grouped per resource).
        in_totals = {exclusive, waited_for, places if by_prefix else place_held}
        if not by_prefix:
            parts.append(
                counted(
                    place_held, listing.PLACE_HELD_SOURCE, grouped=False, contended=True
                )
            )
        with self._autocommit_engine.connect() as conn:
            rows = conn.execute(union_all(*parts), {listing.LISTED_AT: now}).all()
        groups: dict[str, list[int]] = {}
        totals = [0] * len(LockState)
        contended = 0
        for part, name, *numbers, waited in rows:
            if part in (exclusive, places):
                summed = groups.setdefault(name or "", [0] * len(LockState))
                for n, number in enumerate(numbers):
                    summed[n] += number
            if part in in_totals:
                totals = [t + n for t, n in zip(totals, numbers, strict=True)]
                contended += waited
        found = [OwnerCounts(name, *numbers) for name, numbers in groups.items()]
        return (
            sorted(found, key=_prefix_order if by_prefix else _attention_order),
            dict(zip(LockState, totals, strict=True)),
            contended,
        )

    def places_counts(self) -> PlacesCounts:
        """The live places of semaphores now, against the limits of the
        semaphores that have any, and the live shared grants."""
        now = self.now()
        live = holders.c.expires_at > now
        used = (
            select(func.count())
            .where(live, holders.c.mode == EXCLUSIVE)
            .scalar_subquery()
        )
        shared = (
            select(func.count()).where(live, holders.c.mode == SHARED).scalar_subquery()
        )
        limits = (
            select(func.coalesce(func.sum(locks.c.holder_limit), 0))
            .where(
                locks.c.holder_limit > 1,
                select(holders.c.id)
                .where(holders.c.resource == locks.c.resource, live)
                .exists(),
            )
            .scalar_subquery()
        )
        with self._autocommit_engine.connect() as conn:
            row = conn.execute(
                select(
                    used.label("used"), limits.label("limit"), shared.label("shared")
                )
            ).one()
        return PlacesCounts(row.used, int(row.limit), row.shared)

    def counts(
        self,
        *,
        prefix: str | None = None,
        owner_contains: str | None = None,
        at: datetime | None = None,
    ) -> dict[LockState, int]:
        """How many locks are in each state right now, one per resource (a
        resource held by places in the state of its grant that ends first);
        ``prefix`` and ``owner_contains`` narrow them as ``list_locks`` does."""
        self._validate_filters(prefix, None, owner_contains)
        ((_, *found),) = self._grouped_counts(
            ENTRIES_RESOURCES, None, prefix, owner_contains, at
        )
        return dict(zip(LockState, found, strict=True))

    def counts_and_contended(
        self,
        *,
        prefix: str | None = None,
        owner_contains: str | None = None,
        at: datetime | None = None,
    ) -> tuple[dict[LockState, int], int]:
        """``counts`` and, of the same locks, how many have a live waiter (what
        ``count_locks(contended=True)`` counts), in one statement: a page
        showing both reads every lock and the place-held resources once."""
        self._validate_filters(prefix, None, owner_contains)
        ((_, *found, contended),) = self._grouped_counts(
            ENTRIES_RESOURCES, None, prefix, owner_contains, at, contended=True
        )
        return dict(zip(LockState, found, strict=True)), contended


@dataclass(frozen=True, slots=True)
class PlacesCounts:
    """``used`` live places of semaphores, of ``limit`` places in all (the
    limits of the semaphores with a live place), and ``shared`` live shared
    grants."""

    used: int
    limit: int
    shared: int


@dataclass(frozen=True, slots=True)
class Holders:
    """The live grants of a resource: ``holders`` (the one that ends first
    first), its ``limit`` and ``mode`` and how many wait (``waiters``)."""

    resource: str
    limit: int
    mode: str
    holders: list[Lock]
    waiters: int


@dataclass(frozen=True, slots=True)
class FencedRelease:
    """What ``force_release_fenced`` did: the grants it removed, and those it
    left alone because they were no longer the ones selected."""

    released: list[Lock]
    left_alone: list[LockChanged]


@dataclass(frozen=True, slots=True)
class AllReleased:
    """What ``force_release_all`` did: the grants it removed, the live grants
    it left alone (not among the confirmed fences: they came since), and the
    confirmed fences no grant carried any more."""

    released: list[Lock]
    left_alone: list[Lock]
    gone: list[int]


@dataclass(frozen=True, slots=True)
class OwnerCounts:
    """Locks per state of one owner (or one host, summed over its owners)."""

    name: str
    held: int
    expiring: int
    stale: int

    @property
    def total(self) -> int:
        return self.held + self.expiring + self.stale


def _attention_order(group: OwnerCounts) -> tuple:
    """Most stale first (what needs attention), then most locks."""
    return (-group.stale, -group.total, group.name)


def _prefix_order(group: OwnerCounts) -> tuple:
    """As ``_attention_order``; the names with no further prefix (``""``)
    last among equals."""
    return (-group.stale, -group.total, not group.name, group.name)


# The orders the lock list offers: remaining time and "stale since" are both
# the expiry (ascending: the least time left, or the longest stale, first).
# The orders the lock list offers, each by a grant column's name: remaining
# time and "stale since" are both the expiry (ascending: the least time left, or
# the longest stale, first). The waiters and urgent orders have pages of their
# own (``_waiters_branches``, ``_urgent_branches``).
SORT_KEYS = {
    "resource": "resource",
    "natural": "resource",
    "owner": "owner",
    "acquired": "acquired_at",
    "expires": "expires_at",
    "waiters": None,
    "urgent": None,
}
# The sources of each kind of list (``LockService._sources``), built once.
SOURCES = {
    ENTRIES_EXCLUSIVE: [listing.EXCLUSIVE_SOURCE],
    ENTRIES_GRANTS: [listing.EXCLUSIVE_SOURCE, listing.PLACE_GRANTS_SOURCE],
    ENTRIES_RESOURCES: [listing.EXCLUSIVE_SOURCE, listing.PLACE_HELD_SOURCE],
}
# The urgent order's ranks: contended first, then live locks by the time they
# have left (expiring ones come first there), stale ones last.
URGENT_CONTENDED, URGENT_LIVE, URGENT_STALE = 0, 1, 2


def _order(sort_key: str, source) -> list[Any]:
    """The SQL expressions a plain sort orders ``source`` by, its resource last."""
    if sort_key == "resource":
        return [source.c.resource]
    if sort_key == "natural":
        return listing.natural_order(source.c.resource)
    return [source.c[SORT_KEYS[sort_key]], source.c.resource]


@dataclass(frozen=True, slots=True)
class PageAsked:
    """The page a list asks each source for: after ``position`` (a cursor's,
    or None), in which direction, and how many rows (``fetch``)."""

    position: dict[str, Any] | None
    descending: bool
    fetch: int

    def after(self, order: list[Any], source, values: list[Any] | None = None):
        """``source``'s entries strictly after the position in ``order`` (the
        position's values, or ``values``), then by fence: a resource's places
        are entries of their own."""
        assert self.position is not None
        values = self.position["values"] if values is None else values
        return after(
            [*order, source.c.fence],
            [*values, self.position["fence"]],
            descending=self.descending,
        )

    def ordered(self, order: list[Any], source) -> list[Any]:
        """``order`` in the page's direction, by fence last where a resource
        may have several entries (the exclusive grants are one per resource:
        their order stays that of their indexes)."""
        if not listing.one_per_resource(source):
            order = [*order, source.c.fence]
        return [c.desc() if self.descending else c.asc() for c in order]


def _read_position(sort_key: str, position: dict[str, Any]) -> dict[str, Any]:
    """A cursor's position, checked (client input), as the values of
    ``_order`` and, for the urgent order, the instant it ranks by."""
    resource, fence = position["resource"], position["fence"]
    if validation.resource_error(resource):
        raise ValueError(resource)
    if isinstance(fence, bool) or not isinstance(fence, int) or not 0 < fence < 2**63:
        raise ValueError("bad cursor")
    return {"fence": fence, **_read_values(sort_key, resource, position)}


def _read_values(sort_key: str, resource: str, position: dict[str, Any]):
    if sort_key == "resource":
        return {"values": [resource]}
    if sort_key == "natural":
        return {"values": listing.natural_position(resource)}
    raw = position["key"]
    if sort_key == "waiters":
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
            raise ValueError("bad cursor")
        return {"values": [raw, resource]}
    if sort_key == "urgent":
        rank, expires = raw
        if rank not in (URGENT_CONTENDED, URGENT_LIVE, URGENT_STALE) or isinstance(
            rank, bool
        ):
            raise ValueError("bad cursor")
        return {
            "values": [rank, _instant(expires), resource],
            "at": _instant(position["at"]),
        }
    return {"values": [_sort_value(sort_key, raw), resource]}


def _filter_error(text: str | None) -> str | None:
    """What is wrong with a list filter's text (a prefix, part of an owner)."""
    if text is not None and (
        len(text) > validation.MAX_NAME or validation.has_control_characters(text)
    ):
        return "must be at most 255 printable characters"
    return None


def _instant(raw: Any) -> datetime:
    """A cursor's instant back as an aware UTC datetime (client input)."""
    if not isinstance(raw, str):
        raise ValueError("bad cursor")
    value = datetime.fromisoformat(raw)
    if value.tzinfo is None:
        raise ValueError("bad cursor")
    try:
        # 0001-01-01T00:00:00+14:00 is before the first instant in UTC.
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError("bad cursor") from None


def _sort_value(key: str, raw: Any) -> Any:
    """A cursor's sort value back as the column's type (client input: checked)."""
    if key in ("acquired", "expires"):
        return _instant(raw)
    if not isinstance(raw, str) or validation.name_error(raw):
        raise ValueError("bad cursor")
    return raw


# -- wiring -----------------------------------------------------------------


def clock_for(engine: Engine, configured: Clock | None) -> Clock:
    if configured is not None:
        return configured
    if engine.dialect.name in SERVER_CLOCK_DIALECTS:
        return DatabaseClock()
    return SystemClock()


def lock_service() -> LockService:
    """The current app's service (built once per app in ``create_app``)."""
    return current_app.extensions["lockkeeper.locks"]


__all__ = [
    "Action",
    "LockService",
    "LockSettings",
    "lock_service",
]
