"""The operator's rules as pure functions of what the transaction read under the
row lock: the service locks the row, applies a rule here, then writes. Each
raises the refusal (``app.locks.errors``) or answers what the write needs.
``show(row)`` turns a row into the ``Lock`` an error names."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from app.locks.errors import (
    InvalidInput,
    LockChanged,
    LockHeld,
    LockNotFound,
    PlacesHeld,
    ResourceFrozen,
)
from app.locks.models import SHARED
from app.locks.results import Freeze


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


def refuse_place_claim(
    view,
    places: list[Any],
    *,
    resource: str,
    owner: str,
    token: str,
    mode: str,
    expected_fence: int | None,
    show: Callable[[Any], Any],
) -> None:
    """Raise why a claim of one place (``mode`` exclusive: a semaphore's) or of
    a shared grant may not be made, from what the claim read under the row
    lock: ``view`` (``ClaimView``) and the resource's live ``places``."""
    now, row = view.now, view.row
    exclusive = row if row is not None and row.owner and row.expires_at > now else None
    seen = {grant.fence for grant in places}
    if exclusive is not None:
        seen.add(exclusive.fence)
    if expected_fence is not None and expected_fence not in seen:
        first = places[0] if places else exclusive
        raise LockChanged(
            resource, expected_fence, show(first) if first is not None else None
        )
    if exclusive is not None:
        raise PlacesHeld(
            resource,
            show(exclusive),
            f"{resource!r} is held exclusively by {exclusive.owner!r}: a shared "
            "claim does not take an exclusive grant",
        )
    shared = mode == SHARED
    if places and (places[0].mode == SHARED) != shared:
        kind = (
            f"a semaphore of limit {places[0].holder_limit}: claim one of its "
            "places, not a shared grant"
            if shared
            else f"held by {len(places)} shared grant(s): claim it shared to join them"
        )
        raise PlacesHeld(resource, show(places[0]), f"{resource!r} is {kind}")
    # The owner's own place is replaced; the others' are never taken.
    theirs = [p for p in places if not (p.owner == owner and p.token == token)]
    limit = places[0].holder_limit if places else 1
    if not shared and len(theirs) >= limit:
        first = show(places[0])
        raise PlacesHeld(
            resource,
            first,
            f"{resource!r} has no free place: all {limit} are held (the first "
            f"to end is {first.owner!r}'s, fence {first.fence})",
        )
    if view.freeze is not None:
        raise ResourceFrozen(resource, Freeze.from_row(view.freeze))
