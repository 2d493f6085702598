"""The one place the hot path talks to the DB-API driver itself.

PostgreSQL's acquire, renew and release are each one statement whose SQL never
changes. Sent through SQLAlchemy's ``Connection.execute`` each one paid for an
execution context, a result object with its column metadata and type processors,
and the connection's isolation-level set/reset on every checkout: about as much
CPU as the rest of the request. Here a pooled connection of the autocommit engine
(``app.database.autocommit``: always in autocommit, so nothing to reset on checkin)
runs the statement on a plain cursor and the one row comes back as a named tuple
with its instants in UTC.

What SQLAlchemy gave is kept: the pool (and pool events), errors wrapped as
``sqlalchemy.exc.DBAPIError`` subclasses (``IntegrityError`` stays retryable), a
dead connection invalidated with its pool and ``connection_invalidated`` set so
the service retries once, and ``before_cursor_execute`` listeners on the engine
see every statement (``conn`` and ``context`` are None), so statement counters
keep counting.

On psycopg the statement goes through a ``RawCursor`` with ``$n`` placeholders:
psycopg re-parses a ``%(name)s`` query longer than 4 KB on every execution (its
parse cache skips long ones, and the acquire CTE is longer), and building
``cursor.description`` makes an object per column. Together they were about a
fifth of the seam's CPU.
"""

from __future__ import annotations

import re
from collections import namedtuple
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from app.database import server_gone

_NAMED_PARAMETER = re.compile(r"(?<![:\w]):(\w+)")


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
        self._raw_cursor = None
        self._tuples_ok = None
        if self.dialect.driver == "psycopg":
            import psycopg

            self._raw_cursor = psycopg.RawCursor
            self._tuples_ok = psycopg.pq.ExecStatus.TUPLES_OK

    def one(self, statement: DriverSQL, params: dict[str, Any]) -> Any | None:
        """The first row ``statement`` returns (attributes by column name), or None."""
        sql = statement.sql
        try:
            fairy = self.engine.raw_connection()
        except self._dbapi_error as exc:  # the server is down: not a 500
            raise self._wrapped(exc, sql, params, invalidated=False) from exc
        cursor = None
        try:
            raw_cursor = self._raw_cursor
            dbapi_connection = fairy.dbapi_connection
            if raw_cursor is not None:
                cursor = raw_cursor(dbapi_connection)
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
                result = cursor.pgresult
                if result is None or result.status != self._tuples_ok:
                    return None  # no result set (a plain write)
                names = tuple(result.fname(n).decode() for n in range(result.nfields))
            else:
                cursor.execute(sql, params)
                description = cursor.description
                if description is None:  # no result set (a plain write)
                    return None
                names = tuple(column[0] for column in description)
            raw = cursor.fetchone()
            if raw is None:
                return None
            return self._row_type(names)._make(
                value.astimezone(UTC) if isinstance(value, datetime) else value
                for value in raw
            )
        except self._dbapi_error as exc:
            # server_gone: a standby or a server shutting down (a failover).
            disconnect = server_gone(exc) or self.dialect.is_disconnect(
                exc, fairy.dbapi_connection, cursor
            )
            if disconnect:
                fairy.invalidate(exc)
                self.engine.pool.dispose()  # the others died with the server too
            raise self._wrapped(exc, sql, params, invalidated=disconnect) from exc
        finally:
            if cursor is not None:
                try:
                    cursor.close()
                except self._dbapi_error:
                    pass
            fairy.close()

    @contextmanager
    def transaction(self, begin: str) -> Iterator[DriverTransaction]:
        """SQLite: ``begin`` (``BEGIN IMMEDIATE``), the statements, COMMIT on one
        pooled connection; any error rolls back. Engine ``commit`` listeners hear
        the commit (``conn`` None)."""
        try:
            fairy = self.engine.raw_connection()
        except self._dbapi_error as exc:
            raise self._wrapped(exc, begin, {}, invalidated=False) from exc
        try:
            dbapi_connection = fairy.dbapi_connection
            transaction = DriverTransaction(self, dbapi_connection.cursor())
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
            for listener in self.engine.dispatch.commit:
                listener(None)
        except self._dbapi_error as exc:
            raise self._wrapped(exc, begin, {}, invalidated=False) from exc
        finally:
            fairy.close()

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


# SQLite keeps an instant as naive-UTC text in SQLAlchemy's DATETIME format (always
# six fraction digits: the text orders as the instant does); these are the columns
# that hold one.
_SQLITE_TIMES = frozenset({"acquired_at", "expires_at", "frozen_at", "ends_at"})


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
    """The statements of one ``DriverConnection.transaction`` (SQLite): fixed SQL
    with ``:name`` parameters on the sqlite3 cursor, datetimes bound as SQLite's
    text and read back as aware UTC instants."""

    __slots__ = ("_connection", "_listeners", "cursor")

    def __init__(self, connection: DriverConnection, cursor) -> None:
        self._connection = connection
        self._listeners = connection.engine.dispatch.before_cursor_execute
        self.cursor = cursor

    def execute(self, sql: str, params: dict[str, Any]):
        """Run ``sql``; returns the cursor, its rows unread."""
        params = {name: _sqlite_text(value) for name, value in params.items()}
        if self._listeners:
            for listener in self._listeners:
                listener(None, self.cursor, sql, params, None, False)
        try:
            return self.cursor.execute(sql, params)
        except self._connection._dbapi_error as exc:
            raise self._connection._wrapped(
                exc, sql, params, invalidated=False
            ) from exc

    def scalar(self, sql: str, params: dict[str, Any] | None = None) -> Any:
        raw = self.execute(sql, params or {}).fetchone()
        return None if raw is None else raw[0]

    def one(self, sql: str, params: dict[str, Any]) -> Any | None:
        """The first row (attributes by column name), or None."""
        cursor = self.execute(sql, params)
        raw = cursor.fetchone()
        if raw is None:
            return None
        names = tuple(column[0] for column in cursor.description)
        return self._connection._row_type(names)._make(
            datetime.fromisoformat(value).replace(tzinfo=UTC)
            if value is not None and name in _SQLITE_TIMES
            else value
            for name, value in zip(names, raw, strict=True)
        )
