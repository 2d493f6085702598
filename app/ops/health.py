"""Handles for operators' tooling: ``GET /healthz``, ``GET /livez``,
``GET /metrics`` (this instance) and ``GET /metrics/fleet`` (the database).

None needs a login: put them behind the reverse proxy's access rules (see
docs/deploy.md) if the lock counts must not be public.

``/healthz`` is readiness: the database answers, takes writes, and is at a schema
this code may serve on (``lockkeeper_core.schema``). While it is not, every
other request is answered 503 with ``Retry-After`` and the revisions named
(``refuse_unless_schema_ready``), never run against a schema it does not fit.

``/livez`` is liveness: the process serves HTTP, whatever the database does
(restarting the app fixes neither a database outage nor a missing ``db upgrade``).
"""

from __future__ import annotations

from flask import Blueprint, Flask, Response, current_app, jsonify, request
from lockkeeper_core import wire
from lockkeeper_core.schema import SchemaCheck, SchemaState
from sqlalchemy import text
from sqlalchemy.exc import (
    DBAPIError,
    OperationalError,
    ProgrammingError,
    SQLAlchemyError,
)
from werkzeug.exceptions import ServiceUnavailable

from app.errors import database_error, database_unavailable, html_error, problem
from app.extensions import db
from app.ops.metrics import app_metrics

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


NOT_READY_RETRY_AFTER = "5"


def _revisions_named(state: SchemaState) -> dict[str, str]:
    named = {
        "database_revision": state.current_shown,
        "required_revision": state.required_shown,
    }
    if state.admits is not None:
        named["database_admits_code"] = state.admits
    if state.command is not None:
        named["command"] = state.command
    return named


def not_ready(state: SchemaState):
    """The answer to a request this code cannot serve on the database's schema:
    503, ``Retry-After``, the revisions named (problem+json to the API, a page
    to a browser)."""
    return _schema_unavailable(
        state.problem() or "the lock database's schema changed",
        _revisions_named(state),
    )


def _schema_unavailable(detail: str, named: dict[str, str]):
    """503, ``Retry-After``: problem+json naming ``named`` to the API and
    ``/healthz``, a page to a browser. Returned, not raised, so that it serves
    an error handler as well as ``before_request``."""
    if request.path.startswith("/api/") or request.endpoint == "ops.healthz":
        response = problem(
            503, "Service Unavailable", detail, type=wire.SCHEMA_NOT_READY, **named
        )
        response.headers["Retry-After"] = NOT_READY_RETRY_AFTER
        return _no_store(response)
    return html_error(
        ServiceUnavailable(detail, retry_after=int(NOT_READY_RETRY_AFTER))
    )


def current_schema_state(*, recheck: bool = False) -> SchemaState | None:
    """The schema state as last seen while it is ready (for a while), else read
    now; None when the database does not answer."""
    check = _schema_check(current_app._get_current_object())
    state = None if recheck else check.cached()
    if state is not None:
        return state
    try:
        with db.engine.connect() as conn:
            return check.check(conn)
    except SQLAlchemyError:
        return None


def refuse_unless_schema_ready():
    """Before every request but the ops handles and static files: not ready is a
    503, not a query against tables or functions this code does not fit. Costs
    a clock read while the schema was found ready in the last
    ``READY_RECHECK_SECONDS``."""
    endpoint = request.endpoint
    if endpoint is None or endpoint == "static" or endpoint.startswith("ops."):
        return None
    state = current_schema_state()
    if state is None or state.ready:
        return None  # a database that does not answer is the handlers' 503
    return not_ready(state)


@bp.get("/healthz")
def healthz():
    found = database_problem()
    if found is not None:
        detail, state = found
        if state is not None:
            return not_ready(state)
        response = problem(
            503, "Service Unavailable", detail, type=wire.DATABASE_UNAVAILABLE
        )
        response.headers["Retry-After"] = NOT_READY_RETRY_AFTER
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


@bp.get("/metrics/fleet")
def fleet_metrics():
    """The database's gauges: scrape once per fleet (see ``app.ops.metrics``)."""
    body, content_type = app_metrics().render_fleet()
    return Response(
        body, content_type=content_type, headers={"Cache-Control": "no-store"}
    )


# PostgreSQL undefined_function, undefined_table, undefined_column; MariaDB no
# such table, no such procedure/function, unknown column (PyMySQL raises the
# first as ProgrammingError, the other two as OperationalError); SQLite's
# missing table or column (an OperationalError with no code of its own).
_MISSING_SQLSTATES = frozenset({"42883", "42P01", "42703"})
_MISSING_ERRNOS = frozenset({1146, 1305, 1054})
_SQLITE_MISSING = ("no such table:", "no such column:")


def schema_object_missing(exc: BaseException) -> bool:
    orig = getattr(exc, "orig", exc)
    if getattr(orig, "sqlstate", None) in _MISSING_SQLSTATES:
        return True
    args = getattr(orig, "args", ())
    if args and args[0] in _MISSING_ERRNOS:
        return True
    return getattr(orig, "sqlite_errorname", None) == "SQLITE_ERROR" and str(
        orig
    ).startswith(_SQLITE_MISSING)


def _missing_object(exc: BaseException) -> str:
    """What the database said is missing: the driver's first line, which names
    a table, column or routine (never a value of the request), without the
    database's name that MariaDB puts before it (``PROCEDURE lockkeeper.x``):
    the answer may go to a client that has not logged in."""
    orig = getattr(exc, "orig", exc)
    args = getattr(orig, "args", ())
    said = args[1] if len(args) > 1 and isinstance(args[1], str) else str(orig)
    first = said.strip().splitlines()[0] if said.strip() else type(orig).__name__
    database = db.engine.url.database
    return first.replace(f"{database}.", "") if database else first


def schema_moved(exc: DBAPIError):
    """A statement met a schema object that is not there: the schema does not
    fit this code (downgraded, restored, or migrated by a release this code is
    too old for, since the last look), or a migration is between dropping an
    object and creating it again (MariaDB's DDL is not transactional). 503 with
    the revisions named either way: not a bug's 500, nor "not answering"."""
    if not schema_object_missing(exc):
        if isinstance(exc, OperationalError):
            return database_unavailable(exc)
        return database_error(exc)
    db.session.rollback()
    missing = _missing_object(exc)
    state = current_schema_state(recheck=True)
    if state is None:
        return database_unavailable(exc)
    current_app.logger.warning(
        "a statement met a schema object that is missing (%s); the database is"
        " at revision %s, this code needs %s",
        missing,
        state.current_shown,
        state.required_shown,
    )
    named = {**_revisions_named(state), "missing": missing}
    if not state.ready:
        return _schema_unavailable(state.problem() or missing, named)
    return _schema_unavailable(
        f"the lock database lacks what this code needs ({missing}), though it is"
        f" at revision {state.current_shown}, which this code"
        f" ({state.required_shown}) may serve on: a migration is replacing it"
        " (try again), or it was dropped by hand (restore it from the"
        " migration that created it)",
        named,
    )


def init_app(app: Flask) -> None:
    app.register_blueprint(bp)
    app.before_request(refuse_unless_schema_ready)
    # A missing schema object is a ProgrammingError on PostgreSQL and an
    # OperationalError on MariaDB and SQLite, which also say "not answering".
    app.register_error_handler(ProgrammingError, schema_moved)
    app.register_error_handler(OperationalError, schema_moved)


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
