"""``guard(conn, lock)``: the fence check inside the caller's own transaction.

When the data a worker writes lives in the lock database, one call in the
transaction that writes it makes the database check the grant and hold its row
(a shared row lock) until that transaction ends::

    with client.lock("job:42", ttl=30) as lock, Session(engine) as session:
        with session.begin():
            guard(session, lock)          # raises GuardRefused if lock is lost
            session.add(Result(job=42, fence=lock.fence))

No take-over, release, force-release, claim or renew of the lock can commit
between the check and the caller's commit: each waits for it. A long transaction
therefore delays them; keep guarded transactions short.

``conn`` is a SQLAlchemy ``Connection`` or ORM ``Session`` (``Session.connection()``
joins its transaction), or a DB-API connection of psycopg (3 or 2), PyMySQL or
mysqlclient. Nothing here imports SQLAlchemy or a driver: the kind of ``conn`` is
read from the object, so the client still depends on httpx alone.

The SQL is ``SELECT lockkeeper_guard(resource, fence)`` on PostgreSQL and ``CALL
lockkeeper_guard(resource, fence)`` on MariaDB (the server's migration 0008).
"""

from __future__ import annotations

from typing import Any, Protocol

from lockkeeper_client.errors import (
    GuardNotInstalled,
    GuardOutsideTransaction,
    GuardRefused,
)

# SQLSTATE -> reason, as the guard raises them; the message starts with
# ``lockkeeper_guard: <reason>:`` too (PyMySQL shows the message, not the state).
SQLSTATES = {
    "LK001": "lost",
    "LK002": "expired",
    "LK003": "never held",
    "LK004": "no transaction",
}
_PREFIX = "lockkeeper_guard: "
# MySQL's error number of a SIGNAL with a user-defined SQLSTATE.
_SIGNAL_ERRNO = 1644
# No such routine: PostgreSQL's undefined_function, MariaDB's ER_SP_DOES_NOT_EXIST.
_UNDEFINED_FUNCTION = "42883"
_NO_SUCH_PROCEDURE_ERRNO = 1305
# MariaDB's ER_NO_DB_ERROR: a connection made without a database looks for the
# procedure nowhere (PostgreSQL always has one: its miss is 42883).
_NO_DATABASE_ERRNO = 1046

_SQL = {
    "postgresql": "SELECT lockkeeper_guard(%s::varchar, %s::bigint)",
    "mariadb": "CALL lockkeeper_guard(%s, %s)",
}


class Guardable(Protocol):
    """What ``guard`` needs of a lock: a ``HeldLock`` or a ``LockGrant``."""

    resource: str

    @property
    def fence(self) -> int: ...


def guard(conn: Any, lock: Guardable) -> None:
    """Check in ``conn``'s transaction that ``lock`` is still the valid grant,
    and hold its row until that transaction ends.

    :raise GuardRefused: the grant is lost, expired or was never held; roll back.
    :raise GuardOutsideTransaction: ``conn`` is in autocommit.
    :raise GuardNotInstalled: ``conn``'s database has no guard routine.
    """
    resource, fence = lock.resource, int(lock.fence)
    if hasattr(conn, "exec_driver_sql"):  # SQLAlchemy Connection
        _guard_sqlalchemy(conn, resource, fence)
    elif callable(getattr(conn, "connection", None)) and hasattr(conn, "get_bind"):
        # An ORM Session (or scoped_session): its connection, in its transaction.
        _guard_sqlalchemy(conn.connection(), resource, fence)
    else:
        _guard_dbapi(conn, resource, fence)


def _guard_sqlalchemy(conn: Any, resource: str, fence: int) -> None:
    dialect = conn.dialect
    kind = "mariadb" if _is_mariadb(dialect) else dialect.name
    if kind not in _SQL:
        raise ValueError(f"no guard on {dialect.name}: PostgreSQL and MariaDB only")
    if _outside_transaction(conn.connection.dbapi_connection, kind):
        raise _outside(resource)
    try:
        conn.exec_driver_sql(_SQL[kind], (resource, fence))
    except Exception as exc:
        _raise_refusal(getattr(exc, "orig", exc), exc, resource, fence)
        raise


