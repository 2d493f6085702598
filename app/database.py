"""The app's side of the database: private files, engine options from the
app's settings, and ORM writes.

The per-dialect engine setup and the column types belong to the lock core
(``lockkeeper_core.engine``, ``lockkeeper_core.columns``), which runs without
Flask; they are named here too, for the app and for the migrations, whose
frozen text imports them from here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flask import Flask
from lockkeeper_core.columns import (
    MYSQL_TABLE_ARGS,
    BigIntId,
    ExactString,
    UTCDateTime,
    name_column,
)
from lockkeeper_core.engine import (
    SERVER_CLOCK_DIALECTS,
    SQLITE_BUSY_TIMEOUT_MS,
    attach_autocommit_engine,
    autocommit,
    connection_is_dead,
    core_engine_options,
    install_engine_events,
    server_gone,
)
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from app.paths import make_private_dir, make_private_file, restrict_to_owner

__all__ = [
    "MYSQL_TABLE_ARGS",
    "POSTGRESQL_CONNECT_TIMEOUT",
    "SERVER_CLOCK_DIALECTS",
    "SQLITE_BUSY_TIMEOUT_MS",
    "BigIntId",
    "ExactString",
    "UTCDateTime",
    "attach_autocommit_engine",
    "autocommit",
    "begin_write",
    "connection_is_dead",
    "engine_options",
    "install_engine_events",
    "name_column",
    "secure_files",
    "server_gone",
]

POSTGRESQL_CONNECT_TIMEOUT = 10  # seconds


def secure_files(app: Flask, *, create: bool) -> None:
    """The instance folder 0700; a SQLite database and its -wal/-shm 0600.

    They hold password and token hashes and the session signing key. Done before
    the first connection, so the file SQLite opens (and the -wal/-shm it creates
    with the same permissions) is private from its first byte, and an existing
    0644 database from an older version is tightened. A command of the CLI
    tightens what exists and creates no database file (``db upgrade`` does, on
    purpose): an empty file would pass for a database someone made.
    """
    instance = Path(app.instance_path)
    if instance.exists():
        make_private_dir(instance)
    url = make_url(app.config["SQLALCHEMY_DATABASE_URI"])
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return
    database = Path(url.database)
    if create and database.parent == instance:
        make_private_dir(instance)
    if not database.parent.is_dir():
        return  # SQLite will say so
    if create:
        make_private_file(database)
    else:
        restrict_to_owner(database, 0o600)
    for suffix in ("-wal", "-shm", "-journal"):
        restrict_to_owner(database.with_name(database.name + suffix), 0o600)


def engine_options(app: Flask) -> dict[str, Any]:
    options = dict(app.config.get("SQLALCHEMY_ENGINE_OPTIONS") or {})
    url = make_url(app.config["SQLALCHEMY_DATABASE_URI"])
    backend = url.get_backend_name()
    for name, value in core_engine_options(backend).items():
        options.setdefault(name, value)
    if backend == "sqlite":
        options.setdefault("connect_args", {}).setdefault("timeout", 10)
    if backend == "postgresql" and "connect_timeout" not in url.query:
        # libpq waits forever by default for a server that does not answer (a
        # host down, a dropped SYN): a worker would hang on it. A URL's own
        # ?connect_timeout= wins.
        options.setdefault("connect_args", {}).setdefault(
            "connect_timeout", POSTGRESQL_CONNECT_TIMEOUT
        )
    read_timeout = app.config.get("LOCKKEEPER_DATABASE_READ_TIMEOUT")
    if (
        backend in ("mysql", "mariadb")
        and read_timeout
        and "read_timeout" not in url.query
    ):
        # PyMySQL waits forever for an answer by default: a request on a node
        # that stopped answering (a paused process or VM, a partition that
        # drops packets) would hang until it came back. A URL's own
        # ?read_timeout= wins. The migrations lift it (``reads_unbounded``).
        options.setdefault("connect_args", {}).setdefault("read_timeout", read_timeout)
    if backend == "postgresql" and app.config.get("LOCKKEEPER_PGBOUNCER"):
        # Transaction pooling: no server-side prepared statements (PgBouncer
        # before 1.21 cannot route them; psycopg prepares a query's 6th run).
        options.setdefault("connect_args", {})["prepare_threshold"] = None
    return options


def begin_write(session: Session) -> None:
    """Mark the session's transaction as a writer before its first statement.

    Every ORM write (users, tokens) calls this first; on SQLite it makes the
    transaction ``BEGIN IMMEDIATE``, elsewhere it changes nothing.
    """
    session.connection(execution_options={"sqlite_immediate": True})
