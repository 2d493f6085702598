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
import os
import re
import sys
import time

from flask import Flask, Response, g, request

REQUEST_ID_HEADER = "X-Request-ID"
_REQUEST_ID_KEY = "HTTP_X_REQUEST_ID"  # the header's key in the WSGI environ
LOGGER_NAME = "lockkeeper.requests"
# Proxies and clients send UUIDs, hex strings or dotted trace ids; anything else
# (too long, spaces, control characters) is replaced rather than logged.
_SANE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:@+=/-]{1,128}")

logger = logging.getLogger(LOGGER_NAME)


def request_id() -> str:
    """The current request's id (the header's, or the one made for it)."""
    return g.request_id


def current_actor(state=None) -> str | None:
    """Who made the request, if a face has already established it.

    The API sets ``g.actor`` to the token's name; for the dashboard, Flask-Login's
    user is read only if it was loaded already, so logging never queries.
    """
    state = g._get_current_object() if state is None else state
    actor = getattr(state, "actor", None)
    if actor:
        return str(actor)
    user = getattr(state, "_login_user", None)
    if user is not None and getattr(user, "is_authenticated", False):
        return getattr(user, "username", None)
    return None


# What json.dumps(..., ensure_ascii=False) writes for a string.
_quote = json.encoder.encode_basestring


def _text(value: str | None) -> str:
    return "null" if value is None else _quote(value)


def render_line(line: dict) -> str:
    """``json.dumps(line, ensure_ascii=False)`` for the request line's fixed keys,
    written out: a third of the cost, and no encoder object per request."""
    return (
        f'{{"event": "request", "request_id": {_text(line["request_id"])}, '
        f'"method": {_text(line["method"])}, "path": {_text(line["path"])}, '
        f'"route": {_text(line["route"])}, "status": {line["status"]:d}, '
        f'"duration_ms": {line["duration_ms"]!r}, "actor": {_text(line["actor"])}, '
        f'"remote_addr": {_text(line["remote_addr"])}}}'
    )


def _start_request() -> None:
    state = g._get_current_object()
    state.request_started = time.perf_counter()
    # What request.headers.get(REQUEST_ID_HEADER) reads, without the lookup.
    incoming = request.environ.get(_REQUEST_ID_KEY, "")
    # 32 random hex digits, as uuid4().hex gave, without building a UUID.
    state.request_id = (
        incoming if _SANE_REQUEST_ID.fullmatch(incoming) else os.urandom(16).hex()
    )


def _finisher(metrics):
    """The after-request hook of one app: its metrics bound once.

    Each proxy (``g``, ``request``) is resolved once; the log record is made
    with ``makeRecord`` and handed to the logger's handlers as ``logger.info``
    would, less ``findCaller``'s walk up the stack (the place is always this).
    """
    observe = metrics.observe_request

    def _finish_request(response: Response) -> Response:
        state = g._get_current_object()
        req = request._get_current_object()
        started = getattr(state, "request_started", None)
        if started is None:  # a before_request hook ahead of ours answered
            _start_request()
            started = state.request_started
        duration = time.perf_counter() - started
        request_id = state.request_id
        response.headers[REQUEST_ID_HEADER] = request_id
        rule = req.url_rule
        route = rule.rule if rule is not None else None
        method = req.method
        status = response.status_code
        observe(method, route, status, duration)
        if logger.isEnabledFor(logging.INFO):
            line = {
                "event": "request",
                "request_id": request_id,
                "method": method,
                "path": req.path,
                "route": route,
                "status": status,
                "duration_ms": round(duration * 1000, 3),
                "actor": current_actor(state),
                "remote_addr": req.remote_addr,
            }
            logger.handle(
                logger.makeRecord(
                    LOGGER_NAME,
                    logging.INFO,
                    __file__,
                    0,
                    render_line(line),
                    None,
                    None,
                    "_finish_request",
                    {"request": line},
                )
            )
        return response

    return _finish_request


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
    app.after_request(_finisher(app.extensions["lockkeeper.metrics"]))
