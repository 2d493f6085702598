"""Lockkeeper: named locks with owner tokens, TTLs and fencing tokens."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flask import Flask

from app.paths import INSTANCE_DIR, STATIC_DIR, TEMPLATES_DIR


def create_app(test_config: Mapping[str, Any] | None = None) -> Flask:
    import os

    from app import config, errors, extensions, setup

    instance = os.environ.get("LOCKKEEPER_INSTANCE_PATH", str(INSTANCE_DIR))
    if test_config and test_config.get("LOCKKEEPER_INSTANCE_PATH"):
        instance = str(test_config["LOCKKEEPER_INSTANCE_PATH"])
    app = Flask(
        __name__,
        instance_path=os.path.abspath(instance),
        instance_relative_config=True,
        template_folder=str(TEMPLATES_DIR),
        static_folder=str(STATIC_DIR),
    )
    config.load_config(app, test_config)
    setup.secure_files(app)
    extensions.init_app(app)
    setup.register_services(app)
    setup.register_blueprints(app)
    errors.register_error_handlers(app)
    setup.register_cli(app)
    setup.prepare_database(app)
    return app
