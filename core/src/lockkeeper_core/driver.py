"""The one place the hot path talks to the DB-API driver itself.

PostgreSQL's acquire, renew and release are each one statement whose SQL never
changes. Sent through SQLAlchemy's ``Connection.execute`` each one paid for an
execution context, a result object with its column metadata and type processors,
and the connection's isolation-level set/reset on every checkout: about as much
CPU as the rest of the request. Here a pooled connection of the autocommit engine
(``lockkeeper_core.engine.autocommit``: always in autocommit, so nothing to
reset on checkin) runs the statement on a plain cursor and the one row comes
back as a named tuple with its instants in UTC.

What SQLAlchemy gave is kept: the pool (and pool events), errors wrapped as
``sqlalchemy.exc.DBAPIError`` subclasses (``IntegrityError`` stays retryable), a
dead connection invalidated with its pool and ``connection_invalidated`` set so
the service retries once, and ``before_cursor_execute`` listeners on the engine
see every statement (``conn`` and ``context`` are None), so statement counters
keep counting.

The connection a statement (or a transaction) ran on is kept checked out for
the next one (``KeptConnection``): SQLAlchemy's checkout and checkin of a
pooled connection (its fairy, weak reference, pool queue, events and reset)
counted 68,000 instructions, about as many as psycopg's own work on the
statement. What the pool's checkout decides is decided again before a kept
connection is used: a disposed or invalidated pool, a connection past its
recycle age, one the server closed (the checkout listener's poll), another
process after a fork.

On psycopg the statement goes through a ``RawCursor`` with ``$n`` placeholders,
which psycopg sends without converting the query, and the column names come from
the result rather than from ``cursor.description``, which makes an object per
column.
"""

from __future__ import annotations

import os
import re
import time
from collections import namedtuple
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.engine.base import OptionEngine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import QueuePool

from lockkeeper_core.engine import connection_is_dead, server_gone

_NAMED_PARAMETER = re.compile(r"(?<![:\w]):(\w+)")
# Where a psycopg connection's cursors are kept, one per statement
# (``DriverConnection.one``).
_CURSORS = "lockkeeper.cursors"


class DriverSQL:
    """A statement written with ``:name`` parameters, in the driver's paramstyle
    (``sql``), and for psycopg's raw cursor (``raw``: ``$n``, values in ``names``
    order)."""

    __slots__ = ("names", "raw", "sql")

    def __init__(self, sql: str) -> None:
        # psycopg and PyMySQL both take %(name)s; a literal % must be doubled.
        self.sql = _NAMED_PARAMETER.sub(r"%(\1)s", sql.replace("%", "%%"))
        names: dict[str, int] = {}

        def number(match: re.Match) -> str:
            return f"${names.setdefault(match[1], len(names) + 1)}"

        raw = _NAMED_PARAMETER.sub(number, sql)
        self.raw: str | bytes = raw.encode() if raw.isascii() else raw
        self.names = tuple(names)


