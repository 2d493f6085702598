"""Per-dialect engine setup that the ORM cannot infer.

SQLite: the driver's default BEGIN runs the first SELECT
outside the transaction and silently loses updates, and a deferred transaction that
upgrades to a writer fails at once with "database is locked". So the driver's own
transaction handling is switched off, WAL is on, and a write transaction asks for
``BEGIN IMMEDIATE`` with the ``sqlite_immediate`` execution option: writers queue on
``busy_timeout`` instead of failing.

MariaDB/MySQL: READ COMMITTED, so a locking read sees the latest committed row and
takes no gap locks (which deadlock concurrent first inserts).

PostgreSQL behind a failover manager (Patroni): a pooled connection can outlive its
server's role. After a switchover or failover it may point at a server that is now a
standby (every write fails with ``read_only_sql_transaction``) or one shutting down
(``admin_shutdown``). Such errors are treated as a lost connection: SQLAlchemy drops
the whole pool, and the service's one retry reconnects through the multi-host URL
(``target_session_attrs=read-write``) to whichever server is the primary now.
"""

from __future__ import annotations

import select
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from flask import Flask
from sqlalchemy import (
    BigInteger,
    DateTime,
    Engine,
    Integer,
    String,
    create_engine,
    event,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.orm import Session
from sqlalchemy.types import TypeDecorator

from app.paths import make_private_dir, make_private_file, restrict_to_owner

SQLITE_BUSY_TIMEOUT_MS = 10_000
SERVER_CLOCK_DIALECTS = frozenset({"postgresql", "mysql", "mariadb"})


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
    backend = make_url(app.config["SQLALCHEMY_DATABASE_URI"]).get_backend_name()
    if backend in ("mysql", "mariadb"):
        options.setdefault("isolation_level", "READ COMMITTED")
        options.setdefault("pool_recycle", 3600)
    if backend == "sqlite":
        options.setdefault("connect_args", {}).setdefault("timeout", 10)
    if backend == "postgresql" and app.config.get("LOCKKEEPER_PGBOUNCER"):
        # Transaction pooling: no server-side prepared statements (PgBouncer
        # before 1.21 cannot route them; psycopg prepares a query's 6th run).
        options.setdefault("connect_args", {})["prepare_threshold"] = None
    return options


# read_only_sql_transaction, admin_shutdown, crash_shutdown, cannot_connect_now:
# this server cannot take our writes now; another one (or this one later) can.
SERVER_GONE_SQLSTATES = frozenset({"25006", "57P01", "57P02", "57P03"})


def server_gone(exc: BaseException) -> bool:
    """True when ``exc`` (a DBAPI or SQLAlchemy error) says the server we talk to
    is no primary we can write to: a standby, a server shutting down."""
    orig = getattr(exc, "orig", exc)
    return getattr(orig, "sqlstate", None) in SERVER_GONE_SQLSTATES


def install_engine_events(engine: Engine) -> None:
    if getattr(engine, "_lockkeeper_events", False):
        return
    engine._lockkeeper_events = True  # type: ignore[attr-defined]
    if engine.dialect.name == "postgresql":
        _install_postgresql_events(engine)
    elif engine.dialect.name == "sqlite":
        _install_sqlite_events(engine)
    if engine.dialect.name != "sqlite":
        event.listen(engine, "checkout", _discard_if_dead)


def _socket_of(dbapi_connection) -> int | None:
    """The file descriptor of a psycopg or PyMySQL connection's socket."""
    pgconn = getattr(dbapi_connection, "pgconn", None)
    if pgconn is not None:
        return pgconn.socket if not dbapi_connection.closed else None
    sock = getattr(dbapi_connection, "_sock", None)  # PyMySQL
    return sock.fileno() if sock is not None else None


def connection_is_dead(dbapi_connection) -> bool:
    """True when an idle pooled connection was closed by the other end.

    An idle connection has nothing to read: a readable socket means the server
    or the pooler closed it (``pg_terminate_backend``, a restart, KILL on
    MariaDB, PgBouncer going away) and left its goodbye or EOF behind. One
    ``poll`` with no wait, about a microsecond, where ``pool_pre_ping`` would be
    a round trip to the server on every checkout. A connection that went silent
    without a goodbye (a host gone) is not seen; the service's one retry on a
    fresh connection covers that.
    """
    try:
        fd = _socket_of(dbapi_connection)
    except Exception:  # noqa: BLE001 - psycopg: OperationalError "connection is lost"
        return True
    if fd is None or fd < 0:
        return True
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLPRI)
    return bool(poller.poll(0))


def _discard_if_dead(dbapi_connection, _record, _proxy) -> None:
    if connection_is_dead(dbapi_connection):
        # The pool invalidates this one and hands out a fresh connection.
        raise DisconnectionError("the server closed this pooled connection")


