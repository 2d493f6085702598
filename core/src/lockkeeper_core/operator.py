"""The operator's actions: force-release (a grant, a holder, every grant, the
grants selected by fence), claim, release the stale locks, purge old rows.

Each locks the resource's row, applies a pure rule (``lockkeeper_core.rules``) to what
it read under the lock, then writes the change and its events in the same
transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select

from lockkeeper_core import rules, validation
from lockkeeper_core.core import LockCore, validate_fence
from lockkeeper_core.errors import InvalidInput, LockChanged, LockNotFound
from lockkeeper_core.filters import state_of, validate_filters
from lockkeeper_core.models import EXCLUSIVE, MODES, NO_TOKEN, SHARED
from lockkeeper_core.pagination import starts_with
from lockkeeper_core.queue import WaitQueue
from lockkeeper_core.results import Lock
from lockkeeper_core.state import Action, LockState
from lockkeeper_core.statements import listing
from lockkeeper_core.statements.common import Outcome, locks

PURGE_BATCH = 500
MIN_PURGE_AGE = timedelta(minutes=1)
RELEASE_BATCH = 200


class Operator:
    """Handed the core, the waiting line (a removed grant wakes its waiters) and
    ``purge_sessions(cutoff, batch)`` (``SessionService.purge_expired``), which
    a purge runs first."""

    def __init__(
        self,
        core: LockCore,
        queue: WaitQueue,
        purge_sessions: Callable[[datetime, int], list[str]],
    ) -> None:
        self.core = core
        self.queue = queue
        self._purge_sessions = purge_sessions

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
        core = self.core
        core.validate(resource=resource, actor=actor, reason=reason)
        validate_fence(expected_fence)
        rules.require_reason(reason, "to force-release a lock")

        statements = core.transactional

        def work(conn):
            row, now = statements.locked(conn, resource, core.given_now())
            rules.refuse_force_release(
                row,
                resource=resource,
                expected_fence=expected_fence,
                show=lambda found: core.lock(found, now),
            )
            return statements.force_remove(conn, row, now, actor=actor, reason=reason)

        outcome = core.run(work)
        core.metrics.operator_action(outcome.action)
        self.queue.notify_released(resource, getattr(outcome.row, "waiters", 0))
        return core.lock(outcome.row, outcome.now)

    def force_release_holder(
        self, resource: str, fence: int, *, actor: str, reason: str | None
    ) -> Lock:
        """Remove the one grant of ``resource`` carrying ``fence`` (a holder of a
        semaphore, or a shared grant), whoever holds it; the others stay. The
        fence is the one the operator confirmed, looked for under the resource
        row's lock in the transaction that removes it (one event).

        :raise InvalidInput: no reason, or a bad fence.
        :raise LockChanged: no grant of the resource carries ``fence`` now
            (``holder``: the live grant that ends first, or None).
        """
        core = self.core
        core.validate(resource=resource, actor=actor, reason=reason)
        if fence is None:
            raise InvalidInput([("fence", "is required")])
        validate_fence(fence)
        rules.require_reason(reason, "to force-release a lock")
        statements = core.transactional

        def decide(found) -> Outcome:
            outcome, first = found
            if not outcome.done:
                shown = core.lock(first, outcome.now) if first is not None else None
                raise LockChanged(resource, fence, shown)
            return outcome

        outcome = core.run(
            lambda conn: statements.force_remove_holder(
                conn, resource, fence, actor, reason, core.given_now()
            ),
            decide=decide,
        )
        core.metrics.operator_action(outcome.action)
        self.queue.notify_released(resource, getattr(outcome.row, "waiters", 0))
        return core.lock(outcome.row, outcome.now)

    def force_release_all(
        self,
        resource: str,
        *,
        actor: str,
        reason: str | None,
        fences: Collection[int] | None = None,
    ) -> AllReleased:
        """Remove every grant of ``resource`` whoever holds it: its holders,
        its shared grants and its exclusive grant (stale too, as
        ``force_release``), decided under the resource row's lock in one
        transaction, one ``force_released`` event each.

        ``fences``: the grants the operator confirmed; a grant carrying another
        fence came since and is left alone (and reported), as is a confirmed
        fence no grant carries any more. None: every grant there now.

        :raise InvalidInput: no reason, or a bad fence.
        :raise LockNotFound: nobody holds it.
        """
        core = self.core
        core.validate(resource=resource, actor=actor, reason=reason)
        if fences is not None:
            fences = list(fences)
            if not fences:
                raise InvalidInput([("fence", "confirm at least one grant")])
            for fence in fences:
                validate_fence(fence)
        rules.require_reason(reason, "to force-release a lock")
        statements = core.transactional

        def decide(found) -> Any:
            if not found.released and not found.left_alone:
                raise LockNotFound(resource)
            return found

        done = core.run(
            lambda conn: statements.force_remove_all(
                conn, resource, fences, actor, reason, core.given_now()
            ),
            decide=decide,
        )
        for _ in done.released:
            core.metrics.operator_action(Action.FORCE_RELEASED)
        if done.released:
            self.queue.notify_released(resource, done.waiters)
        return AllReleased(
            [core.lock(grant, done.now) for grant in done.released],
            [core.lock(grant, done.now) for grant in done.left_alone],
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
        exclusive grant, a semaphore's holder or a shared grant, each by its
        fence. Per resource one transaction under its row lock
        (``force_release_all`` with the fences selected there, one event per
        grant); a selected fence no grant carries any more (the grant changed
        hands or ended since) is left alone and reported with the grant there
        now, and the resource's other grants, not selected, stay. Every input
        is checked before anything changes."""
        core = self.core
        core.validate(actor=actor, reason=reason)
        rules.require_reason(reason, "to force-release a lock")
        if not grants:
            raise InvalidInput([("locks", "choose at least one lock")])
        by_resource: dict[str, list[int]] = {}
        for resource, fence in grants:
            core.validate(resource=resource)
            validate_fence(fence)
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

        Held by holders, a claim takes one of them, a grant of its own beside
        the others (never one of theirs, ``force`` or not): a free place of a
        semaphore, or with ``mode`` SHARED a shared grant among the readers
        (of a free resource too); an exclusive claim of shared grants, and
        a shared one of a semaphore or an exclusive grant, are refused.

        :raise HeldByHolders: a semaphore with no free place, or the wrong mode.
        """
        core = self.core
        core.validate(
            resource=resource, owner=owner, ttl=ttl, actor=actor, reason=reason
        )
        validate_fence(expected_fence)
        if mode not in MODES:
            raise InvalidInput([("mode", f"must be one of {', '.join(MODES)}")])
        token_error = for_token is not None and validation.name_error(
            for_token, "for_token"
        )
        if token_error:
            raise InvalidInput([("for_token", token_error)])
        token = for_token if for_token is not None else NO_TOKEN
        ttl = core.ttl(ttl)

        statements = core.transactional

        def work(conn):
            view = statements.claim_view(
                conn, resource, token, core.given_now(), frozen_too=force
            )
            if view.token_ended:
                return Outcome(False, None, view.row, view.now, token_ended=True)
            row = view.row
            holders = (
                statements.live_grants(conn, row, view.now)
                if row is not None
                and row.places_until is not None
                and row.places_until > view.now
                else []
            )
            if holders or mode == SHARED:
                rules.refuse_holder_claim(
                    view,
                    holders,
                    resource=resource,
                    owner=owner,
                    token=token,
                    mode=mode,
                    expected_fence=expected_fence,
                    show=lambda found: core.lock(found, view.now),
                )
                return statements.write_holder_claim(
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
                show=lambda found: core.lock(found, view.now),
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

        outcome = core.run(work)
        if outcome.token_ended:
            raise InvalidInput([("for_token", f"no live API token is named {token!r}")])
        core.metrics.operator_action(outcome.action)
        return core.lock(outcome.row, outcome.now)

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
        core = self.core
        core.validate(actor=actor, reason=reason)
        validate_filters(prefix, owner, owner_contains)
        rules.require_reason(reason, "to force-release locks")
        released: list[Lock] = []
        while True:
            batch = core.run(
                lambda conn: core.transactional.release_stale_batch(
                    conn,
                    prefix,
                    owner,
                    actor,
                    reason,
                    core.given_now(),
                    RELEASE_BATCH,
                    owner_contains=owner_contains,
                )
            )
            for outcome in batch.released:
                core.metrics.operator_action(Action.FORCE_RELEASED)
                released.append(core.lock(outcome, batch.now))
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
        core = self.core
        validate_filters(prefix, owner, owner_contains)
        query = select(func.count()).select_from(locks)
        query = query.where(
            locks.c.owner.is_not(None),
            state_of(LockState.STALE, core.now(), core.settings.expiring_within),
        )
        if prefix:
            query = query.where(starts_with(locks.c.resource, prefix))
        if owner is not None:
            query = query.where(locks.c.owner == owner)
        if owner_contains:
            query = query.where(listing.owner_contains(owner_contains))
        with core.reads.connect() as conn:
            return conn.scalar(query)

    def purge_stale(self, older_than: timedelta) -> list[str]:
        """Delete rows expired (or released) longer than ``older_than`` ago,
        sessions expired as long ago, and places in line lapsed as long ago;
        returns the resources whose stale locks were removed.

        Fences come from a database-wide sequence, not from the row, so they keep
        increasing. The minimum age keeps purges away from grants in flight: a
        first insert draws its fence before it owns the row, and must not find a
        row that was granted, released and purged in that instant.
        """
        core = self.core
        if older_than < MIN_PURGE_AGE:
            raise InvalidInput([("older_than", "must be at least one minute")])
        cutoff = core.now() - older_than
        # Sessions first: deleting one records when its grants still bound
        # ran out, which it finds on their rows (purged with it).
        purged = self._purge_sessions(cutoff, PURGE_BATCH)
        while True:
            found, batch = core.run(
                lambda conn: core.transactional.purge_stale_batch(
                    conn, cutoff, PURGE_BATCH
                )
            )
            purged += [row.resource for row in batch if row.owner is not None]
            # A row granted again between the batch's look and its lock stays,
            # and is not found again: the batch was still a full one.
            if found < PURGE_BATCH:
                break
        with core.reads.connect() as conn:
            sweep = core.transactional.sweep_lapsed_places
            while sweep(conn, cutoff, PURGE_BATCH) == PURGE_BATCH:
                pass
        return purged


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