class DriverConnection:
    """Runs one statement at a time on the autocommit engine's pool."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.dialect = engine.dialect
        self._dbapi_error = engine.dialect.loaded_dbapi.Error
        self._row_types: dict[tuple[str, ...], type] = {}
        # Each statement's row shape by its text, found from its first result:
        # fixed SQL always returns the same columns.
        self._shapes: dict[Any, RowShape] = {}
        self._raw_cursor = None
        self._tuples_ok = None
        self._kept = KeptConnection(engine)
        if self.dialect.driver == "psycopg":
            import psycopg

            self._raw_cursor = psycopg.RawCursor
            self._tuples_ok = psycopg.pq.ExecStatus.TUPLES_OK

    def one(self, statement: DriverSQL, params: dict[str, Any]) -> Any | None:
        """The first row ``statement`` returns (attributes by column name), or None."""
        return self._answer(statement, params, False)

    def all(self, statement: DriverSQL, params: dict[str, Any]) -> list[Any]:
        """Every row ``statement`` returns (attributes by column name)."""
        return self._answer(statement, params, True) or []

    def _answer(self, statement: DriverSQL, params: dict[str, Any], every: bool) -> Any:
        """``statement``'s first row, or with ``every`` the list of its rows;
        None when it returns no result set (a plain write) or, for the first
        row, no row."""
        sql = statement.sql
        try:
            fairy = self._kept.take()
        except self._dbapi_error as exc:  # the server is down: not a 500
            raise self._wrapped(exc, sql, params, invalidated=False) from exc
        cursor = None
        answered = False
        raw_cursor = self._raw_cursor
        try:
            dbapi_connection = fairy.dbapi_connection
            if raw_cursor is not None:
                # One cursor per statement and connection, kept in its pool
                # record's info (cleared when the connection is replaced):
                # making one cost a fifth of the statement's work in psycopg,
                # and a cursor given another statement than its last makes
                # its adapters (a Transformer, each column's loader) again,
                # as much CPU again as the rest of psycopg's work.
                info = fairy.info
                cursors = info.get(_CURSORS)
                if cursors is None:
                    cursors = info[_CURSORS] = {}
                cursor = cursors.get(statement.raw)
                if cursor is None or cursor.connection is not dbapi_connection:
                    cursor = cursors[statement.raw] = raw_cursor(dbapi_connection)
            else:
                cursor = dbapi_connection.cursor()
            listeners = self.engine.dispatch.before_cursor_execute
            if listeners:
                for listener in listeners:
                    listener(None, cursor, sql, params, None, False)
            if raw_cursor is not None:
                cursor.execute(
                    statement.raw, [params[name] for name in statement.names]
                )
                answered = True
                result = cursor.pgresult
                if result is None or result.status != self._tuples_ok:
                    return None  # no result set (a plain write)
                shape = self._shapes.get(statement.raw)
                if shape is None or shape.width != result.nfields:
                    shape = self._shapes[statement.raw] = RowShape(
                        self._row_type(
                            tuple(
                                result.fname(n).decode() for n in range(result.nfields)
                            )
                        ),
                        tuple(
                            n
                            for n in range(result.nfields)
                            if result.ftype(n) in _PG_INSTANT_TYPES
                        ),
                    )
                if every:
                    return [shape.row(raw, _in_utc) for raw in cursor.fetchall()]
                raw = cursor.fetchone()
                return None if raw is None else shape.row(raw, _in_utc)
            cursor.execute(sql, params)
            answered = True
            description = cursor.description
            if description is None:  # no result set (a plain write)
                return None
            row_type = self._row_type(tuple(column[0] for column in description))
            if every:
                return [_utc_row(row_type, raw) for raw in cursor.fetchall()]
            raw = cursor.fetchone()
            return None if raw is None else _utc_row(row_type, raw)
        except self._dbapi_error as exc:
            answered = False
            # server_gone: a standby or a server shutting down (a failover).
            disconnect = server_gone(exc) or self.dialect.is_disconnect(
                exc, fairy.dbapi_connection, cursor
            )
            if disconnect:
                fairy.invalidate(exc)
                self.engine.pool.dispose()  # the others died with the server too
            raise self._wrapped(exc, sql, params, invalidated=disconnect) from exc
        finally:
            if cursor is not None and not (answered and raw_cursor is not None):
                kept = ()
                if raw_cursor is not None and fairy.dbapi_connection is not None:
                    # After a failure none of the connection's cursors is
                    # used again.
                    kept = fairy.info.pop(_CURSORS, {}).values()
                for each in {cursor, *kept}:
                    try:
                        each.close()
                    except self._dbapi_error:
                        answered = False
            if answered:
                self._kept.give_back(fairy)
            else:
                fairy.close()

    @contextmanager
    def transaction(self, begin: str) -> Iterator[DriverTransaction]:
        """``begin`` (SQLite: ``BEGIN IMMEDIATE``; empty for MariaDB, whose
        driver opens the transaction with the first statement), the statements,
        COMMIT on one pooled connection; any error rolls back. Engine ``commit``
        listeners hear the commit (``conn`` None)."""
        try:
            fairy = self._kept.take()
        except self._dbapi_error as exc:
            raise self._wrapped(exc, begin, {}, invalidated=False) from exc
        transaction_class = (
            SQLiteTransaction if self.dialect.name == "sqlite" else MySQLTransaction
        )
        transaction = None
        reset = False
        try:
            dbapi_connection = fairy.dbapi_connection
            transaction = transaction_class(self, dbapi_connection.cursor())
            if begin:
                transaction.execute(begin, {})
            try:
                yield transaction
                dbapi_connection.commit()
            except BaseException:
                try:
                    dbapi_connection.rollback()
                except self._dbapi_error:
                    pass
                raise
            finally:
                transaction.cursor.close()
            reset = True
            for listener in self.engine.dispatch.commit:
                listener(None)
        except (self._dbapi_error, DBAPIError) as exc:
            # A statement's error comes wrapped (DBAPIError), COMMIT's bare.
            orig = exc.orig if isinstance(exc, DBAPIError) else exc
            disconnect = server_gone(orig) or self.dialect.is_disconnect(
                orig, fairy.dbapi_connection, transaction and transaction.cursor
            )
            if disconnect:
                fairy.invalidate(orig)
                # The others died with the server too: the service's one retry
                # must not get another of them (``one`` above does the same).
                self.engine.pool.dispose()
            if isinstance(exc, DBAPIError):
                exc.connection_invalidated = exc.connection_invalidated or disconnect
                raise
            raise self._wrapped(exc, begin, {}, invalidated=disconnect) from exc
        finally:
            if reset:
                # Committed: kept for the next, or checked in without the
                # pool's rollback (a round trip on MariaDB), as SQLAlchemy's
                # own Connection tells it.
                self._kept.give_back(fairy, committed=True)
            else:
                fairy.close()

    def close(self) -> None:
        """Check in the connection kept for the next statement."""
        self._kept.close()

    def _wrapped(self, exc, sql, params, *, invalidated: bool) -> Exception:
        return DBAPIError.instance(
            sql,
            params,
            exc,
            self._dbapi_error,
            connection_invalidated=invalidated,
            dialect=self.dialect,
        )

    def _row_type(self, names: tuple[str, ...]) -> type:
        row_type = self._row_types.get(names)
        if row_type is None:
            row_type = self._row_types[names] = namedtuple("DriverRow", names)
        return row_type


def _discard(fairy: Any) -> None:
    """Close a kept connection the pool would not hand out (checked in to a
    pool since disposed of, it would stay open there until collected)."""
    if fairy.dbapi_connection is not None:
        fairy.invalidate()


# A kept connection found in a forked child is its parent's: never closed
# there (closing would end the parent's session on the shared socket) nor
# collected (SQLAlchemy's finalizer would check it in to the child's pool).
_INHERITED: list[Any] = []


class KeptConnection:
    """The pooled connections kept checked out between statements: one,
    for the next statement of any thread (a second at once checks out
    another, and whichever ends last checks its own in). Kept only from a
    ``QueuePool`` (a SQLite memory database's pool has one connection for
    everyone). ``list.pop`` and ``append`` hand one connection to one thread
    only, without a lock."""

    __slots__ = ("_engine", "_idle", "_keeps", "_pid")

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._keeps = isinstance(engine.pool, QueuePool)
        self._idle: list[Any] = []
        self._pid = os.getpid()
        # Disposing of the engine closes every connection it is not lending:
        # a kept one too, as if it had been checked in. (An engine made by
        # ``execution_options`` is disposed of through the one it was made from.)
        root = engine
        while isinstance(root, OptionEngine):
            root = root._proxied
        event.listen(root, "engine_disposed", self._disposed)

    def _disposed(self, _engine: Engine) -> None:
        if self._pid != os.getpid():
            self._forked()
        idle, self._idle = self._idle, []
        for fairy in idle:
            _discard(fairy)

    def take(self) -> Any:
        """A kept connection if the pool would hand it out now, else one
        checked out of the pool."""
        if self._pid != os.getpid():
            self._forked()
        idle = self._idle
        while idle:
            try:
                fairy = idle.pop()
            except IndexError:  # another thread took it
                break
            if self._usable(fairy):
                return fairy
            _discard(fairy)
        return self._engine.raw_connection()

    def _forked(self) -> None:
        """In a forked child: the kept connections are the parent's."""
        _INHERITED.extend(self._idle)
        self._idle = []
        self._pid = os.getpid()

    def _usable(self, fairy: Any) -> bool:
        """What the pool's checkout would decide: not from a pool since
        disposed, not invalidated (itself, or the pool since it connected),
        not past its recycle age, not closed by the server (the engine's
        checkout listener's poll, ``lockkeeper_core.engine``)."""
        pool = self._engine.pool
        record = fairy._connection_record
        if fairy._pool is not pool or record is None or fairy.dbapi_connection is None:
            return False
        started = record.starttime
        if started < pool._invalidate_time or started < record._soft_invalidate_time:
            return False
        if pool._recycle > -1 and time.time() - started > pool._recycle:
            return False
        return self._engine.dialect.name == "sqlite" or not connection_is_dead(
            fairy.dbapi_connection
        )

    def give_back(self, fairy: Any, *, committed: bool = False) -> None:
        """``fairy`` after a statement or a commit (no transaction open):
        kept if none is, else checked in."""
        if self._keeps and not self._idle and self._pid == os.getpid():
            self._idle.append(fairy)
        elif committed:
            fairy._close_special(transaction_reset=True)
        else:
            fairy.close()

    def close(self) -> None:
        """Check the kept connections in (those of this process)."""
        if self._pid != os.getpid():
            self._forked()
        idle, self._idle = self._idle, []
        for fairy in idle:
            fairy.close()


