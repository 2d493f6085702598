"""``create_app``: the steps in order, then the steps themselves.

Config, JSON logging, extensions, services, blueprints, error handlers, CLI, then,
when the app is built to serve (gunicorn, ``lockkeeper run``, any WSGI server), the
first-start work on the database. A command of the CLI (``lockkeeper users create``,
``db current``, ``--help``) builds the same app and leaves the database alone.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
from collections.abc import Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
import jinja2
from flask import Flask
from sqlalchemy import inspect
from sqlalchemy.exc import SQLAlchemyError

from app import config, errors, extensions
from app.extensions import db
from app.ops import logs
from app.paths import (
    INSTANCE_DIR,
    STATIC_DIR,
    TEMPLATES_DIR,
    make_private_dir,
)


class CompiledTemplates(jinja2.BytecodeCache):
    """Templates compiled once per process, whatever app renders them first.

    Each app has its own Jinja environment and so its own template cache: an
    embedding process or a test session that builds many apps parsed and
    compiled every template again for each (about 25 ms a template). Jinja keys
    a bucket by the template's name and checks its source's checksum, so an
    edited template is compiled again; the apps' environments are configured
    alike, so one app's code is right for another's."""

    def __init__(self) -> None:
        self._code: dict[str, bytes] = {}

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        code = self._code.get(bucket.key)
        if code is not None:
            bucket.bytecode_from_string(code)

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        self._code[bucket.key] = bucket.bytecode_to_string()


COMPILED_TEMPLATES = CompiledTemplates()


class Lockkeeper(Flask):
    """Flask, asking once per function whether a view or hook is a coroutine,
    and sharing compiled templates with the process's other apps
    (``CompiledTemplates``).

    ``ensure_sync`` runs for every view and every request hook, about a dozen
    times a request, and each call asked ``inspect`` again. The answers are
    kept for up to ``_SYNC_CACHE_SIZE`` functions (the app's views and hooks;
    a per-request ``after_this_request`` closure past that is asked as before).
    """

    _SYNC_CACHE_SIZE = 1024

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sync_functions: dict[Any, Any] = {}

    def ensure_sync(self, func):
        try:
            return self._sync_functions[func]
        except KeyError:
            sync = super().ensure_sync(func)
            if len(self._sync_functions) < self._SYNC_CACHE_SIZE:
                self._sync_functions[func] = sync
            return sync
        except TypeError:  # an unhashable callable
            return super().ensure_sync(func)

    def create_jinja_environment(self):
        environment = super().create_jinja_environment()
        environment.bytecode_cache = COMPILED_TEMPLATES
        return environment


def create_app(test_config: Mapping[str, Any] | None = None) -> Flask:
    instance = os.environ.get("LOCKKEEPER_INSTANCE_PATH", str(INSTANCE_DIR))
    if test_config and test_config.get("LOCKKEEPER_INSTANCE_PATH"):
        instance = str(test_config["LOCKKEEPER_INSTANCE_PATH"])
    app = Lockkeeper(
        "app",
        instance_path=os.path.abspath(instance),
        instance_relative_config=True,
        template_folder=str(TEMPLATES_DIR),
        static_folder=str(STATIC_DIR),
    )
    config.load_config(app, test_config, serving=not building_for_a_command())
    logs.init_app(app)
    secure_files(app)
    extensions.init_app(app)
    register_sessions(app)
    register_services(app)
    register_blueprints(app)
    errors.register_error_handlers(app)
    register_cli(app)
    if not building_for_a_command():
        start_serving(app)
    return app


def building_for_a_command() -> bool:
    """Flask's CLI (``lockkeeper``, ``flask --app app``) builds the app inside a
    click context; gunicorn and other WSGI servers do not."""
    return click.get_current_context(silent=True) is not None


def start_serving(app: Flask) -> None:
    """What a server does once before it answers: a private SQLite file, its
    schema, the first-start bootstrap, a line in the log saying whether the
    database is ready, a refusal on a Galera node with settings it cannot be
    safe with (``app.ops.galera``), and a fence sequence found below the fences
    held (a restore without the jump) moved past them. (``lockkeeper run`` comes here
    after building the app as a command, which created no file.)"""
    from app.auth.login import dummy_hash
    from app.database import secure_files as secure
    from app.ops.fences import repair_at_start
    from app.ops.galera import refuse_unsafe_galera
    from app.ops.health import log_schema_state

    dummy_hash()  # before the first login, whose miss must cost what a hit does
    secure(app, create=True)
    config.keep_secret_key(app)
    prepare_database(app)
    state = log_schema_state(app)
    if state is not None and state.ready:
        refuse_unsafe_galera(app)
        repair_at_start(app)


def secure_files(app: Flask) -> None:
    from app.database import secure_files as secure

    secure(app, create=not building_for_a_command())


def register_sessions(app: Flask) -> None:
    from app.auth.sessions import CookieSessions

    app.session_interface = CookieSessions()


def register_services(app: Flask) -> None:
    from lockkeeper_core.core import clock_for
    from lockkeeper_core.service import LockService, LockSettings

    from app.audit import refusals
    from app.ops import metrics, request_log

    with app.app_context():
        engine = db.engine
    clock = clock_for(engine, app.config.get("LOCKKEEPER_CLOCK"))
    recorder = metrics.init_app(app)
    recorder.refusals = refusals.init_app(app, engine, clock.now)
    app.extensions["lockkeeper.locks"] = LockService(
        engine, clock, LockSettings.from_config(app.config), metrics=recorder
    )
    request_log.init_app(app)


def register_blueprints(app: Flask) -> None:
    from app.api import bp as api
    from app.auth.views import bp as auth
    from app.dashboard import assets
    from app.dashboard import bp as dashboard
    from app.dashboard.audit import bp as audit
    from app.ops import health, security

    health.init_app(app)
    for blueprint in (api, auth, dashboard, audit):
        app.register_blueprint(blueprint)
    security.init_app(app)
    assets.init_app(app)


def register_cli(app: Flask) -> None:
    from app.cli import register_commands

    register_commands(app)


@contextmanager
def startup_lock(instance_path: str):
    """Serialise first-start work between workers of one host (gunicorn -w N)."""
    path = Path(instance_path)
    make_private_dir(path)
    lock_file = os.open(path / ".startup.lock", os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(lock_file, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def upgrade_schema(app: Flask) -> None:
    """Bring the schema to the newest migration, as ``lockkeeper db upgrade`` does."""
    from app.ops.upgrade import upgrade

    upgrade(app)


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
        try:
            if not inspect(db.engine).has_table("users"):
                return
            created = bootstrap()
        except SQLAlchemyError as exc:
            # A server starts while its database is down (and answers /healthz
            # 503) rather than crash-looping; the bootstrap waits for a later start.
            reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
            app.logger.warning("start: no first-start bootstrap: %s", reason)
            return
        finally:
            db.session.remove()
    if created is None:
        return
    password, token = created
    # Shown once, on the console only: never through the logger, whose records
    # may be shipped elsewhere. One JSON object, like every other line on stderr.
    shown = {
        "event": "first_start",
        "message": "Lockkeeper first start: created operator 'admin'"
        + (" and API token 'bootstrap'" if token else "")
        + "; shown once, keep them now",
        "operator": "admin",
        "password": password,
    }
    if token:
        shown.update(token_name="bootstrap", token=token)
    print(json.dumps(shown), file=sys.stderr, flush=True)
