"""The state of a lock row, judged against one clock."""

from __future__ import annotations

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
