"""One structured log line and one metrics observation per request.

The line is JSON on the ``lockkeeper.requests`` logger: method, path (never the
query string), status, duration, actor (API token *name* or operator username) and
the request id. It never carries headers, bodies or cookies, so no token, password
or session can reach the logs. The request id is the caller's ``X-Request-ID``
when it is a sane one, else a new one; either way it goes back in the response.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
import uuid

from flask import Flask, Response, current_app, g, request

REQUEST_ID_HEADER = "X-Request-ID"
LOGGER_NAME = "lockkeeper.requests"
# Proxies and clients send UUIDs, hex strings or dotted trace ids; anything else
# (too long, spaces, control characters) is replaced rather than logged.
_SANE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:@+=/-]{1,128}")

logger = logging.getLogger(LOGGER_NAME)


def request_id() -> str:
    """The current request's id (the header's, or the one made for it)."""
    return g.request_id


def current_actor() -> str | None:
    """Who made the request, if a face has already established it.

    The API sets ``g.actor`` to the token's name; for the dashboard, Flask-Login's
    user is read only if it was loaded already, so logging never queries.
    """
    actor = g.get("actor")
    if actor:
        return str(actor)
    user = g.get("_login_user")
    if user is not None and getattr(user, "is_authenticated", False):
        return getattr(user, "username", None)
    return None


def _start_request() -> None:
    g.request_started = time.perf_counter()
    incoming = request.headers.get(REQUEST_ID_HEADER, "")
    g.request_id = (
        incoming if _SANE_REQUEST_ID.fullmatch(incoming) else uuid.uuid4().hex
    )


def _finish_request(response: Response) -> Response:
    started = g.get("request_started")
    if started is None:  # a before_request hook ahead of ours answered
        _start_request()
        started = g.request_started
    duration = time.perf_counter() - started
    response.headers[REQUEST_ID_HEADER] = g.request_id
    route = request.url_rule.rule if request.url_rule is not None else None
    current_app.extensions["lockkeeper.metrics"].observe_request(
        request.method, route, response.status_code, duration
    )
    if logger.isEnabledFor(logging.INFO):
        line = {
            "event": "request",
            "request_id": g.request_id,
            "method": request.method,
            "path": request.path,
            "route": route,
            "status": response.status_code,
            "duration_ms": round(duration * 1000, 3),
            "actor": current_actor(),
            "remote_addr": request.remote_addr,
        }
        logger.info(json.dumps(line, ensure_ascii=False), extra={"request": line})
    return response


def init_app(app: Flask) -> None:
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    if not logger.hasHandlers():
        # Nothing configured logging (flask run, a bare gunicorn): still print.
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    # First in line, so every other hook's time counts and every request has an id.
    app.before_request_funcs.setdefault(None, []).insert(0, _start_request)
    app.after_request(_finish_request)
