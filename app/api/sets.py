"""Sets: several locks acquired, renewed and released as one (``/api/v1/sets``).

The guard checks the path's resource against the token's scope; a set names
its resources in the body, so each member is checked here, before the service
is asked, with the same answer (403, nothing said about the resource). The
answers are ``lockkeeper_core.wire``'s, as the embedded transport gives them.
"""

from __future__ import annotations

from collections.abc import Iterable

from flask import g, jsonify, request
from lockkeeper_core import wire
from lockkeeper_core.queue import client_still_there

from app.api.blueprint import bearer_token, bp
from app.api.shapes import body, seconds
from app.auth.service import verify_token
from app.errors import problem
from app.extensions import lock_service


def _out_of_scope(resources: Iterable[str]):
    """The guard's 403 when any resource is outside the token's scope."""
    if all(g.token.covers(resource) for resource in resources):
        return None
    return problem(403, "Forbidden", "the resource is outside this API token's scope")


@bp.post("/sets")
def acquire_set():
    fields = body()
    credential = bearer_token()
    members = wire.set_members(fields)
    refused = _out_of_scope(m.resource for m in members)
    if refused is not None:
        return refused
    result = lock_service().acquire_set(
        members,
        fields["owner"],
        seconds(fields.get("ttl")),
        actor=g.actor,
        token=g.token.name,
        max_locks=g.token.max_locks,
        session=fields.get("session"),
        wait=seconds(fields.get("wait")),
        still_wanted=client_still_there(request.environ),
        # Asked again while the set waits in line (the token cache's bound).
        token_live=lambda: verify_token(credential) is not None,
        places=fields.get("places"),
        rejoin=fields.get("rejoin", False),
    )
    status, answer, headers = wire.set_answer(result)
    response = jsonify(answer)
    response.status_code = status
    response.headers.update(headers)
    return response


@bp.patch("/sets")
def renew_set():
    fields = body()
    resources = wire.set_resources(fields)
    refused = _out_of_scope(resources)
    if refused is not None:
        return refused
    locks = lock_service().renew_set(
        resources,
        fields["owner"],
        seconds(fields.get("ttl")),
        actor=g.actor,
        token=g.token.name,
    )
    return jsonify(locks=[wire.lock_to_json(lock) for lock in locks])


@bp.delete("/sets")
def release_set():
    fields = body()
    resources = wire.set_resources(fields)
    refused = _out_of_scope(resources)
    if refused is not None:
        return refused
    released = lock_service().release_set(
        resources, fields["owner"], actor=g.actor, token=g.token.name
    )
    return jsonify(wire.set_release_to_json(released))
