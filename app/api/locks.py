"""Acquire, get, renew, release and list locks: call ``LockService``, render.

The guard has checked every request against the document before a view runs
(``app.api.shapes``); the views read the checked body and query from there.
"""

from __future__ import annotations

import math

from flask import Response, g, jsonify, request
from lockkeeper_core import wire
from lockkeeper_core.errors import InvalidInput
from lockkeeper_core.filters import ENTRIES_GRANTS
from lockkeeper_core.queue import client_still_there

from app.api.blueprint import bearer_token, bp
from app.api.problems import validation_problem
from app.api.schemas import (
    SLASH_MESSAGE,
    encoded_slash_errors,
    freeze_to_json,
    holders_to_json,
    lock_to_json,
)
from app.api.shapes import body, query, seconds
from app.auth.service import verify_token
from app.errors import problem
from app.extensions import lock_service


@bp.post("/locks/<resource>")
def acquire_lock(resource: str):
    fields = body()
    credential = bearer_token()
    result = lock_service().acquire(
        resource,
        fields["owner"],
        seconds(fields.get("ttl")),
        actor=g.actor,
        wait=seconds(fields.get("wait")),
        still_wanted=client_still_there(request.environ),
        token=g.token.name,
        max_locks=g.token.max_locks,
        # Asked again while the acquire waits in line (the token cache's bound).
        token_live=lambda: verify_token(credential) is not None,
        session=fields.get("session"),
        limit=fields.get("limit", 1),
        mode=fields.get("mode", "exclusive"),
        place=fields.get("place"),
        rejoin=fields.get("rejoin", False),
    )
    if result.acquired:
        return jsonify(acquired=True, lock=lock_to_json(result.lock))
    # A wait that ran out and rejoins: its place, kept for its next request.
    kept = {} if result.place is None else {"place": result.place}
    if result.lock is None and result.waiters:
        # Free for a moment, but others are in line first.
        response = jsonify(acquired=False, lock=None, waiters=result.waiters, **kept)
        response.status_code = 409
        response.headers["Retry-After"] = "1"
        return response
    if result.lock is None:
        # The holder we were refused by vanished while we looked: free again.
        response = problem(
            503,
            "Lock changed hands",
            "the lock changed while deciding; retry now",
            type=wire.LOCK_CHANGED_HANDS,
            **kept,
        )
        response.headers["Retry-After"] = "1"
        return response
    response = jsonify(
        acquired=False,
        lock=lock_to_json(result.lock),
        waiters=result.waiters,
        **kept,
    )
    response.status_code = 409
    response.headers["Retry-After"] = str(max(1, math.ceil(result.lock.ttl_remaining)))
    return response


@bp.get("/locks/<resource>")
def get_lock(resource: str):
    """The valid lock; with ``?fence=N``, the lock only if its valid grant is N
    (else a 409 problem with the current ``lock``, or null)."""
    fence = query()["fence"]
    if fence is not None:
        return jsonify(lock_to_json(lock_service().check_fence(resource, fence)))
    return jsonify(lock_to_json(lock_service().get(resource)))


@bp.get("/locks/<resource>/holders")
def lock_holders(resource: str):
    """Every live grant of the resource, its limit and mode, and its line."""
    return jsonify(holders_to_json(lock_service().holders(resource)))


@bp.get("/freezes")
def list_freezes():
    """The freezes in force: no new grants under their prefixes."""
    found = lock_service().list_freezes(scope=g.token.prefixes)
    return jsonify(freezes=[freeze_to_json(freeze) for freeze in found])


@bp.patch("/locks/<resource>")
def renew_lock(resource: str):
    fields = body()
    lock = lock_service().renew(
        resource,
        fields["owner"],
        seconds(fields.get("ttl")),
        actor=g.actor,
        token=g.token.name,
    )
    return jsonify(lock_to_json(lock))


@bp.delete("/locks/<resource>")
def release_lock(resource: str):
    in_body, in_query = body().get("owner"), query()["owner"]
    if in_body is not None and in_query is not None and in_body != in_query:
        raise InvalidInput([("owner", "differs between the body and the query")])
    owner = in_body if in_body is not None else in_query
    if owner is None:
        raise InvalidInput([("owner", "is required (in the body or as ?owner=)")])
    run = body().get("run")
    lock_service().release(
        resource,
        owner,
        actor=g.actor,
        token=g.token.name,
        details=None if run is None else {"run": run},
    )
    response = Response(status=204)
    del response.headers["Content-Type"]  # no body, so no type
    return response


@bp.get("/locks")
def list_locks():
    # One entry per live grant: each holder of a semaphore or shared grant of its own.
    page = lock_service().list_locks(
        **query(), scope=g.token.prefixes, entries=ENTRIES_GRANTS
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
    if tail in ("events", "holders") and "/" not in head and request.method != "GET":
        response = problem(405, "Method Not Allowed", f"{tail} are read with GET")
        response.headers["Allow"] = "GET, HEAD, OPTIONS"
        return response
    return validation_problem([("resource", SLASH_MESSAGE)])
