"""The steps of ``create_app`` beyond config and extensions."""

from __future__ import annotations

import fcntl
import sys
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from flask import Flask
from sqlalchemy import inspect

from app.extensions import db, migrate


def register_services(app: Flask) -> None:
    from app import metrics, request_log
    from app.locks.service import LockService, LockSettings, clock_for

    with app.app_context():
        engine = db.engine
    app.extensions["lockkeeper.locks"] = LockService(
        engine,
        clock_for(engine, app.config.get("LOCKKEEPER_CLOCK")),
        LockSettings.from_config(app.config),
        metrics=metrics.init_app(app),
    )
    request_log.init_app(app)


def register_blueprints(app: Flask) -> None:
    from app import ops, security
    from app.api import bp as api
    from app.audit.views import bp as audit
    from app.auth.views import bp as auth
    from app.dashboard import bp as dashboard

    for blueprint in (ops.bp, api, auth, dashboard, audit):
        app.register_blueprint(blueprint)
    security.init_app(app)


def register_cli(app: Flask) -> None:
    from app.cli import register_commands

    register_commands(app)


@contextmanager
def startup_lock(instance_path: str):
    """Serialise first-start work between workers of one host (gunicorn -w N)."""
    path = Path(instance_path)
    path.mkdir(parents=True, exist_ok=True)
    with open(path / ".startup.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def upgrade_schema(app: Flask) -> None:
    """Bring the schema to the newest migration, as ``lockkeeper db upgrade`` does."""
    with app.app_context():
        command.upgrade(migrate.get_config(), "head")


def prepare_database(app: Flask) -> None:
    """SQLite: create or upgrade the schema. Every database: first-start bootstrap.

    PostgreSQL and MariaDB are migrated by ``lockkeeper db upgrade`` (several hosts
    may share them); until then there is nothing to bootstrap into.
    """
    is_sqlite = app.config["SQLALCHEMY_DATABASE_URI"].startswith("sqlite")
    auto_migrate = app.config.get("LOCKKEEPER_AUTO_MIGRATE", is_sqlite)
    bootstrap = app.config.get("LOCKKEEPER_BOOTSTRAP")
    if not (auto_migrate or bootstrap):
        return
    with startup_lock(app.instance_path):
        if auto_migrate:
            upgrade_schema(app)
        if bootstrap:
            _bootstrap(app)


def _bootstrap(app: Flask) -> None:
    from app.auth.service import bootstrap

    with app.app_context():
        if not inspect(db.engine).has_table("users"):
            return
        created = bootstrap()
        db.session.remove()
    if created is None:
        return
    password, token = created
    # Shown once, on the console only: never through the logger (logs are shipped).
    print("Lockkeeper first start: created operator 'admin'", file=sys.stderr)
    print(f"  password: {password}", file=sys.stderr)
    if token:
        print("Lockkeeper first start: created API token 'bootstrap'", file=sys.stderr)
        print(f"  token: {token}", file=sys.stderr)
    sys.stderr.flush()
