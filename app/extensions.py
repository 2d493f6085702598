"""Extensions created without an app and bound in ``create_app`` (no import cycles)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flask import current_app
from flask_compress import Compress
from flask_login import LoginManager
from flask_sqlalchemy import SQLAlchemy
from flask_wtf import CSRFProtect
from lockkeeper_core.models import Base

if TYPE_CHECKING:
    from lockkeeper_core.service import LockService

# The lock core's declarative base: ``db.Model`` shares its metadata and registry.
db = SQLAlchemy(model_class=Base)
csrf = CSRFProtect()
login_manager = LoginManager()
compress = Compress()

# Text the dashboard, the API and the exports send; gunicorn compresses nothing.
COMPRESS_MIMETYPES = [
    "text/html",
    "text/css",
    "text/plain",
    "text/javascript",
    "application/javascript",
    "application/json",
    "application/problem+json",
    "image/svg+xml",
    "text/csv",
    "application/jsonl",
]


def lock_service() -> LockService:
    """The current app's lock service (built once per app in ``create_app``)."""
    return current_app.extensions["lockkeeper.locks"]


def init_app(app) -> None:
    from app.database import (
        attach_autocommit_engine,
        engine_options,
        install_engine_events,
    )

    app.config["SQLALCHEMY_ENGINE_OPTIONS"] = engine_options(app)
    db.init_app(app)
    with app.app_context():
        install_engine_events(db.engine)
        attach_autocommit_engine(db.engine, app.config["SQLALCHEMY_ENGINE_OPTIONS"])
    csrf.init_app(app)
    login_manager.init_app(app)
    app.config.setdefault("COMPRESS_MIMETYPES", COMPRESS_MIMETYPES)
    register = app.config.get("COMPRESS_REGISTER", True)
    app.config["COMPRESS_REGISTER"] = False  # its hook is registered below
    compress.init_app(app)
    app.config["COMPRESS_REGISTER"] = register
    if register and app.config["COMPRESS_MIMETYPES"]:
        app.after_request(_compress_unless_small)


_NO_BODY_STATUSES = frozenset({204, 304})


def _compress_unless_small(response):
    """Flask-Compress's hook, not called for a body under ``COMPRESS_MIN_SIZE``
    nor for a status that has no body (a release's 204).

    It would send such a body as it is whatever the client accepts, after
    reading the request's Accept-Encoding and adding ``Vary: Accept-Encoding``
    (needless, since nothing varies): a small API answer is most requests.
    Bodies of unknown length (streams) and larger ones go through it as before.
    """
    if response.status_code in _NO_BODY_STATUSES:
        return response
    length = response.content_length
    if length is not None and length < current_app.config["COMPRESS_MIN_SIZE"]:
        return response
    return compress.after_request(response)
