"""The worker's commands: acquire (alone, as a holder, bound to a session, in
line), renew and release.

Each attempt is one transaction (or one statement), then a pure decision on
its outcome (``rules.refuse_acquire``), then, for a refusal that needs it, one
explicit second look (``_second_look``): the reads a refusal names happen there
and nowhere else, after the transaction and inside the retried attempt (a row
that changed under it is tried again, ``Raced``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, func, select

from lockkeeper_core import rules
from lockkeeper_core.core import LockCore, check_session_id
from lockkeeper_core.errors import (
    InvalidInput,
    LockExpired,
    LockNotFound,
    QuotaExceeded,
    ResourceFrozen,
    SessionBound,
    SessionExpired,
    UnknownSession,
)
from lockkeeper_core.instrumentation import held_for
from lockkeeper_core.models import EXCLUSIVE
from lockkeeper_core.queue import WaitQueue
from lockkeeper_core.results import AcquireResult, Holders, Lock
from lockkeeper_core.statements.common import Outcome, holders, locks
from lockkeeper_core.statements.sessions import SessionEnded, SessionNotFound
from lockkeeper_core.transactions import Raced
from lockkeeper_core.validation import holder_errors, session_ttl_error
from lockkeeper_core.values import Ask


class Commands:
    """Handed the core, the waiting line, and the one read of another part a
    refusal may need: ``holders(resource)``, the live grants of a resource
    (``Reads.holders``)."""

    def __init__(
        self, core: LockCore, queue: WaitQueue, holders: Callable[[str], Holders]
    ) -> None:
        self.core = core
        self.queue = queue
        self._holders = holders

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
        place: int | None = None,
        rejoin: bool = False,
    ) -> AcquireResult:
        """Take ``resource`` for (``token``, ``owner``) if it is free, stale, or
        already theirs, and no one waits in line before us.

        ``wait`` = 0 (or None) never blocks, and a refusal names the current
        holder and writes nothing. ``wait`` > 0 waits in line up to that many
        seconds (see ``lockkeeper_core.queue``) while ``still_wanted()`` holds.
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
        transaction on every dialect (``lockkeeper_core.statements.sessions``).

        ``limit``: how many holders the resource allows at once (1: an
        exclusive or read/write lock; above 1 a counting semaphore, whose
        holders are its grants); ``mode`` SHARED: a grant that coexists with
        other shared grants (limit 1 only). Both take the holders path
        (``lockkeeper_core.statements.holders``); the exclusive lock keeps its own.

        :raise UnknownSession: no such session of ``token``.
        :raise SessionExpired: the session ran out before the grant.

        ``place`` (with ``wait``): 0 asks that a request turned away by a full
        waiting room keep its place in line (``WaitersFull.place`` names it);
        a place so kept, presented by the retry, is taken back, so the retry
        waits from where the first request stood (``lockkeeper_core.queue``).
        ``rejoin`` (with ``wait``): the caller waits on after this request, so
        a wait that runs out keeps its place, named by the result's ``place``.
        """
        core = self.core
        core.validate(resource=resource, owner=owner, ttl=ttl, actor=actor, wait=wait)
        errors = holder_errors(limit, mode)
        if errors:
            raise InvalidInput(errors)
        holder_rows = limit != 1 or mode != EXCLUSIVE
        if session is not None:
            both = session_ttl_error(ttl, session)
            if both:
                raise InvalidInput([("session", both)])
            check_session_id(session)
        ask = Ask(resource, owner, token, core.ttl(ttl), actor, max_locks, limit, mode)
        if session is not None:

            def attempt(waiter: int | None) -> AcquireResult:
                return self._attempt_in_session(ask, session, waiter)

        elif holder_rows:

            def attempt(waiter: int | None) -> AcquireResult:
                return self._attempt_holder(ask, waiter)

        else:

            def attempt(waiter: int | None) -> AcquireResult:
                return self._attempt(ask, waiter)

        if not wait:
            place = None
        try:
            # A kept place is asked from where it stands, in line: a plain
            # acquire has every waiter ahead of it, that place too.
            result = AcquireResult(False, None) if place else attempt(None)
        except QuotaExceeded:
            core.metrics.acquire_refused("over_quota")
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
                place=place,
                rejoin=rejoin,
                mode=mode,
                limit=limit,
            )
        if result.acquired:
            core.metrics.acquired(result.action, resource)
        else:
            core.metrics.acquire_refused()
        return result

    def _attempt(self, ask: Ask, waiter: int | None) -> AcquireResult:
        """One decision; ``waiter``: our place in line, None for "not in line".
        A resource held by holders is then decided by the holders path."""
        core = self.core
        outcome = core.run(
            lambda conn: core.statements.acquire(conn, ask, core.given_now(), waiter),
            autocommit=core.statements.autocommit,
            driver=True,
            decide=lambda found: (
                found
                if found.held_by_holders and not found.done
                else self.answer(ask, found)
            ),
        )
        if isinstance(outcome, AcquireResult):
            return outcome
        # Held by holders: the holders path decides (a promotion, a refusal
        # naming the holder that ends first, a mismatch).
        return self._attempt_holder(ask, waiter)

    def _attempt_holder(self, ask: Ask, waiter: int | None) -> AcquireResult:
        """One decision of the holders path: one statement where acquire is one
        (PostgreSQL), a plain read then one transaction elsewhere."""
        core = self.core

        def decide(outcome) -> AcquireResult:
            answer = self.answer(ask, outcome)
            waiting = getattr(outcome.row, "waiters", 0) if answer.acquired else 0
            if waiter is not None and waiting:
                # The next in line may be granted too (a shared head, a
                # semaphore's free place): wake it now.
                self.queue.notify_released(ask.resource, waiting)
            return answer

        if core.statements.autocommit:
            return core.run(
                lambda conn: core.holder_statements.acquire_holder(
                    conn, ask, core.given_now(), waiter
                ),
                autocommit=True,
                driver=True,
                decide=decide,
            )
        if waiter is None:
            with core.reads.connect() as conn:
                full = core.transactional.peek_holder(conn, ask, core.given_now())
            if full is not None:
                return self.answer(ask, full)
        return core.run(
            lambda conn: core.transactional.acquire_holder(
                conn, ask, core.given_now(), waiter
            ),
            decide=decide,
        )

    def _attempt_in_session(
        self, ask: Ask, session_id: str, waiter: int | None
    ) -> AcquireResult:
        """One decision of the session-bound path: a short transaction on every
        dialect (``SessionStatements.acquire``)."""
        core = self.core

        def work(conn):
            try:
                return core.session_statements.acquire(
                    conn, ask, session_id, core.given_now(), waiter
                )
            except SessionNotFound:
                raise UnknownSession(session_id) from None
            except SessionEnded:
                raise SessionExpired(session_id) from None

        def decide(outcome) -> AcquireResult:
            if not outcome.done:
                return self.answer(ask, outcome)
            lock = replace(core.lock(outcome.row, outcome.now), session=session_id)
            waiting = getattr(outcome.row, "waiters", 0)
            if waiter is not None and waiting:
                # The next in line may be granted too (a shared head, a
                # semaphore's free place): wake it now.
                self.queue.notify_released(ask.resource, waiting)
            return AcquireResult(True, lock, outcome.action)

        return core.run(work, decide=decide)

    def answer(self, ask: Ask, outcome: Outcome) -> AcquireResult:
        """An attempt's answer: its grant, or its refusal decided from the
        outcome alone (``rules.refuse_acquire``), then the second look that
        refusal asks for, if any."""
        core = self.core
        if outcome.done:
            return AcquireResult(
                True, core.lock(outcome.row, outcome.now), outcome.action
            )
        try:
            refused = rules.refuse_acquire(
                ask, outcome, lambda row: core.lock(row, outcome.now)
            )
        except ResourceFrozen:
            core.metrics.acquire_refused("frozen")
            raise
        if isinstance(refused, AcquireResult):
            return refused
        return self._second_look(ask, outcome.now, refused)

    def _second_look(
        self, ask: Ask, now: datetime, look: rules.SecondLook
    ) -> AcquireResult:
        """The reads a refusal needs, after its decision (``rules.SecondLook``)."""
        # Each read only where the one before it settled nothing.
        retry_after = self._quota_retry_after(ask.token, now) if look.quota else None
        bound = self._bound_session(ask.resource) if look.bound_session else None
        grants = (
            self._holders(ask.resource).holders
            if look.first_holder and bound is None
            else []
        )
        if retry_after is not None:
            raise QuotaExceeded(ask.token, ask.max_locks, retry_after)
        if bound is not None:
            raise SessionBound(ask.resource, bound)
        if grants:
            return AcquireResult(False, grants[0], None, look.waiters)
        # The row we were refused on is gone or expired: it changed under us.
        raise Raced(
            f"acquire of {ask.resource!r} kept racing", AcquireResult(False, None)
        )

    def _quota_retry_after(self, token: str | None, now: datetime) -> float:
        """Seconds until the token's soonest lock expires (the refusal path only)."""
        soonest = None
        with self.core.reads.connect() as conn:
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

    def _bound_session(self, resource: str) -> str | None:
        """The id of the session the exclusive grant on ``resource`` is bound
        to, if any (read only on a refusal path)."""
        with self.core.reads.connect() as conn:
            row = self.core.session_statements.session_of(conn, resource)
        return row.id if row is not None else None

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
        core = self.core
        core.validate(resource=resource, owner=owner, ttl=ttl, actor=actor)
        ttl = core.ttl(ttl)
        metrics = core.metrics

        def decide(outcome) -> Lock:
            row, now = outcome.row, outcome.now
            if outcome.done:
                metrics.renewal("renewed")
                return core.lock(row, now)
            look = rules.refuse_own(
                row,
                now,
                resource=resource,
                owner=owner,
                token=token,
                show=lambda found: core.lock(found, now),
            )
            # The reads the refusal needs, after its decision.
            if look.maybe_holder:
                # Not the exclusive grant's holder: the caller's holder, if any
                # (a round trip only holders pay).
                holder_lock = self._holder_operation(
                    lambda conn: core.holder_statements.renew_holder(
                        conn, resource, owner, token, ttl, actor, core.given_now()
                    )
                )
                if holder_lock is not None:
                    metrics.renewal("renewed")
                    return holder_lock
            if look.bound_session:
                bound = self._bound_session(resource)
                if bound is not None:
                    metrics.renewal("session_bound")
                    raise SessionBound(resource, bound)
            if look.refusal is None:
                raise Raced(f"renewal of {resource!r} kept racing; try again")
            metrics.renewal(look.outcome, resource)
            raise look.refusal

        return core.run(
            lambda conn: core.statements.renew(
                conn, resource, owner, token, ttl, actor, core.given_now()
            ),
            autocommit=core.statements.autocommit,
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
        core = self.core
        core.validate(
            resource=resource,
            owner=owner,
            actor=actor,
            run=(details or {}).get("run", ...),  # ... : none reported, none checked
        )
        reported = None if details is None else json.dumps(details, sort_keys=True)
        metrics = core.metrics

        def decide(outcome) -> Lock:
            row, now = outcome.row, outcome.now
            if outcome.done:
                released = core.lock(row, now)
                metrics.release("released", resource, held_for(released, now))
                self.queue.notify_released(resource, getattr(row, "waiters", 0))
                return released
            look = rules.refuse_own(
                row,
                now,
                resource=resource,
                owner=owner,
                token=token,
                show=lambda found: core.lock(found, now),
            )
            # The read the refusal needs, after its decision.
            if look.maybe_holder:
                holder_lock = self._holder_operation(
                    lambda conn: core.holder_statements.release_holder(
                        conn, resource, owner, token, actor, core.given_now(), reported
                    )
                )
                if holder_lock is not None:
                    metrics.release("released", resource, held_for(holder_lock, now))
                    # A freed place goes to the head of the line at once.
                    self.queue.notify_released(resource, holder_lock.waiters)
                    return holder_lock
            if look.refusal is None:
                # Valid and ours (a release is never refused for a session).
                raise Raced(f"release of {resource!r} kept racing; try again")
            metrics.release(look.outcome)
            if isinstance(look.refusal, LockNotFound | LockExpired):
                # Free, or run out: the caller has lost it, nothing to free.
                raise LockNotFound(
                    resource, f"no valid lock on {resource!r} to release"
                )
            raise look.refusal

        return core.run(
            lambda conn: core.statements.release(
                conn, resource, owner, token, actor, core.given_now(), reported
            ),
            autocommit=core.statements.autocommit,
            driver=True,
            decide=decide,
        )

    def _holder_operation(self, work: Callable[[Connection], Outcome]) -> Lock | None:
        """Renew or release the caller's holder (``work``: one statement on
        PostgreSQL, one transaction elsewhere): the holder as it now is, or None
        when the caller holds none."""
        core = self.core
        one_statement = core.statements.autocommit
        outcome = core.run(work, autocommit=one_statement, driver=one_statement)
        return core.lock(outcome.row, outcome.now) if outcome.done else None