def _guard_dbapi(conn: Any, resource: str, fence: int) -> None:
    module = type(conn).__module__.split(".")[0]
    if module in ("psycopg", "psycopg2"):
        kind = "postgresql"
    elif module in ("pymysql", "MySQLdb"):
        kind = "mariadb"
    else:
        raise TypeError(
            f"guard takes a SQLAlchemy Connection or Session, or a psycopg, "
            f"PyMySQL or mysqlclient connection, not {type(conn).__name__}"
        )
    if _outside_transaction(conn, kind):
        raise _outside(resource)
    cursor = conn.cursor()
    try:
        cursor.execute(_SQL[kind], (resource, fence))
    except Exception as exc:
        _raise_refusal(exc, exc, resource, fence)
        raise
    finally:
        cursor.close()


def _is_mariadb(dialect: Any) -> bool:
    return dialect.name == "mariadb" or bool(getattr(dialect, "is_mariadb", False))


def _outside_transaction(dbapi_connection: Any, kind: str) -> bool:
    """PostgreSQL: in autocommit (SQLAlchemy's AUTOCOMMIT isolation sets the
    driver's flag) with no transaction begun by hand (``BEGIN``, psycopg's
    ``conn.transaction()``); both psycopgs report that state as 0, IDLE.
    MariaDB's procedure tells this case itself (LK004), exactly."""
    if kind != "postgresql" or not getattr(dbapi_connection, "autocommit", False):
        return False
    return int(dbapi_connection.info.transaction_status) == 0


def _outside(resource: str) -> GuardOutsideTransaction:
    return GuardOutsideTransaction(
        resource,
        f"guard on {resource!r} needs a transaction: the connection is in "
        "autocommit, so the row lock would end with the call",
    )


def _raise_refusal(
    error: Any, raised: BaseException, resource: str, fence: int
) -> None:
    """Raise the client's exception for the guard's own failures; return for any
    other error (the caller re-raises it as it is)."""
    state = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
    message = _message(error)
    args = getattr(error, "args", ())
    errno = args[0] if args else None
    if errno == _NO_DATABASE_ERRNO:
        raise GuardNotInstalled(
            resource,
            f"guard on {resource!r}: the connection has no database selected "
            f"({message}), so no lockkeeper_guard; connect to the lock "
            "service's database",
        ) from raised
    if state == _UNDEFINED_FUNCTION or errno == _NO_SUCH_PROCEDURE_ERRNO:
        # PostgreSQL looks the function up on the search_path: the lock
        # schema's own database still misses it from another schema.
        where = (
            " with the schema it was migrated in on the search_path"
            if state == _UNDEFINED_FUNCTION
            else ""
        )
        raise GuardNotInstalled(
            resource,
            f"guard on {resource!r}: this database has no lockkeeper_guard "
            f"({message}); connect to the lock service's database{where}, or "
            "run `lockkeeper db upgrade` on it",
        ) from raised
    reason = SQLSTATES.get(state or "")
    if reason is None and message.startswith(_PREFIX):
        if errno == _SIGNAL_ERRNO:
            reason = message[len(_PREFIX) :].split(":", 1)[0]
            state = next((s for s, r in SQLSTATES.items() if r == reason), None)
    if reason is None or state is None:
        return
    if reason == "no transaction":
        raise GuardOutsideTransaction(resource, message) from raised
    raise GuardRefused(resource, message, reason, fence, state) from raised


def _message(error: Any) -> str:
    diag = getattr(error, "diag", None)  # psycopg: the primary message alone
    primary = getattr(diag, "message_primary", None)
    if primary:
        return str(primary)
    args: tuple[Any, ...] = tuple(getattr(error, "args", ()))
    if len(args) >= 2 and isinstance(args[1], str):  # PyMySQL: (errno, message)
        return args[1]
    return str(error)
