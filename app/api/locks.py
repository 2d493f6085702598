"""Acquire, get, renew, release and list locks: parse, call ``LockService``, render."""

from __future__ import annotations

import math

from flask import Response, g, jsonify, request

from app.api.blueprint import bp
from app.api.problems import validation_problem
from app.api.schemas import (
    NUMBER,
    SLASH_MESSAGE,
    QueryArgs,
    encoded_slash_errors,
    freeze_to_json,
    lock_to_json,
    parse_json_body,
    seconds_value,
    ttl_value,
)
from app.errors import problem
from app.locks.errors import InvalidInput
from app.locks.pagination import DEFAULT_PAGE
from app.locks.queue import client_still_there
from app.locks.service import lock_service

OWNER_AND_TTL = {"owner": str, "ttl": NUMBER}
ACQUIRE_FIELDS = {**OWNER_AND_TTL, "wait": NUMBER}
OWNER_ONLY = {"owner": str}


def _owner_and_ttl() -> tuple[str, float | None]:
    body = parse_json_body(request, fields=OWNER_AND_TTL) or {}
    if "owner" not in body:
        raise InvalidInput([("owner", "is required")])
    return body["owner"], ttl_value(body.get("ttl"))


@bp.post("/locks/<resource>")
def acquire_lock(resource: str):
    body = parse_json_body(request, fields=ACQUIRE_FIELDS) or {}
    if "owner" not in body:
        raise InvalidInput([("owner", "is required")])
    QueryArgs(request.args, allowed=()).raise_errors()
    result = lock_service().acquire(
        resource,
        body["owner"],
        ttl_value(body.get("ttl")),
        actor=g.actor,
        wait=seconds_value("wait", body.get("wait")),
        still_wanted=client_still_there(request.environ),
        token=g.token.name,
        max_locks=g.token.max_locks,
    )
    if result.acquired:
        return jsonify(acquired=True, lock=lock_to_json(result.lock))
    if result.lock is None and result.waiters:
        # Free for a moment, but others are in line first.
        response = jsonify(acquired=False, lock=None, waiters=result.waiters)
        response.status_code = 409
        response.headers["Retry-After"] = "1"
        return response
    if result.lock is None:
        # The holder we were refused by vanished while we looked: free again.
        response = problem(
            503, "Lock changed hands", "the lock changed while deciding; retry now"
        )
        response.headers["Retry-After"] = "1"
        return response
    response = jsonify(
        acquired=False, lock=lock_to_json(result.lock), waiters=result.waiters
    )
    response.status_code = 409
    response.headers["Retry-After"] = str(max(1, math.ceil(result.lock.ttl_remaining)))
    return response


@bp.get("/locks/<resource>")
def get_lock(resource: str):
    """The valid lock; with ``?fence=N``, the lock only if its valid grant is N
    (else a 409 problem with the current ``lock``, or null)."""
    query = QueryArgs(request.args, allowed=("fence",))
    fence = query.positive_integer("fence")
    query.raise_errors()
    if "fence" in request.args:
        return jsonify(lock_to_json(lock_service().check_fence(resource, fence)))
    return jsonify(lock_to_json(lock_service().get(resource)))


@bp.get("/freezes")
def list_freezes():
    """The freezes in force: no new grants under their prefixes."""
    QueryArgs(request.args, allowed=()).raise_errors()
    return jsonify(
        freezes=[freeze_to_json(freeze) for freeze in lock_service().list_freezes()]
    )


@bp.patch("/locks/<resource>")
def renew_lock(resource: str):
    owner, ttl = _owner_and_ttl()
    QueryArgs(request.args, allowed=()).raise_errors()
    lock = lock_service().renew(resource, owner, ttl, actor=g.actor, token=g.token.name)
    return jsonify(lock_to_json(lock))


@bp.delete("/locks/<resource>")
def release_lock(resource: str):
    body = parse_json_body(request, fields=OWNER_ONLY) or {}
    query = QueryArgs(request.args, allowed=("owner",))
    query.raise_errors()
    in_body, in_query = body.get("owner"), query.text("owner")
    if in_body is not None and in_query is not None and in_body != in_query:
        raise InvalidInput([("owner", "differs between the body and the query")])
    owner = in_body if in_body is not None else in_query
    if owner is None:
        raise InvalidInput([("owner", "is required (in the body or as ?owner=)")])
    lock_service().release(resource, owner, actor=g.actor, token=g.token.name)
    response = Response(status=204)
    del response.headers["Content-Type"]  # no body, so no type
    return response


@bp.get("/locks")
def list_locks():
    query = QueryArgs(
        request.args, allowed=("state", "prefix", "owner", "limit", "cursor")
    )
    limit = query.limit(DEFAULT_PAGE)
    query.raise_errors()
    page = lock_service().list_locks(
        state=query.text("state"),
        prefix=query.text("prefix"),
        owner=query.text("owner"),
        limit=limit,
        cursor=query.text("cursor"),
        scope=g.token.prefixes,
    )
    return jsonify(
        locks=[lock_to_json(lock) for lock in page.items],
        next_cursor=page.next_cursor,
    )


@bp.before_app_request
def refuse_encoded_slash():
    """Before routing acts: routing already saw ``x%2Fevents`` as ``x/events``
    (the events of ``x``) and ``%2Fx`` as ``//x`` (a redirect to ``x``)."""
    if request.path.startswith(bp.url_prefix):
        errors = encoded_slash_errors(request.environ)
        if errors:
            return validation_problem(errors)
    return None


@bp.route("/locks/<path:resource>", methods=["GET", "POST", "PATCH", "DELETE"])
def resource_with_slash(resource: str):
    """A resource name never contains '/': say so, rather than a bare 404."""
    head, _, tail = resource.rpartition("/")
    if tail == "events" and "/" not in head and request.method != "GET":
        response = problem(405, "Method Not Allowed", "events are read with GET")
        response.headers["Allow"] = "GET, HEAD, OPTIONS"
        return response
    return validation_problem([("resource", SLASH_MESSAGE)])