class RowShape:
    """The row type of one fixed statement's result and the positions of its
    instants, the only values that need converting: found once per statement,
    not column by column on every row."""

    __slots__ = ("instants", "row_type", "width")

    def __init__(self, row_type: type, instants: tuple[int, ...]) -> None:
        self.row_type = row_type
        self.instants = instants
        self.width = len(row_type._fields)  # type: ignore[attr-defined]

    def row(self, raw: Any, instant: Any) -> Any:
        if not self.instants:
            return self.row_type._make(raw)  # type: ignore[attr-defined]
        values = list(raw)
        for n in self.instants:
            if values[n] is not None:
                values[n] = instant(values[n])
        return self.row_type._make(values)  # type: ignore[attr-defined]


# timestamptz and timestamp (psycopg hands both back as datetime).
_PG_INSTANT_TYPES = frozenset({1184, 1114})


def _in_utc(value: datetime) -> datetime:
    return value.astimezone(UTC)


def _utc_row(row_type: Any, raw: Any) -> Any:
    """A driver's row as ``row_type``, its instants in UTC."""
    return row_type._make(
        value.astimezone(UTC) if isinstance(value, datetime) else value for value in raw
    )


def _sqlite_instant(value: str) -> datetime:
    return datetime.fromisoformat(value).replace(tzinfo=UTC)


