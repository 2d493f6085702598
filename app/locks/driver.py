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
    """A statement written with ``:name`` parameters, in the driver's paramstyle."""

    __slots__ = ("sql",)

    def __init__(self, sql: str) -> None:
        # psycopg and PyMySQL both take %(name)s; a literal % must be doubled.
        self.sql = _NAMED_PARAMETER.sub(r"%(\1)s", sql.replace("%", "%%"))


class DriverConnection:
    """Runs one statement at a time on the autocommit engine's pool."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.dialect = engine.dialect
        self._dbapi_error = engine.dialect.loaded_dbapi.Error
        self._row_types: dict[tuple[str, ...], type] = {}

    def one(self, statement: DriverSQL, params: dict[str, Any]) -> Any | None:
        """The first row ``statement`` returns (attributes by column name), or None."""
        sql = statement.sql
        try:
            fairy = self.engine.raw_connection()
        except self._dbapi_error as exc:  # the server is down: not a 500
            raise self._wrapped(exc, sql, params, invalidated=False) from exc
        cursor = None
        try:
            cursor = fairy.dbapi_connection.cursor()
            listeners = self.engine.dispatch.before_cursor_execute
            if listeners:
                for listener in listeners:
                    listener(None, cursor, sql, params, None, False)
            cursor.execute(sql, params)
            if cursor.description is None:  # no result set (a plain write)
                return None
            raw = cursor.fetchone()
            if raw is None:
                return None
            names = tuple(column[0] for column in cursor.description)
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
