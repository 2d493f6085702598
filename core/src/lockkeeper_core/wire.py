"""The API's words for the core's answers, without the web stack: a lock, a
freeze and a session as JSON objects, and each refusal as its status, title
and the fields its problem document carries.

The server's API (``app.api``) and the embedded transport
(``lockkeeper_core.embedded``) both answer with these, so a worker's client reads
one language whether its requests cross a network or not.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from lockkeeper_core.errors import (
    FenceMismatch,
    InvalidInput,
    LimitMismatch,
    LockChanged,
    LockError,
    LockExpired,
    LockHeld,
    LockNotFound,
    NotFrozen,
    NotOwner,
    QuotaExceeded,
    ResourceFrozen,
    ServiceBusy,
    SessionBound,
    SessionExpired,
    SessionQuotaReached,
    TokenEnded,
    UnknownSession,
    WaitersFull,
)
from lockkeeper_core.results import Event, Freeze, Lock, SetRelease, SetResult
from lockkeeper_core.sessions import Session
from lockkeeper_core.values import Member

# The challenge of every 401: the API takes bearer tokens.
AUTHENTICATE = 'Bearer realm="lockkeeper"'

# (status, title) per exception; the message of the exception is the detail.
STATUS: dict[type[LockError], tuple[int, str]] = {
    InvalidInput: (400, "Invalid request"),
    LockNotFound: (404, "Lock not found"),
    LockExpired: (409, "Lock expired"),
    NotOwner: (409, "Lock held by another owner"),
    LockHeld: (409, "Lock held by another owner"),
    LockChanged: (409, "Lock changed hands"),
    FenceMismatch: (409, "Fence is not the valid grant"),
    ResourceFrozen: (423, "Resource frozen"),
    NotFrozen: (404, "Not frozen"),
    QuotaExceeded: (429, "Lock quota reached"),
    LimitMismatch: (409, "Limit mismatch"),
    TokenEnded: (401, "Unauthorized"),
    ServiceBusy: (503, "Service busy"),
    WaitersFull: (503, "Too many waiting acquires"),
    UnknownSession: (404, "Session not found"),
    SessionExpired: (409, "Session expired"),
    SessionBound: (409, "Lock bound to a session"),
    SessionQuotaReached: (429, "Session quota reached"),
}

# Problem types other than about:blank: a URN (names no host), whose last part
# says what went wrong. Every 503 has one: a client tells "the waiting room is
# full" (poll) from "the lock changed while deciding" (ask again now) and from
# "the database is busy or gone" (back off) by it, not by its title.
PROBLEM = "urn:lockkeeper:problem:"
WAITING_ROOM_FULL = PROBLEM + "waiting-room-full"
LOCK_CHANGED_HANDS = PROBLEM + "lock-changed-hands"
SERVICE_BUSY = PROBLEM + "service-busy"
DATABASE_UNAVAILABLE = PROBLEM + "database-unavailable"
SCHEMA_NOT_READY = PROBLEM + "schema-not-ready"
SERVER_STOPPING = PROBLEM + "server-stopping"
TOO_MANY_STREAMS = PROBLEM + "too-many-streams"
PROBLEM_TYPES: dict[type[LockError], str] = {
    LimitMismatch: PROBLEM + "limit-mismatch",
    ServiceBusy: SERVICE_BUSY,
    WaitersFull: WAITING_ROOM_FULL,
}


def rfc3339(moment: datetime | None) -> str | None:
    """``2026-11-30T09:00:00.123456Z`` (``app.timestamps.rfc3339``'s format)."""
    if moment is None:
        return None
    utc = moment.astimezone(UTC).replace(tzinfo=None)
    return utc.isoformat(timespec="microseconds") + "Z"


def lock_to_json(lock: Lock) -> dict[str, Any]:
    found = {
        "resource": lock.resource,
        "owner": lock.owner,
        "token": lock.token,
        "fence": lock.fence,
        "acquired_at": rfc3339(lock.acquired_at),
        "expires_at": rfc3339(lock.expires_at),
        "ttl_remaining": round(lock.ttl_remaining, 3),
        "state": lock.state.value,
        "waiters": lock.waiters,
        "limit": lock.limit,
        "mode": lock.mode,
        "holders": lock.holders,
    }
    if lock.session is not None:
        # Only a bound grant names its session (absent otherwise).
        found["session"] = lock.session
    return found


def event_to_json(event: Event) -> dict[str, Any]:
    """An event of the audit log as the API, its stream and the JSON Lines
    export give it."""
    return {
        "id": event.id,
        "occurred_at": rfc3339(event.occurred_at),
        "resource": event.resource,
        "action": event.action.value,
        "owner": event.owner,
        "previous_owner": event.previous_owner,
        "fence": event.fence,
        "acquired_at": rfc3339(event.acquired_at),
        "expires_at": rfc3339(event.expires_at),
        "actor": event.actor,
        "token": event.token,
        "reason": event.reason,
        "mode": event.mode,
        "details": event.details,
        "set": event.set_id,
    }


def freeze_to_json(freeze: Freeze) -> dict[str, Any]:
    return {
        "prefix": freeze.prefix,
        "reason": freeze.reason,
        "actor": freeze.actor,
        "frozen_at": rfc3339(freeze.frozen_at),
        "ends_at": rfc3339(freeze.ends_at) if freeze.ends_at is not None else None,
    }


def session_to_json(session: Session) -> dict[str, Any]:
    return {
        "id": session.id,
        "owner": session.owner,
        "token": session.token,
        "ttl": session.ttl,
        "created_at": rfc3339(session.created_at),
        "expires_at": rfc3339(session.expires_at),
        "last_heartbeat": rfc3339(session.last_heartbeat),
        "ttl_remaining": round(session.ttl_remaining, 3),
        "locks": [lock_to_json(lock) for lock in session.locks],
    }


def refusal(exc: LockError) -> tuple[int, str, dict[str, Any]]:
    """The status, title and extra problem fields of a refusal (an endpoint
    may still change the status: a release by a non-owner is a 403)."""
    kind = next((cls for cls in type(exc).__mro__ if cls in STATUS), None)
    status, title = STATUS.get(kind, (400, "Request refused"))  # type: ignore[arg-type]
    extra: dict[str, Any] = {}
    if isinstance(exc, InvalidInput):
        extra["errors"] = [
            {"field": field, "message": message} for field, message in exc.errors
        ]
    elif isinstance(exc, FenceMismatch):
        extra["lock"] = lock_to_json(exc.current) if exc.current else None
    elif isinstance(exc, LockChanged):
        extra["lock"] = lock_to_json(exc.holder) if exc.holder else None
    elif isinstance(exc, ResourceFrozen):
        extra["freeze"] = freeze_to_json(exc.freeze)
    elif isinstance(exc, LimitMismatch):
        extra["limit"] = exc.limit
        extra["lock"] = lock_to_json(exc.holder) if exc.holder else None
    elif isinstance(exc, (SessionQuotaReached, WaitersFull)):
        extra["setting"] = exc.setting
        extra["limit"] = exc.limit
        if isinstance(exc, WaitersFull) and exc.place is not None:
            extra["place"] = exc.place  # kept for the retry (lockkeeper_core.queue)
        if isinstance(exc, WaitersFull) and exc.places is not None:
            extra["places"] = exc.places  # a set's (lockkeeper_core.set_waiting)
    if kind in PROBLEM_TYPES:
        extra["type"] = PROBLEM_TYPES[kind]  # type: ignore[index]
    return status, title, extra


def refusal_headers(exc: LockError, status: int) -> dict[str, str]:
    """The headers a refusal's answer carries: when to retry, how to
    authenticate."""
    headers: dict[str, str] = {}
    if status == 503:
        headers["Retry-After"] = "1"
    if isinstance(exc, TokenEnded):
        headers["WWW-Authenticate"] = AUTHENTICATE
    if isinstance(exc, LimitMismatch):
        # Until the grant that ends first ends (the line may keep it in use).
        remaining = exc.holder.ttl_remaining if exc.holder is not None else 1
        headers["Retry-After"] = str(max(1, math.ceil(remaining)))
    if isinstance(exc, (QuotaExceeded, SessionQuotaReached)):
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
    return headers


# -- sets ----------------------------------------------------------------------------


def set_members(fields: dict[str, Any]) -> list[Member]:
    """A set acquire's ``members`` (``[{"resource", "limit"?, "mode"?}]``);
    the service checks each value (``Sets.check_members``)."""
    found = fields.get("members")
    if not isinstance(found, list) or not all(isinstance(m, dict) for m in found):
        raise InvalidInput([("members", "must be a list of JSON objects")])
    return [
        Member(m.get("resource"), m.get("limit", 1), m.get("mode", "exclusive"))
        for m in found
    ]


def set_resources(fields: dict[str, Any]) -> list[str]:
    """A set renewal's or release's ``resources``."""
    found = fields.get("resources")
    if not isinstance(found, list):
        raise InvalidInput([("resources", "must be a list of resource names")])
    return found


def set_answer(result: SetResult) -> tuple[int, dict[str, Any], dict[str, str]]:
    """A set acquire's status, body and headers: every member's grant, or the
    409 naming the member that refused and its grant in the way."""
    if result.acquired:
        return (
            200,
            {
                "acquired": True,
                "set": result.set_id,
                "locks": [lock_to_json(x) for x in result.locks],
            },
            {},
        )
    remaining = result.lock.ttl_remaining if result.lock is not None else 1
    body = {
        "acquired": False,
        "refused": result.refused,
        "lock": lock_to_json(result.lock) if result.lock is not None else None,
        "waiters": result.waiters,
    }
    if result.places is not None:
        body["places"] = result.places  # kept for the next request
    return 409, body, {"Retry-After": str(max(1, math.ceil(remaining)))}


def set_release_to_json(released: SetRelease) -> dict[str, Any]:
    return {
        "released": [lock_to_json(lock) for lock in released.released],
        "not_held": released.not_held,
    }
