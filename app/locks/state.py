"""The state of a lock row, judged against one clock."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum


class LockState(StrEnum):
    HELD = "held"
    EXPIRING = "expiring"
    STALE = "stale"


def classify(remaining: float, expiring_within: float) -> LockState:
    """Exactly one state for a row with ``remaining`` seconds until it expires."""
    if remaining <= 0:
        return LockState.STALE
    if remaining <= expiring_within:
        return LockState.EXPIRING
    return LockState.HELD


def held_by_another(row, owner: str, now: datetime) -> bool:
    """``row`` (a lock row, or None) is a valid grant to another than ``owner``."""
    return (
        row is not None
        and row.owner is not None
        and row.expires_at > now
        and row.owner != owner
    )


class Action(StrEnum):
    """What an audit event records."""

    ACQUIRED = "acquired"
    REACQUIRED = "reacquired"
    TOOK_OVER = "took_over"
    RENEWED = "renewed"
    RELEASED = "released"
    FORCE_RELEASED = "force_released"
    CLAIMED = "claimed"
    FORCE_CLAIMED = "force_claimed"
    # Operator freezes of a prefix (the event's resource is the prefix).
    FROZEN = "frozen"
    UNFROZEN = "unfrozen"
