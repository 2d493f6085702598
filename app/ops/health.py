"""Handles for operators' tooling: ``GET /healthz``, ``GET /livez`` and
``GET /metrics``.

None needs a login: put them behind the reverse proxy's access rules (see
docs/deploy.md) if the lock counts must not be public.

``/healthz`` is readiness: the database answers, takes writes, and is at the schema
this code needs. ``/livez`` is liveness: the process serves HTTP, whatever the
database does (restarting the app fixes neither a database outage nor a missing
``db upgrade``).
"""

from __future__ import annotations

from flask import Blueprint, Flask, Response, current_app, jsonify
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from app.errors import problem
from app.extensions import db
from app.ops.metrics import app_metrics
from app.ops.schema import UPGRADE_COMMAND, SchemaCheck, SchemaState

bp = Blueprint("ops", __name__)


def _schema_check(app: Flask) -> SchemaCheck:
    return app.extensions.setdefault("lockkeeper.schema", SchemaCheck())


def database_problem() -> tuple[str, SchemaState | None] | None:
    """Why the lock database cannot serve this code right now (and the schema
    state, when the schema is the reason), or None when it can.

    On PostgreSQL the one round trip also asks whether the server is read-only: a
    connection left on a standby (a demoted primary after a failover) answers
    queries but refuses every write, and must not be reported healthy. The schema
    revision is read only while the last look found it not ready, or every
    ``READY_RECHECK_SECONDS``: most checks cost the one round trip.
    """
    check = _schema_check(current_app._get_current_object())
    try:
        with db.engine.connect() as conn:
            if conn.dialect.name != "postgresql":
                conn.execute(text("SELECT 1"))
            else:
                read_only = conn.execute(text("SHOW transaction_read_only")).scalar()
                if read_only == "on":
                    # Next time, a fresh connection finds the primary of the moment.
                    conn.invalidate()
                    current_app.logger.warning(
                        "health check: the database is read-only"
                    )
                    return (
                        "the lock database is read-only (a standby, or failing over)",
                        None,
                    )
            state = check.cached() or check.check(conn)
    except SQLAlchemyError as exc:
        # The driver's message says what failed (refused, no such file); the URL,
        # which may carry a password, is not part of it.
        reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        current_app.logger.warning("health check: database unavailable: %s", reason)
        return "the lock database is not answering", None
    failure = state.problem()
    if failure is not None:
        return failure, state
    return None


def _no_store(response: Response) -> Response:
    response.headers["Cache-Control"] = "no-store"
    return response


@bp.get("/healthz")
def healthz():
    found = database_problem()
    if found is not None:
        detail, state = found
        extra = {}
        if state is not None:
            extra = {
                "database_revision": state.current_shown,
                "required_revision": state.required_shown,
                "command": UPGRADE_COMMAND,
            }
        response = problem(503, "Service Unavailable", detail, **extra)
        response.headers["Retry-After"] = "5"
        return _no_store(response)
    return _no_store(jsonify(status="ok", database="ok"))


@bp.get("/livez")
def livez():
    return _no_store(jsonify(status="ok"))


@bp.get("/metrics")
def metrics():
    body, content_type = app_metrics().render()
    return Response(
        body, content_type=content_type, headers={"Cache-Control": "no-store"}
    )


def log_schema_state(app: Flask) -> SchemaState | None:
    """At a server's start: say in the log whether the database is ready for this
    code, and what to run if not. None when the database does not answer."""
    try:
        with app.app_context(), db.engine.connect() as conn:
            state = _schema_check(app).check(conn)
    except SQLAlchemyError as exc:
        reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        app.logger.warning("start: the lock database is not answering: %s", reason)
        return None
    message = state.problem() or state.warning()
    if message is not None:
        app.logger.warning("start: %s", message)
    else:
        app.logger.info(
            "start: the lock database is at revision %s", state.current_shown
        )
    return state
