"""Every refusal of the lock service as an RFC 9457 problem, mapped in one place."""

from __future__ import annotations

from flask import Blueprint, Response, request
from lockkeeper_core import wire
from lockkeeper_core.errors import InvalidInput, LockError, NotOwner

from app.errors import problem

AUTHENTICATE = wire.AUTHENTICATE
STATUS = wire.STATUS
PROBLEM_TYPES = wire.PROBLEM_TYPES

# Release by a non-owner is forbidden (403); a renewal by one is a conflict.
ENDPOINT_STATUS: dict[tuple[str, type[LockError]], int] = {
    ("api.release_lock", NotOwner): 403,
}


def lock_problem(exc: LockError) -> Response:
    status, title, extra = wire.refusal(exc)
    kind = next((cls for cls in type(exc).__mro__ if cls in STATUS), None)
    status = ENDPOINT_STATUS.get((request.endpoint or "", kind), status)  # type: ignore[arg-type]
    response = problem(status, title, str(exc), **extra)
    response.headers.update(wire.refusal_headers(exc, status))
    return response


def validation_problem(errors: list[tuple[str, str]]) -> Response:
    return lock_problem(InvalidInput(errors))


def register(bp: Blueprint) -> None:
    bp.register_error_handler(LockError, lock_problem)
