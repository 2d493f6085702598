"""The state of a lock row, judged against one clock."""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum

from sqlalchemy import ColumnElement, and_, literal, not_, or_, true
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.types import Float

from lockkeeper_core.columns import UTCDateTime


class LockState(StrEnum):
    HELD = "held"
    EXPIRING = "expiring"
    STALE = "stale"


# A grant is "expiring" once it is past this share of the ttl it was last granted
# or renewed for (and within ``expiring_within`` of its expiry): a client that
# renews every third of its ttl (the client's default) then has missed a
# renewal. Judged against each grant's own ttl, a healthy holder on a short ttl
# is never "expiring" merely for being short.
EXPIRING_SHARE = 0.5


def classify(remaining: float, expiring_within: float, ttl: float) -> LockState:
    """Exactly one state for a row with ``remaining`` seconds until it expires,
    last granted or renewed for ``ttl`` seconds."""
    if remaining <= 0:
        return LockState.STALE
    if remaining <= expiring_within and remaining <= ttl * EXPIRING_SHARE:
        return LockState.EXPIRING
    return LockState.HELD


class seconds_between(FunctionElement[float]):  # noqa: N801 (a SQL function's name)
    """``later - earlier`` in seconds (instants), in each database's own date
    arithmetic."""

    type = Float()
    inherit_cache = True
    name = "seconds_between"


@compiles(seconds_between, "postgresql")
def _seconds_postgresql(element, compiler, **kw):
    earlier, later = (compiler.process(c, **kw) for c in element.clauses)
    return f"extract(epoch FROM ({later} - {earlier}))"


@compiles(seconds_between, "sqlite")
def _seconds_sqlite(element, compiler, **kw):
    earlier, later = (compiler.process(c, **kw) for c in element.clauses)
    # SQLite's date functions keep milliseconds: the float difference rounded
    # to them is exact (a 5 s span would otherwise read 5.0000000x).
    return f"(round((julianday({later}) - julianday({earlier})) * 86400000.0) / 1000.0)"


@compiles(seconds_between, "mysql")
@compiles(seconds_between, "mariadb")
def _seconds_mysql(element, compiler, **kw):
    earlier, later = (compiler.process(c, **kw) for c in element.clauses)
    return f"(TIMESTAMPDIFF(MICROSECOND, {earlier}, {later}) / 1000000.0)"


def state_condition(
    state: LockState, expires_at, now: datetime, expiring_within: float, ttl=None
) -> ColumnElement[bool]:
    """``classify`` in SQL: the rows of ``state`` at ``now``, judged by their
    ``expires_at`` column and ``ttl`` (a SQL expression in seconds, such as
    ``statements.listing.granted_ttl``). The two forms live side by side so they
    cannot drift. The expiring rows are a range of expiries narrowed by the ttl,
    so only the few rows in that range pay for reading their ttl. ``ttl`` None:
    by the range alone (the charts' past moments, whose grants' ttls they do not
    read)."""
    at = literal(now, UTCDateTime())
    soon = now + timedelta(seconds=expiring_within)
    in_range = and_(expires_at > now, expires_at <= soon)
    past_share = (
        true()
        if ttl is None
        else seconds_between(at, expires_at) <= ttl * EXPIRING_SHARE
    )
    if state is LockState.STALE:
        return expires_at <= now
    if state is LockState.EXPIRING:
        return and_(in_range, past_share)
    return or_(expires_at > soon, and_(in_range, not_(past_share)))


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
# The key of the details of an event that replaced or removed a grant bound to
# a session (a take-over, an operator's force-release or claim): the expiry
# that grant had then (ISO 8601, UTC). Its session's heartbeats moved it
# without an event, so once the session's row is gone nothing else says when
# it ran out.
PREVIOUS_EXPIRES_AT = "previous_expires_at"


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
