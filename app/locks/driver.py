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
