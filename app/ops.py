"""Handles for operators' tooling: ``GET /healthz`` and ``GET /metrics``.

Neither needs a login: put them behind the reverse proxy's access rules (see
docs/deploy.md) if the lock counts must not be public.
"""

from __future__ import annotations

from flask import Blueprint, Response, current_app, jsonify
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from app.errors import problem
from app.extensions import db
from app.metrics import app_metrics

bp = Blueprint("ops", __name__)


def database_answers() -> bool:
    """True when a round trip to the lock database succeeds right now."""
    try:
        with db.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except SQLAlchemyError as exc:
        # The driver's message says what failed (refused, no such file); the URL,
        # which may carry a password, is not part of it.
        reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        current_app.logger.warning("health check: database unavailable: %s", reason)
        return False
    return True


@bp.get("/healthz")
def healthz():
    if not database_answers():
        response = problem(
            503, "Service Unavailable", "the lock database is not answering"
        )
        response.headers["Retry-After"] = "5"
        response.headers["Cache-Control"] = "no-store"
        return response
    response = jsonify(status="ok", database="ok")
    response.headers["Cache-Control"] = "no-store"
    return response


@bp.get("/metrics")
def metrics():
    body, content_type = app_metrics().render()
    return Response(
        body, content_type=content_type, headers={"Cache-Control": "no-store"}
    )