def _install_postgresql_events(engine: Engine) -> None:
    @event.listens_for(engine, "handle_error")
    def _on_error(context):
        if server_gone(context.original_exception):
            # Invalidates the pool: its other connections lead to the same server.
            context.is_disconnect = True
            context.invalidate_pool_on_disconnect = True


def _install_sqlite_events(engine: Engine) -> None:

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record):
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        if engine.url.database not in (None, "", ":memory:"):
            cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection):
        options = connection.get_execution_options()
        if options.get("sqlite_autocommit"):
            return  # each statement is its own transaction: no reader left open
        immediate = options.get("sqlite_immediate")
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def attach_autocommit_engine(engine: Engine, options: dict[str, Any]) -> None:
    """Give ``engine`` its autocommit twin (see ``autocommit``) and dispose of the
    twin whenever ``engine`` is disposed."""
    if engine.dialect.name == "sqlite":
        return
    twin = create_engine(
        engine.url,
        **{
            **options,
            "isolation_level": "AUTOCOMMIT",
            # Always in autocommit: no transaction can be left to roll back.
            "pool_reset_on_return": None,
        },
    )
    install_engine_events(twin)
    engine._lockkeeper_autocommit = twin  # type: ignore[attr-defined]
    event.listen(engine, "engine_disposed", lambda _engine: twin.dispose())


def autocommit(engine: Engine) -> Engine:
    """``engine`` for single-statement work: no BEGIN/COMMIT round trips, and no
    read transaction held open (which on SQLite would stall WAL checkpoints).

    PostgreSQL and MariaDB: a second engine whose pooled connections are created
    in autocommit and stay so, so checking one out and in costs no isolation-level
    switch and no reset (about a tenth of a lock operation's CPU otherwise).
    """
    try:
        return engine._lockkeeper_autocommit  # type: ignore[attr-defined]
    except AttributeError:
        # SQLite: not SQLAlchemy's AUTOCOMMIT level, whose reset on checkin would
        # hand the driver back its own implicit (lossy) transaction handling.
        options = (
            {"sqlite_autocommit": True}
            if engine.dialect.name == "sqlite"
            else {"isolation_level": "AUTOCOMMIT"}
        )
        shared = engine.execution_options(**options)
        engine._lockkeeper_autocommit = shared  # type: ignore[attr-defined]
        return shared


def begin_write(session: Session) -> None:
    """Mark the session's transaction as a writer before its first statement.

    Every ORM write (users, tokens) calls this first; on SQLite it makes the
    transaction ``BEGIN IMMEDIATE``, elsewhere it changes nothing.
    """
    session.connection(execution_options={"sqlite_immediate": True})


# Column types shared by every model.

# SQLite only auto-increments an INTEGER PRIMARY KEY (the rowid alias).
BigIntId = BigInteger().with_variant(Integer, "sqlite")


class UTCDateTime(TypeDecorator[datetime]):
    """A UTC instant: ``timestamptz`` on PostgreSQL, naive-UTC elsewhere.

    MySQL/MariaDB need ``DATETIME(6)`` or they drop the microseconds; SQLite stores
    ISO text, which orders correctly only if every value is naive UTC of one format.
    Values always come back timezone-aware in UTC.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect):
        if dialect.name in ("mysql", "mariadb"):
            return dialect.type_descriptor(mysql.DATETIME(fsp=6))
        return dialect.type_descriptor(DateTime(timezone=True))

    def process_bind_param(self, value, dialect):
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: pass an aware UTC instant")
        value = value.astimezone(UTC)
        return value if dialect.name == "postgresql" else value.replace(tzinfo=None)

    def process_result_value(self, value, dialect):
        if value is None:
            return None
        if isinstance(value, str):  # raw text from SQLite through text() queries
            value = datetime.fromisoformat(value)
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class ExactString(TypeDecorator[str]):
    """A string compared byte for byte on every database.

    MariaDB/MySQL compare case-insensitively by default (``Job:1`` and ``job:1``
    would be one lock), and their ``_bin`` collations still ignore trailing spaces
    (owner ``w-1 `` would pass for ``w-1``): use the binary NO PAD collation.
    """

    impl = String
    cache_ok = True

    def load_dialect_impl(self, dialect):
        if dialect.name in ("mysql", "mariadb"):
            is_mariadb = dialect.name == "mariadb" or getattr(
                dialect, "is_mariadb", False
            )
            collation = "utf8mb4_nopad_bin" if is_mariadb else "utf8mb4_0900_bin"
            return dialect.type_descriptor(
                mysql.VARCHAR(self.length, charset="utf8mb4", collation=collation)
            )
        return dialect.type_descriptor(String(self.length))


def name_column(length: int = 255) -> ExactString:
    return ExactString(length)


# Every table: InnoDB and utf8mb4 on MariaDB/MySQL (the server default may be latin1).
MYSQL_TABLE_ARGS = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4"}
