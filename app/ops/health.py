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
from app.ops.metrics import app_metrics

bp = Blueprint("ops", __name__)


def database_problem() -> str | None:
    """Why the lock database cannot take writes right now, or None when it can.

    On PostgreSQL the one round trip also asks whether the server is read-only: a
    connection left on a standby (a demoted primary after a failover) answers
    queries but refuses every write, and must not be reported healthy.
    """
    try:
        with db.engine.connect() as conn:
            if conn.dialect.name != "postgresql":
                conn.execute(text("SELECT 1"))
                return None
            read_only = conn.execute(text("SHOW transaction_read_only")).scalar()
            if read_only == "on":
                # Next time, a fresh connection finds the primary of the moment.
                conn.invalidate()
                current_app.logger.warning("health check: the database is read-only")
                return "the lock database is read-only (a standby, or failing over)"
    except SQLAlchemyError as exc:
        # The driver's message says what failed (refused, no such file); the URL,
        # which may carry a password, is not part of it.
        reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        current_app.logger.warning("health check: database unavailable: %s", reason)
        return "the lock database is not answering"
    return None


@bp.get("/healthz")
def healthz():
    failure = database_problem()
    if failure is not None:
        response = problem(503, "Service Unavailable", failure)
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
