"""The lock rules as pure functions of what a transaction read: the operator's
(the service locks the row, applies a rule here, then writes) and the worker's
refused acquire (judged on the outcome, before any further read). Each raises
the refusal (``lockkeeper_core.errors``) or answers what comes next.
``show(row)`` turns a row into the ``Lock`` an error names."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from lockkeeper_core.errors import (
    HeldByHolders,
    InvalidInput,
    LimitMismatch,
    LockChanged,
    LockError,
    LockExpired,
    LockHeld,
    LockNotFound,
    NotOwner,
    ResourceFrozen,
    TokenEnded,
)
from lockkeeper_core.models import SHARED
from lockkeeper_core.results import AcquireResult, Freeze
from lockkeeper_core.state import held_by_another, holds
from lockkeeper_core.values import Ask


@dataclass(frozen=True, slots=True)
class SecondLook:
    """What a refused acquire must read before it can answer (one step after
    the decision, in this order): the token's soonest expiry (``quota``: it
    is over its quota), the session its own valid grant is bound to
    (``bound_session``), the grant that ends first of a resource held by
    holders (``first_holder``). What none of them settles, raced: the row
    changed under the attempt. ``waiters``: how many wait in line."""

    waiters: int
    quota: bool = False
    bound_session: bool = False
    first_holder: bool = False


def refuse_acquire(
    ask: Ask, outcome: Any, show: Callable[[Any], Any]
) -> AcquireResult | SecondLook:
    """A refused acquire's answer from its ``outcome`` (``Outcome``) alone, or
    the second look it needs; raises the refusals that need no more."""
    row, now = outcome.row, outcome.now
    theirs = held_by_another(row, ask.owner, ask.token, now)
    ours = (
        row is not None
        and row.owner is not None
        and row.expires_at > now
        and holds(row, ask.owner, ask.token)
    )
    if outcome.limit_mismatch is not None:
        raise LimitMismatch(
            ask.resource,
            outcome.limit_mismatch,
            ask.limit,
            show(row) if row is not None else None,
        )
    waiters = getattr(row, "waiters", 0) or 0
    if theirs:
        return AcquireResult(False, show(row), None, waiters)
    if outcome.token_ended:
        raise TokenEnded(ask.token)
    if outcome.freeze is not None:
        raise ResourceFrozen(ask.resource, Freeze.from_row(outcome.freeze))
    if outcome.over_quota:
        return SecondLook(waiters, quota=True)
    if row is not None and waiters:
        # Free or expired, but others are in line before us.
        return AcquireResult(False, show(row) if row.owner else None, None, waiters)
    places_until = getattr(row, "places_until", None)
    return SecondLook(
        waiters,
        # Our own valid grant, refused: bound to a session (read only on this
        # refusal path), which alone renews it.
        bound_session=ours,
        # Held by holders (a refusal of the session-bound path, which does not
        # take the holders path): the grant that ends first.
        first_holder=places_until is not None and places_until > now,
    )


@dataclass(frozen=True, slots=True)
class OwnLook:
    """What a refused renew or release of the caller's own grant must read
    before it can answer (one step after the decision, in this order): the
    caller's holder (``maybe_holder``: no valid exclusive grant on the row, so the
    caller may be one of its holders instead), the session its own valid grant
    is bound to (``bound_session``). What neither settles is ``refusal``,
    counted as ``outcome``; ``refusal`` None: raced, the row changed under
    the attempt."""

    refusal: LockError | None
    outcome: str | None
    maybe_holder: bool = False
    bound_session: bool = False


def refuse_own(
    row, now: datetime, *, resource: str, owner: str, token: str | None, show
) -> OwnLook:
    """A refused renew or release judged from the exclusive row it read
    (``row``, None: no row) alone. A release of a run-out grant is "not
    found" (the caller has lost it), a renewal of one "expired"."""
    if row is None or row.owner is None:
        return OwnLook(
            LockNotFound(resource), "not_found", maybe_holder=row is not None
        )
    if row.expires_at <= now:
        return OwnLook(LockExpired(resource, owner), "expired", maybe_holder=True)
    if not holds(row, owner, token):
        return OwnLook(NotOwner(resource, show(row)), "not_owner")
    # Valid and ours, yet refused: bound to a session (a renewal), or the row
    # changed under the attempt.
    return OwnLook(None, None, bound_session=True)


