"""``lockkeeper db upgrade``: the lock core's migrations (``lockkeeper_core.upgrade``)
run on the app's own engine, while the previous release serves."""

from __future__ import annotations

from typing import Any

from flask import Flask
from lockkeeper_core.upgrade import Upgraded
from lockkeeper_core.upgrade import upgrade as upgrade_database


def upgrade(app: Flask, target: str = "head", **options: Any) -> Upgraded:
    """Run the migrations up to ``target`` on ``app``'s database (``options``:
    those of ``lockkeeper_core.upgrade.upgrade``)."""
    from app.extensions import db

    with app.app_context():
        return upgrade_database(db.engine, target, **options)
