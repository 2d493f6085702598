"""The API blueprint and the guard every request passes first.

Authenticated by bearer token only: the session cookie of the dashboard is never
consulted here, which is why the blueprint may be exempt from CSRF.
"""

from __future__ import annotations

from flask import Blueprint, Request, g, request

from app.api import problems
from app.api.shapes import request_errors
from app.errors import problem
from app.extensions import csrf

bp = Blueprint("api", __name__, url_prefix="/api/v1")
csrf.exempt(bp)
problems.register(bp)

PUBLIC_ENDPOINTS = frozenset({"api.openapi_json"})
AUTHENTICATE = problems.AUTHENTICATE


def bearer_token(req: Request | None = None) -> str | None:
    req = request if req is None else req
    scheme, _, token = req.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


@bp.before_request
def authenticate():
    """Every endpoint but the OpenAPI document needs a live token; its name is
    recorded as the actor of the events the request causes.

    The token's scope is enforced here, once for every route, before any
    resource is looked up: a read-only token sends only GETs, and a request on
    a resource outside the token's prefixes is refused without a word about the
    resource. Lists and event queries are narrowed to the prefixes by the
    services (``g.token.prefixes``).
    """
    # The request proxy resolved once: each use of it looks up the context again.
    req = request._get_current_object()
    if req.endpoint in PUBLIC_ENDPOINTS:
        return None
    from app.auth.service import verify_token

    token = bearer_token(req)
    identity = verify_token(token) if token else None
    if identity is None:
        response = problem(
            401,
            "Unauthorized",
            "send 'Authorization: Bearer <token>' with a live API token",
        )
        response.headers["WWW-Authenticate"] = AUTHENTICATE
        return response
    state = g._get_current_object()
    state.token = identity
    state.actor = identity.name
    if not identity.may_send(req.method):
        return problem(403, "Forbidden", "this API token is read-only")
    resources = [(req.view_args or {}).get("resource")]
    resources.append(req.args.get("resource"))
    for resource in resources:
        if resource is not None and not identity.covers(resource):
            return problem(
                403, "Forbidden", "the resource is outside this API token's scope"
            )
    errors = request_errors(req)
    if errors:
        return problems.validation_problem(errors)
    return None
