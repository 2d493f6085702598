"""Extensions created without an app and bound in ``create_app`` (no import cycles)."""

from flask_compress import Compress
from flask_login import LoginManager
from flask_migrate import Migrate
from flask_sqlalchemy import SQLAlchemy
from flask_wtf import CSRFProtect
from sqlalchemy.orm import DeclarativeBase

from app.paths import MIGRATIONS_DIR


class Base(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=Base)
migrate = Migrate(directory=str(MIGRATIONS_DIR), render_as_batch=True)
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


def init_app(app) -> None:
    from app.auth.sessions import CookieSessions
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
    migrate.init_app(app, db)
    app.session_interface = CookieSessions()
    csrf.init_app(app)
    login_manager.init_app(app)
    app.config.setdefault("COMPRESS_MIMETYPES", COMPRESS_MIMETYPES)
    compress.init_app(app)
