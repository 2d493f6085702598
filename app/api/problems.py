"""Every refusal of the lock service as an RFC 9457 problem, mapped in one place."""

from __future__ import annotations

import math

from flask import Blueprint, Response, request

from app.api.schemas import freeze_to_json, lock_to_json
from app.errors import problem
from app.locks.errors import (
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
    TokenEnded,
    WaitersFull,
)
from app.locks.sessions import SessionBound, SessionExpired, UnknownSession

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
}

# Problem types other than about:blank: a URN (names no host), whose last part
# says what went wrong.
PROBLEM_TYPES: dict[type[LockError], str] = {
    LimitMismatch: "urn:lockkeeper:problem:limit-mismatch",
}

# Release by a non-owner is forbidden (403); a renewal by one is a conflict.
ENDPOINT_STATUS: dict[tuple[str, type[LockError]], int] = {
    ("api.release_lock", NotOwner): 403,
}


def lock_problem(exc: LockError) -> Response:
    kind = next((cls for cls in type(exc).__mro__ if cls in STATUS), None)
    status, title = STATUS.get(kind, (400, "Request refused"))
    status = ENDPOINT_STATUS.get((request.endpoint or "", kind), status)
    extra = {}
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
    if kind in PROBLEM_TYPES:
        extra["type"] = PROBLEM_TYPES[kind]
    response = problem(status, title, str(exc), **extra)
    if status == 503:
        response.headers["Retry-After"] = "1"
    if isinstance(exc, TokenEnded):
        response.headers["WWW-Authenticate"] = AUTHENTICATE
    if isinstance(exc, LimitMismatch):
        # Until the grant that ends first ends (the line may keep it in use).
        remaining = exc.holder.ttl_remaining if exc.holder is not None else 1
        response.headers["Retry-After"] = str(max(1, math.ceil(remaining)))
    if isinstance(exc, QuotaExceeded):
        response.headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
    return response


def validation_problem(errors: list[tuple[str, str]]) -> Response:
    return lock_problem(InvalidInput(errors))


def register(bp: Blueprint) -> None:
    bp.register_error_handler(LockError, lock_problem)