def require_reason(reason: str | None, why: str) -> None:
    if reason is None or not reason.strip():
        raise InvalidInput([("reason", f"is required {why}")])


def refuse_force_release(
    row, *, resource: str, expected_fence: int | None, show: Callable[[Any], Any]
) -> None:
    """A force-release needs a grant in place, and the confirmed one if named."""
    if row is None or row.owner is None:
        raise LockNotFound(resource)
    if expected_fence is not None and row.fence != expected_fence:
        raise LockChanged(resource, expected_fence, show(row))


def claim_takes_from_holder(
    row,
    now: datetime,
    *,
    resource: str,
    owner: str,
    token: str,
    expected_fence: int | None,
    force: bool,
    freeze,
    reason: str | None,
    show: Callable[[Any], Any],
) -> bool:
    """Whether a claim for (``token``, ``owner``) takes the lock from another
    valid holder; raises when it may not be made."""
    held = row is not None and row.owner is not None
    if expected_fence is not None and (not held or row.fence != expected_fence):
        raise LockChanged(resource, expected_fence, show(row) if held else None)
    # Exactly this holder: a claim names its token (or none), so a grant under
    # another token, or under none recorded, is someone else's.
    taking = (
        held
        and row.expires_at > now
        and not (row.owner == owner and row.token == token)
    )
    if taking and not force:
        raise LockHeld(resource, show(row))
    if freeze is not None:
        raise ResourceFrozen(resource, Freeze.from_row(freeze))
    if taking:
        require_reason(reason, "to take a lock another holder holds")
    return taking


def refuse_holder_claim(
    view,
    holders: list[Any],
    *,
    resource: str,
    owner: str,
    token: str,
    mode: str,
    expected_fence: int | None,
    show: Callable[[Any], Any],
) -> None:
    """Raise why a claim of one holder (``mode`` exclusive: a semaphore's) or of
    a shared grant may not be made, from what the claim read under the row
    lock: ``view`` (``ClaimView``) and the resource's live ``holders``."""
    now, row = view.now, view.row
    exclusive = row if row is not None and row.owner and row.expires_at > now else None
    seen = {grant.fence for grant in holders}
    if exclusive is not None:
        seen.add(exclusive.fence)
    if expected_fence is not None and expected_fence not in seen:
        first = holders[0] if holders else exclusive
        raise LockChanged(
            resource, expected_fence, show(first) if first is not None else None
        )
    if exclusive is not None:
        raise HeldByHolders(
            resource,
            show(exclusive),
            f"{resource!r} is held exclusively by {exclusive.owner!r}: a shared "
            "claim does not take an exclusive grant",
        )
    shared = mode == SHARED
    if holders and (holders[0].mode == SHARED) != shared:
        kind = (
            f"a semaphore of limit {holders[0].holder_limit}: claim one of its "
            "places, not a shared grant"
            if shared
            else f"held by {len(holders)} shared grant(s): claim it shared to join them"
        )
        raise HeldByHolders(resource, show(holders[0]), f"{resource!r} is {kind}")
    # The owner's own holder is replaced; the others' are never taken.
    theirs = [p for p in holders if not (p.owner == owner and p.token == token)]
    limit = holders[0].holder_limit if holders else 1
    if not shared and len(theirs) >= limit:
        first = show(holders[0])
        raise HeldByHolders(
            resource,
            first,
            f"{resource!r} has no free place: all {limit} are held (the first "
            f"to end is {first.owner!r}'s, fence {first.fence})",
        )
    if view.freeze is not None:
        raise ResourceFrozen(resource, Freeze.from_row(view.freeze))
