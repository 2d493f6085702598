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
    ResourceFrozen,
)
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
