"""Test databases: a fresh SQLite file per test, and one private database per
session on PostgreSQL and MariaDB (emptied before each test), so parallel runs on
one machine never share tables.

URLs of a server login that may CREATE DATABASE come from
``LOCKKEEPER_TEST_POSTGRESQL_URL`` and ``LOCKKEEPER_TEST_MARIADB_URL``. A server
that does not answer skips its tests locally and fails them under ``CI=true``.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from pathlib import Path

import pytest
from alembic import command
from lockkeeper_core.queue import stop_background
from lockkeeper_core.upgrade import migration_config
from lockkeeper_core.wakeups import LISTENER_APPLICATION_NAME
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from app import create_app
from app.config import normalize_database_url
from app.extensions import db
from app.factory import upgrade_schema

BACKENDS = ("sqlite", "postgresql", "mariadb")
SERVER_URLS = {
    "postgresql": os.environ.get(
        "LOCKKEEPER_TEST_POSTGRESQL_URL", "postgresql://postgres@127.0.0.1:5432/test"
    ),
    "mariadb": os.environ.get(
        "LOCKKEEPER_TEST_MARIADB_URL", "mariadb://root@127.0.0.1:3306/test"
    ),
}
# Every table a test may write, emptied between tests on the server databases
# (``test_every_table_is_emptied_between_tests`` keeps the list whole).
TABLES = (
    "lock_holders",
    "lock_sessions",
    "lock_waiters",
    "lock_events",
    "distributed_locks",
    "lock_freezes",
    "user_sessions",
    "login_address_windows",
    "activity_samples",
    "activity_events",
    "activity_refusals",
    "api_tokens",
    "users",
)
# Kept between tests: SQLite's fence counter row (fences only grow).
KEPT_TABLES = ("lock_fence_counter",)
IN_CI = os.environ.get("CI", "").lower() == "true"


def downgrade_schema(revision: str) -> None:
    """Run the migrations down to ``revision`` on the current app's database."""
    with db.engine.connect() as conn:
        command.downgrade(migration_config(conn), revision)


def unavailable(reason: str):
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: a missing database fails the run)")
    pytest.skip(reason)


def migrated(url: str, instance: Path) -> None:
    app = create_app(
        {
            "LOCKKEEPER_DATABASE_URL": url,
            "LOCKKEEPER_INSTANCE_PATH": str(instance),
            "LOCKKEEPER_BOOTSTRAP": False,
            "LOCKKEEPER_AUTO_MIGRATE": False,
            "SECRET_KEY": "test",
        }
    )
    upgrade_schema(app)
    with app.app_context():
        db.engine.dispose()


class SqliteDatabases:
    def __init__(self, workdir: Path):
        self.template = workdir / "template.sqlite3"
        migrated(f"sqlite:///{self.template}", workdir)

    def fresh(self, directory: Path) -> str:
        path = directory / "lockkeeper.sqlite3"
        shutil.copy(self.template, path)
        return f"sqlite:///{path}"

    def close(self) -> None:
        pass


class ServerDatabase:
    """A private database on a shared server, migrated once."""

    def __init__(self, backend: str, workdir: Path):
        self.backend = backend
        admin_url = make_url(normalize_database_url(SERVER_URLS[backend]))
        self.name = f"lk_test_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        self.url = admin_url.set(database=self.name).render_as_string(
            hide_password=False
        )
        options = {"isolation_level": "AUTOCOMMIT"}
        self.admin = create_engine(admin_url, **options)
        try:
            with self.admin.connect() as conn:
                conn.execute(text(f"CREATE DATABASE {self.name}"))
        except Exception as exc:  # noqa: BLE001 - any failure means "not here"
            self.admin.dispose()
            raise ConnectionError(f"{backend} at {admin_url}: {exc}") from exc
        migrated(self.url, workdir)
        # One connection between tests: emptying the tables needs no more, and
        # every connection held here is one the tests' budget cannot use.
        self.engine = create_engine(self.url, pool_size=1, max_overflow=0)

    def fresh(self, _directory: Path) -> str:
        with self.engine.begin() as conn:
            for table in TABLES:
                conn.execute(text(f"DELETE FROM {table}"))
        return self.url

    def listener_connections(self) -> list[int]:
        """Backend pids of the waiters' LISTEN connections to this database."""
        if self.backend != "postgresql":
            return []
        with self.admin.connect() as conn:
            return list(
                conn.scalars(
                    text(
                        "SELECT pid FROM pg_stat_activity WHERE datname = :name"
                        " AND application_name = :listener"
                    ),
                    {"name": self.name, "listener": LISTENER_APPLICATION_NAME},
                )
            )

    def close(self) -> None:
        # Apps a test built and never disposed of still listen: stop them first,
        # so the DROP below cuts no connection from under a live thread.
        stop_background(self.url)
        self.engine.dispose()
        deadline = time.monotonic() + 10
        while (left := self.listener_connections()) and time.monotonic() < deadline:
            time.sleep(0.05)
        with self.admin.connect() as conn:
            if self.backend == "postgresql":
                conn.execute(text(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)"))
            else:
                conn.execute(text(f"DROP DATABASE IF EXISTS {self.name}"))
        self.admin.dispose()
        assert not left, f"waiter listeners still connected to {self.name}: {left}"
