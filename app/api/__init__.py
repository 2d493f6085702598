"""The JSON API for workers, at ``/api/v1``.

Authenticated by bearer token only: the session cookie of the dashboard is never
consulted here, which is why the blueprint may be exempt from CSRF.
"""

from __future__ import annotations

from flask import Blueprint, g, request

from app.api import problems
from app.api.schemas import raw_input_errors
from app.errors import problem
from app.extensions import csrf

bp = Blueprint("api", __name__, url_prefix="/api/v1")
csrf.exempt(bp)
problems.register(bp)

PUBLIC_ENDPOINTS = frozenset({"api.openapi_json"})
AUTHENTICATE = 'Bearer realm="lockkeeper"'


def bearer_token() -> str | None:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


@bp.before_request
def authenticate():
    """Every endpoint but the OpenAPI document needs a live token; its name is
    recorded as the actor of the events the request causes."""
    if request.endpoint in PUBLIC_ENDPOINTS:
        return None
    from app.auth.service import verify_token

    token = bearer_token()
    name = verify_token(token) if token else None
    if name is None:
        response = problem(
            401,
            "Unauthorized",
            "send 'Authorization: Bearer <token>' with a live API token",
        )
        response.headers["WWW-Authenticate"] = AUTHENTICATE
        return response
    g.actor = name
    errors = raw_input_errors(request)
    if errors:
        return problems.validation_problem(errors)
    return None


from app.api import events, locks, openapi  # noqa: E402,F401 - registers the routes
