"""The state of a lock row, judged against one clock."""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum

from sqlalchemy import ColumnElement, and_


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


def state_condition(
    state: LockState, expires_at, now: datetime, expiring_within: float
) -> ColumnElement[bool]:
    """``classify`` in SQL: the rows of ``state`` at ``now``, judged by their
    ``expires_at`` column. The two forms live side by side so they cannot drift."""
    soon = now + timedelta(seconds=expiring_within)
    if state is LockState.STALE:
        return expires_at <= now
    if state is LockState.EXPIRING:
        return and_(expires_at > now, expires_at <= soon)
    return expires_at > soon


def holds(row, owner: str, token: str | None) -> bool:
    """Whether (``token``, ``owner``) is the holder recorded on ``row``.

    A row with no token recorded (granted before tokens were) is held by its owner
    under any token; ``NO_TOKEN`` (an operator's claim for no token) by no worker.
    """
    return row.owner == owner and (row.token is None or row.token == token)


def held_by_another(row, owner: str, token: str | None, now: datetime) -> bool:
    """``row`` (a lock row, or None) is a valid grant to another holder than
    (``token``, ``owner``)."""
    return (
        row is not None
        and row.owner is not None
        and row.expires_at > now
        and not holds(row, owner, token)
    )


# The key of a ``released`` event's details that says it records a session's
# expiry, written as the expired session's row was deleted (its grants ran out
# then; the event's time is the session's expiry, not the deletion's).
SESSION_EXPIRED = "session_expired"
# The key of a take-over's details naming the token of the grant it took (its
# owner is the event's ``previous_owner``); "" for a holder with no token.
PREVIOUS_TOKEN = "previous_token"


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
