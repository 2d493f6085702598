"""What an event's ``details`` record beside its columns, one helper per key:
a holder's change of mode, the session a grant is bound to, the grant a
take-over or an operator's action replaced or removed, and a session-bound
grant that ran out with its session. Every dialect's Python writes them here;
PostgreSQL's functions (``sql/postgresql/``) write the same keys."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from lockkeeper_core.models import NO_TOKEN
from lockkeeper_core.state import (
    PREVIOUS_EXPIRES_AT,
    PREVIOUS_TOKEN,
    SESSION_EXPIRED,
    Action,
)
from lockkeeper_core.statements.common import token_or_none


def mode_change(from_mode: str, **more: Any) -> str:
    """An event's ``details`` when a holder's grant changed mode (a promotion
    or a demotion): the mode it had, so the audit tells it from a re-acquire."""
    return json.dumps({"from_mode": from_mode, **more}, sort_keys=True)


def with_session(details: str | None, session_id: str | None) -> str | None:
    """A grant event's ``details`` naming the session it is bound to (None:
    unbound, ``details`` unchanged): its expiry moves with the session's
    heartbeat, which writes no event, so the history reads the grant's end
    from its session rather than from the expiry the event recorded."""
    if session_id is None:
        return details
    found = json.loads(details) if details is not None else {}
    return json.dumps({**found, "session": session_id}, sort_keys=True)


def took_over_from(details: str | None, token: str | None) -> str:
    """A take-over's ``details`` naming the token of the grant it took
    (``PREVIOUS_TOKEN``; "" for none, as ``lock_holders`` records it): its
    owner alone (``previous_owner``) does not tell one owner's grants under
    two tokens apart."""
    found = json.loads(details) if details is not None else {}
    return json.dumps({**found, PREVIOUS_TOKEN: token or NO_TOKEN}, sort_keys=True)


def ended_bound_grant(
    details: str | None, session_id: str | None, expires_at: datetime
) -> str | None:
    """The ``details`` of an event that replaced or removed a grant (its row's
    ``session_id`` and ``expires_at`` as they were): for a grant bound to a
    session, the expiry it had then (``PREVIOUS_EXPIRES_AT``), which its
    session's heartbeats moved without an event; ``details`` unchanged for an
    unbound grant, whose events recorded its expiry."""
    if session_id is None:
        return details
    found = json.loads(details) if details is not None else {}
    recorded = expires_at.astimezone(UTC).isoformat(timespec="microseconds")
    return json.dumps({**found, PREVIOUS_EXPIRES_AT: recorded}, sort_keys=True)


def session_expiry_event(grant, mode: str) -> dict[str, Any]:
    """The ``released`` event recording that ``grant`` (an exclusive row or a
    holder, still bound to its expired session) ran out at its session's
    expiry, its own (``SESSION_EXPIRED``; ``tenures.records_a_session_expiry``):
    written as the grant goes after its session expired, by the end or purge
    of its session or a new grant clearing it. Nobody released it, and once
    the session's row is gone nothing else says when its heartbeats stopped."""
    return {
        "resource": grant.resource,
        "action": Action.RELEASED.value,
        "owner": grant.owner,
        "previous_owner": grant.owner,
        "token": token_or_none(grant.token),
        "fence": grant.fence,
        "acquired_at": grant.acquired_at,
        "expires_at": grant.expires_at,
        "actor": None,
        "reason": None,
        "occurred_at": grant.expires_at,
        "mode": mode,
        "details": json.dumps(
            {"session": grant.session_id, SESSION_EXPIRED: True}, sort_keys=True
        ),
    }