# SQLite keeps an instant as naive-UTC text in SQLAlchemy's DATETIME format (always
# six fraction digits: the text orders as the instant does); these are the columns
# that hold one.
_SQLITE_TIMES = frozenset(
    {"acquired_at", "expires_at", "frozen_at", "ends_at", "places_until"}
)


def _sqlite_text(value: Any) -> Any:
    if isinstance(value, datetime):
        if value.tzinfo is not UTC:
            if value.tzinfo is None:
                raise ValueError(f"naive datetime {value!r}: pass an aware UTC instant")
            value = value.astimezone(UTC)
        # The first 26 characters: the text without its "+00:00".
        return value.isoformat(" ", "microseconds")[:26]
    return value


class DriverTransaction:
    """The statements of one ``DriverConnection.transaction``: fixed SQL on the
    driver's cursor, instants bound and read back as the dialect keeps them."""

    __slots__ = ("_connection", "_listeners", "cursor")

    def __init__(self, connection: DriverConnection, cursor) -> None:
        self._connection = connection
        self._listeners = connection.engine.dispatch.before_cursor_execute
        self.cursor = cursor

    def _prepared(self, sql: Any, params: dict[str, Any]) -> tuple[str, dict]:
        raise NotImplementedError

    def _value(self, name: str, value: Any) -> Any:
        raise NotImplementedError

    def execute(self, sql: Any, params: dict[str, Any]):
        """Run ``sql``; returns the cursor, its rows unread."""
        sql, params = self._prepared(sql, params)
        if self._listeners:
            for listener in self._listeners:
                listener(None, self.cursor, sql, params, None, False)
        try:
            self.cursor.execute(sql, params)
            return self.cursor
        except self._connection._dbapi_error as exc:
            raise self._connection._wrapped(
                exc, sql, params, invalidated=False
            ) from exc

    def scalar(self, sql: Any, params: dict[str, Any] | None = None) -> Any:
        raw = self.execute(sql, params or {}).fetchone()
        return None if raw is None else self._value("", raw[0])

    def one(self, sql: Any, params: dict[str, Any]) -> Any | None:
        """The first row (attributes by column name), or None."""
        cursor = self.execute(sql, params)
        raw = cursor.fetchone()
        if raw is None:
            return None
        names = tuple(column[0] for column in cursor.description)
        value = self._value
        return self._connection._row_type(names)._make(
            value(name, item) for name, item in zip(names, raw, strict=True)
        )

    def all(self, sql: Any, params: dict[str, Any]) -> list[Any]:
        """Every row (attributes by column name)."""
        cursor = self.execute(sql, params)
        raws = cursor.fetchall()
        names = tuple(column[0] for column in cursor.description)
        make, value = self._connection._row_type(names)._make, self._value
        return [
            make(value(name, item) for name, item in zip(names, raw, strict=True))
            for raw in raws
        ]


