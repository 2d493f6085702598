"""Private, migrated databases for one bench run; dropped when it ends.

SQLite is a file in the run's scratch directory. PostgreSQL and MariaDB get a fresh
database ``lk_bench_<pid>_<hex>`` on the local servers (never the shared ``test``
database), created with the admin URLs below and dropped by ``close()``.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from app import create_app
from app.config import normalize_database_url
from app.extensions import db
from app.factory import upgrade_schema

ADMIN_URLS = {
    "postgresql": os.environ.get(
        "LOCKKEEPER_BENCH_POSTGRESQL_URL", "postgresql://postgres@127.0.0.1:5432/test"
    ),
    "mariadb": os.environ.get(
        "LOCKKEEPER_BENCH_MARIADB_URL", "mariadb://root@127.0.0.1:3306/test"
    ),
}


class DatabaseUnavailable(RuntimeError):
    pass


def migrate(url: str, instance: Path) -> None:
    app = create_app(
        {
            "LOCKKEEPER_DATABASE_URL": url,
            "LOCKKEEPER_INSTANCE_PATH": str(instance),
            "LOCKKEEPER_BOOTSTRAP": False,
            "LOCKKEEPER_AUTO_MIGRATE": False,
            "SECRET_KEY": "bench",
        }
    )
    upgrade_schema(app)
    with app.app_context():
        db.engine.dispose()


class BenchDatabase:
    """One migrated database on ``backend``; ``url`` is what the app is given."""

    def __init__(self, backend: str, workdir: Path):
        self.backend = backend
        self._admin = None
        self.name = f"lk_bench_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        instance = workdir / f"instance-{backend}"
        instance.mkdir(parents=True, exist_ok=True)
        if backend == "sqlite":
            self.url = f"sqlite:///{workdir / (self.name + '.sqlite3')}"
        else:
            admin_url = make_url(normalize_database_url(ADMIN_URLS[backend]))
            self.url = admin_url.set(database=self.name).render_as_string(
                hide_password=False
            )
            self._admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
            try:
                with self._admin.connect() as conn:
                    conn.execute(text(f"CREATE DATABASE {self.name}"))
            except Exception as exc:  # noqa: BLE001 - any failure means "not here"
                self._admin.dispose()
                self._admin = None
                raise DatabaseUnavailable(f"{backend} at {admin_url}: {exc}") from exc
        migrate(self.url, instance)

    def close(self) -> None:
        if self._admin is None:
            return
        with self._admin.connect() as conn:
            force = " WITH (FORCE)" if self.backend == "postgresql" else ""
            conn.execute(text(f"DROP DATABASE IF EXISTS {self.name}{force}"))
        self._admin.dispose()
        self._admin = None
