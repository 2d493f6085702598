"""One JSON object per line for everything the service logs.

The request line (``lockkeeper.requests``) is written as JSON already
(``request_log.render_line``, on the hot path) and passes through as it is. Every
other record (the app's warnings and errors, the waiting line's listener,
Python warnings, gunicorn's own lines in the shipped gunicorn config) becomes
``{"ts", "level", "logger", "message"}``, plus ``request_id`` when it was logged
while serving a request and ``exception`` (the traceback, one string) when it
carries one. A message with newlines stays one line: JSON escapes them.
"""

from __future__ import annotations

import json
import logging
import sys
import time

from flask import Flask, g, has_request_context


def _timestamp(created: float) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
    return f"{seconds}.{int(created % 1 * 1000):03d}Z"


class JsonFormatter(logging.Formatter):
    """A record as one JSON object on one line."""

    def format(self, record: logging.LogRecord) -> str:
        if getattr(record, "request", None) is not None:
            return record.getMessage()  # the request line: JSON already
        line = {
            "ts": _timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None)
        if request_id is None and has_request_context():
            request_id = getattr(g, "request_id", None)
        if request_id is not None:
            line["request_id"] = request_id
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def json_handler(stream=None) -> logging.Handler:
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    return handler


def init_app(app: Flask) -> None:
    """Route the app's records to one JSON handler on the root logger, unless
    something already configured logging (gunicorn's ``logconfig_dict`` in
    app/ops/gunicorn_conf.py, a test runner, an embedding program): then its
    handlers get them.

    Flask's own handler (plain ``[time] LEVEL in module: message``) comes off
    ``app.logger`` either way, so its records reach the root logger's handlers.
    """
    from flask.logging import default_handler

    app.logger.removeHandler(default_handler)
    root = logging.getLogger()
    if not root.handlers:
        # The root keeps its WARNING level: libraries stay quiet, the app's
        # loggers set their own.
        root.addHandler(json_handler())
        logging.captureWarnings(True)
    if app.logger.level == logging.NOTSET:
        app.logger.setLevel(logging.DEBUG if app.debug else logging.INFO)
