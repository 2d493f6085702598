"""Per-dialect engine setup that the ORM cannot infer, for any engine the lock
core runs on (the server's, or a worker's own in the embedded mode).

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

import contextlib
import select
from collections.abc import Iterator
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError

SQLITE_BUSY_TIMEOUT_MS = 10_000
# The databases whose clock decides (``lockkeeper_core.clock.DatabaseClock``).
SERVER_CLOCK_DIALECTS = frozenset({"postgresql", "mysql", "mariadb"})


def core_engine_options(backend: str) -> dict[str, Any]:
    """The ``create_engine`` options the lock core needs on ``backend`` (a
    URL's backend name), which the server and an embedded worker both start
    from: READ COMMITTED on MariaDB/MySQL (see above) and a recycle inside
    its ``wait_timeout``."""
    if backend in ("mysql", "mariadb"):
        return {"isolation_level": "READ COMMITTED", "pool_recycle": 3600}
    return {}


# read_only_sql_transaction, admin_shutdown, crash_shutdown, cannot_connect_now:
# this server cannot take our writes now; another one (or this one later) can.
SERVER_GONE_SQLSTATES = frozenset({"25006", "57P01", "57P02", "57P03"})
# MariaDB's "WSREP has not yet prepared node for application use": the node
# left the cluster's primary component (a partition, a restart).
GALERA_NOT_READY_ERRNO = 1047


def server_gone(exc: BaseException) -> bool:
    """True when ``exc`` (a DBAPI or SQLAlchemy error) says the server we talk to
    is no primary we can write to: a standby, a server shutting down, a Galera
    node out of the cluster's primary component."""
    orig = getattr(exc, "orig", exc)
    if getattr(orig, "sqlstate", None) in SERVER_GONE_SQLSTATES:
        return True
    args = getattr(orig, "args", ())
    return bool(args) and args[0] == GALERA_NOT_READY_ERRNO


@contextlib.contextmanager
def reads_unbounded(connection: Connection) -> Iterator[None]:
    """No read timeout on ``connection`` while the block runs: a migration
    that rebuilds a large table, or waits for its lock, may take longer than
    any request the server's read timeout is set for
    (``LOCKKEEPER_DATABASE_READ_TIMEOUT``, PyMySQL's ``read_timeout``). The
    timeout is back before the connection returns to its pool. PyMySQL reads
    its ``_read_timeout`` before each packet and has no public setter; other
    drivers are left as they are."""
    dbapi_connection = connection.connection.dbapi_connection
    if not hasattr(dbapi_connection, "_read_timeout"):
        yield
        return
    kept = dbapi_connection._read_timeout
    dbapi_connection._read_timeout = None
    try:
        yield
    finally:
        dbapi_connection._read_timeout = kept


def install_engine_events(engine: Engine) -> None:
    if getattr(engine, "_lockkeeper_events", False):
        return
    engine._lockkeeper_events = True  # type: ignore[attr-defined]
    if engine.dialect.name == "postgresql":
        _install_postgresql_events(engine)
    elif engine.dialect.name == "sqlite":
        _install_sqlite_events(engine)
    elif engine.dialect.name in ("mariadb", "mysql"):
        _install_mariadb_events(engine)
    if engine.dialect.name != "sqlite":
        event.listen(engine, "connect", _mark_connected)
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


# On the record of a connection just made; its first checkout takes it off.
_JUST_CONNECTED = "lockkeeper.just_connected"


def _mark_connected(_dbapi_connection, record) -> None:
    record.info[_JUST_CONNECTED] = True


def _discard_if_dead(dbapi_connection, record, _proxy) -> None:
    # A connection made for this checkout is not polled: nothing idle can have
    # been closed under it, and the pool tries only twice. When it replaced a
    # closed pooled connection with one that was closed at once too (HAProxy
    # cutting the sessions of a node it marked down, at a failover), the
    # second discard used up its attempts: the checkout raised
    # InvalidRequestError ("This connection is closed"), a 500. Used, a
    # closed one fails its statement as a lost connection, which the service
    # retries once on a fresh connection, then answers 503.
    if record.info.pop(_JUST_CONNECTED, False):
        return
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


# On a Galera node: reads, and UPDATE and DELETE statements, wait until the node
# has applied everything the cluster committed before they started (bits 1 and
# 2 of ``wsrep_sync_wait``). Without it a node answers from a state that
# another node's commit already replaced: a lock shown free that is held, a
# renew refused as lost just after its grant on another node. Writes are
# ordered by certification whatever the node has seen; decisions on what a
# statement read (or did not find) are not.
GALERA_SYNC_WAIT = 3


# Where a pooled connection to a Galera node says so (``Connection.info``, set
# when the pool connects): the statements that must give certification a key
# there and nowhere else ask ``galera_connection``.
GALERA_INFO_KEY = "lockkeeper.galera"


def galera_connection(conn) -> bool:
    """Whether a SQLAlchemy ``Connection`` of a core engine is to a Galera node."""
    return bool(conn.info.get(GALERA_INFO_KEY))


def on_galera(dbapi_connection) -> bool:
    """Whether a MariaDB connection is to a node of a Galera cluster."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("SHOW VARIABLES LIKE 'wsrep_on'")
        row = cursor.fetchone()
    finally:
        cursor.close()
    return bool(row) and str(row[1]).upper() == "ON"


def _install_mariadb_events(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, record):
        # One round trip per new connection. A node that refuses the setting
        # refuses the connection: the service never reads without it.
        if on_galera(dbapi_connection):
            record.info[GALERA_INFO_KEY] = True
            cursor = dbapi_connection.cursor()
            try:
                cursor.execute(f"SET SESSION wsrep_sync_wait = {GALERA_SYNC_WAIT}")
            finally:
                cursor.close()

    @event.listens_for(engine, "handle_error")
    def _on_error(context):
        if server_gone(context.original_exception):
            # This node cannot serve until it rejoins; behind a proxy a fresh
            # connection reaches a node that can (the service's one retry).
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
    if twin.dialect.name in ("mysql", "mariadb"):
        _read_committed_sessions(twin)
    engine._lockkeeper_autocommit = twin  # type: ignore[attr-defined]
    event.listen(engine, "engine_disposed", lambda _engine: twin.dispose())


def _read_committed_sessions(twin: Engine) -> None:
    """READ COMMITTED for the autocommit twin's MariaDB sessions, as for every
    transaction of the service. SQLAlchemy's AUTOCOMMIT level leaves a session
    at the server's default, REPEATABLE READ, where a single DELETE locks the
    gap before its row too: a set's cleanup of a free row it made (by name)
    waited there for another set's insert of a free row just before it, whose
    insert then waited behind that request (a deadlock, seen in the set
    race). One statement per new connection."""

    @event.listens_for(twin, "connect")
    def _on_connect(dbapi_connection, _record):
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        finally:
            cursor.close()


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
        pass
    if engine.dialect.name != "sqlite":
        # An engine made without its twin (a worker's own, given to the core):
        # an execution option would not do, since the hot path checks out the
        # driver's connection itself, which skips SQLAlchemy's isolation level:
        # its single statements would run in a transaction nobody commits.
        # Its connections are made as the engine's own are: the pool's creator
        # carries the worker's connect_args (TLS, timeouts) or its own creator,
        # which the engine's URL alone does not.
        options = core_engine_options(engine.dialect.name)
        attach_autocommit_engine(engine, {**options, "creator": engine.pool._creator})
        return engine._lockkeeper_autocommit  # type: ignore[attr-defined]
    # SQLite: not SQLAlchemy's AUTOCOMMIT level, whose reset on checkin would
    # hand the driver back its own implicit (lossy) transaction handling.
    shared = engine.execution_options(sqlite_autocommit=True)
    engine._lockkeeper_autocommit = shared  # type: ignore[attr-defined]
    return shared


def _read_committed_sibling(engine: Engine, options: dict[str, Any]) -> Engine:
    """The core's own engine beside a worker's MariaDB/MySQL ``engine``, made
    with ``options`` (its creator, READ COMMITTED), so its connections are at
    READ COMMITTED from their start; disposed of with the worker's engine.

    Not ``engine.execution_options(isolation_level=...)``: that level is set
    on a ``Connection``'s checkout, and the hot path takes the driver's
    connection from the pool itself (``lockkeeper_core.driver``), so its
    transactions ran at the worker's level, REPEATABLE READ by default, with
    the gap locks READ COMMITTED avoids. Nor a setting on the worker's own
    connections, which are the worker's to set."""
    sibling = create_engine(engine.url, **options)
    event.listen(engine, "engine_disposed", lambda _engine: sibling.dispose())
    return sibling


# The drivers the server ships for plain URLs (``app.config``'s table).
DRIVERS = {
    "postgres": "postgresql+psycopg",
    "postgresql": "postgresql+psycopg",
    "mysql": "mysql+pymysql",
    "mariadb": "mariadb+pymysql",
}


def engine_for(database: str | Engine) -> Engine:
    """A worker's engine (given), or one made from a URL with the shipped
    drivers; either way with the setup the core needs, as the server gives
    its own: the per-dialect events, READ COMMITTED on MariaDB/MySQL, and the
    autocommit twin its single statements run on (PostgreSQL's functions,
    the reads). Without the twin a statement sent on a pooled driver
    connection would run in a transaction nobody commits."""
    if isinstance(database, Engine):
        # The core's engines beside it connect as the worker's does: the
        # pool's creator carries its connect_args (TLS, timeouts) or its own
        # creator, which the URL alone does not.
        options: dict[str, Any] = {"creator": database.pool._creator}
        engine = database
        if engine.dialect.name in ("mysql", "mariadb"):
            options.update(core_engine_options(engine.dialect.name))
            engine = _read_committed_sibling(database, options)
    else:
        url = make_url(database)
        if url.drivername in DRIVERS:
            url = url.set(drivername=DRIVERS[url.drivername])
        options = core_engine_options(url.get_backend_name())
        engine = create_engine(url, **options)
    install_engine_events(engine)
    if not hasattr(engine, "_lockkeeper_autocommit"):
        attach_autocommit_engine(
            engine, {k: v for k, v in options.items() if k != "isolation_level"}
        )
    return engine
