"""App-level error handlers: problem+json under /api/, HTML pages elsewhere.

Registered on the app, not a blueprint, so routing 404/405 are covered too.
"""

from __future__ import annotations

from flask import Flask, current_app, jsonify, request
from werkzeug.exceptions import HTTPException, InternalServerError


def wants_problem() -> bool:
    return request.path.startswith("/api/") or request.path in ("/healthz",)


def problem(status: int, title: str, detail: str | None = None, **extra):
    body = {
        "type": extra.pop("type", "about:blank"),
        "title": title,
        "status": status,
        "detail": detail or title,
        "instance": request.path,
        **extra,
    }
    response = jsonify(body)
    response.status_code = status
    response.mimetype = "application/problem+json"
    return response


def html_error(exc: HTTPException):
    """The error as a page of templates/errors/; an htmx request gets the message
    alone, since htmx 4 swaps error responses into its target."""
    from flask import render_template

    response = exc.get_response()  # keeps Allow, Retry-After, WWW-Authenticate
    try:
        body = render_template(
            "errors/error.html",
            code=exc.code or 500,
            title=exc.name,
            description=exc.description,
            fragment=request.headers.get("HX-Request") == "true",
        )
    except Exception:  # a page that cannot render must not turn a 4xx into a 500
        current_app.logger.exception("error page failed to render")
        return exc
    response.set_data(body)
    return response


def _session_gone(exc: HTTPException) -> bool:
    """A form posted from a page whose session has ended fails its CSRF check
    first; the operator needs the login page, not "CSRF token missing"."""
    from flask_login import current_user
    from flask_wtf.csrf import CSRFError

    return (
        isinstance(exc, CSRFError)
        and not current_user.is_authenticated
        and request.endpoint != "auth.login"
    )


def register_error_handlers(app: Flask) -> None:
    register_database_error_handlers(app)

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException):
        if wants_problem():
            response = problem(exc.code or 500, exc.name, exc.description)
            for header in ("Allow", "Retry-After", "WWW-Authenticate"):
                if exc.get_response().headers.get(header):
                    response.headers[header] = exc.get_response().headers[header]
            return response
        if _session_gone(exc):
            from app.extensions import login_manager

            return login_manager.unauthorized()
        return html_error(exc)

    app.register_error_handler(Exception, internal_error)


def internal_error(exc: Exception):
    from app.extensions import db

    db.session.rollback()
    current_app.logger.exception(
        "unhandled error on %s %s", request.method, request.path
    )
    if wants_problem():
        return problem(500, "Internal Server Error", "an unexpected error occurred")
    return html_error(InternalServerError())


def register_database_error_handlers(app: Flask) -> None:
    """A database that does not answer is a 503 (retry later), never a 500. So is
    one that answers as a standby or while shutting down (a failover under way).
    ``OperationalError`` is ``app.ops.health``'s: it may also be a schema object
    that is missing (MariaDB's procedure or column, SQLite's table), and the
    schema check tells the two apart, falling back on the answers here."""
    from lockkeeper_core.errors import ServiceBusy
    from sqlalchemy.exc import DBAPIError, InterfaceError

    app.register_error_handler(InterfaceError, database_unavailable)
    app.register_error_handler(DBAPIError, database_error)
    app.register_error_handler(ServiceBusy, database_unavailable)


def database_unavailable(exc: Exception):
    from lockkeeper_core import wire
    from lockkeeper_core.errors import ServiceBusy

    from app.extensions import db

    db.session.rollback()
    current_app.logger.warning("database unavailable: %s", type(exc).__name__)
    if wants_problem():
        # Busy (writers kept it locked, or conflicts kept aborting) or gone:
        # either is retried later, and the type says which.
        kind = (
            wire.SERVICE_BUSY
            if isinstance(exc, ServiceBusy)
            else wire.DATABASE_UNAVAILABLE
        )
        response = problem(
            503, "Service Unavailable", "the lock database is not answering", type=kind
        )
    else:
        response = current_app.make_response(
            ("The lock database is not answering.", 503)
        )
    response.headers["Retry-After"] = "1"
    return response


def database_error(exc: Exception):
    from app.database import server_gone

    # e.g. read_only_sql_transaction is an InternalError: a lost primary, not a bug.
    if getattr(exc, "connection_invalidated", False) or server_gone(exc):
        return database_unavailable(exc)
    return internal_error(exc)