class SQLiteTransaction(DriverTransaction):
    """``:name`` parameters as sqlite3 takes them; instants as SQLite's text."""

    __slots__ = ()

    def _prepared(self, sql, params):
        return sql, {
            name: _sqlite_text(value) if isinstance(value, datetime) else value
            for name, value in params.items()
        }

    def _value(self, name, value):
        if value is not None and name in _SQLITE_TIMES:
            return _sqlite_instant(value)
        return value

    def one(self, sql, params):
        cursor = self.execute(sql, params)
        raw = cursor.fetchone()
        if raw is None:
            return None
        # The statements are fixed SQL text: one shape per text.
        shapes = self._connection._shapes
        shape = shapes.get(sql)
        if shape is None or shape.width != len(raw):
            names = tuple(column[0] for column in cursor.description)
            shape = shapes[sql] = RowShape(
                self._connection._row_type(names),
                tuple(n for n, name in enumerate(names) if name in _SQLITE_TIMES),
            )
        return shape.row(raw, _sqlite_instant)


class FixedSQL:
    """A statement for PyMySQL: ``%(name)s`` parameters, and the values the
    statement fixes itself (a compiled construct's literals) in ``defaults``."""

    __slots__ = ("defaults", "sql")

    def __init__(self, sql: str, defaults: dict[str, Any] | None = None) -> None:
        self.sql = sql
        self.defaults = defaults or {}

    @classmethod
    def written(cls, sql: str) -> FixedSQL:
        """From SQL written with ``:name`` parameters."""
        return cls(DriverSQL(sql).sql)

    @classmethod
    def compiled(cls, statement, dialect) -> FixedSQL:
        """From a SQLAlchemy construct, compiled once for ``dialect`` (whose
        paramstyle must be ``pyformat``)."""
        compiled = statement.compile(dialect=dialect)
        defaults = {
            name: value for name, value in compiled.params.items() if value is not None
        }
        return cls(compiled.string, defaults)


class MySQLTransaction(DriverTransaction):
    """``FixedSQL`` on PyMySQL; instants bound as naive UTC (what a MariaDB
    DATETIME holds) and read back as aware UTC."""

    __slots__ = ()

    def _prepared(self, sql, params):
        bound = dict(sql.defaults)
        for name, value in params.items():
            if isinstance(value, datetime):
                if value.tzinfo is None:
                    raise ValueError(
                        f"naive datetime {value!r}: pass an aware UTC instant"
                    )
                value = value.astimezone(UTC).replace(tzinfo=None)
            bound[name] = value
        return sql.sql, bound

    def _value(self, name, value):
        if isinstance(value, datetime):
            return value.replace(tzinfo=UTC)
        if isinstance(value, str) and name == "now":
            # A clock the caller gave (``SELECT %(now)s``) comes back as the
            # text it was sent as.
            return datetime.fromisoformat(value).replace(tzinfo=UTC)
        return value
