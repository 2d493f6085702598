"""MariaDB/MySQL: the transaction of ``TransactionalStatements`` as compiled or
written-once SQL on PyMySQL's connection."""

from __future__ import annotations

from typing import Any

from lockkeeper_core.driver import FixedSQL
from lockkeeper_core.statements.driver_writes import (
    DRIVER_WRITES,
    UPSERT_LOCK_SQL,
    DriverWrites,
)
from lockkeeper_core.statements.transaction import TransactionalStatements


class MariaDBStatements(DriverWrites, TransactionalStatements):
    """``TransactionalStatements``' acquire, renew and release on a
    ``DriverTransaction`` over PyMySQL, as ``SQLiteStatements`` does for SQLite:
    the same transaction and statements, each compiled once (the reads, from the
    same constructs, on first use) or written once (the writes, ``DriverWrites``).
    Through SQLAlchemy each of the 4–6 statements per operation cost 80–100 µs
    of Python for a round trip PyMySQL makes in about 15. Operator actions stay
    on SQLAlchemy connections (``transactional``).
    """

    # PyMySQL opens the transaction with the first statement; no BEGIN is sent.
    driver_transaction = ""
    # A first grant's insert is an upsert (``insert_lock_row`` says why).
    _writes = {
        name: FixedSQL.written(sql)
        for name, sql in {**DRIVER_WRITES, "insert_lock": UPSERT_LOCK_SQL}.items()
    }

    def __init__(self, dialect_name: str = "mariadb") -> None:
        super().__init__(dialect_name)
        self.transactional = TransactionalStatements(dialect_name)
        self._dialect = _pyformat_mariadb_dialect()
        self._fixed_reads: dict[Any, FixedSQL] = {}

    def _row(self, conn, statement, params):
        return conn.one(self._compiled(statement), params)

    def _scalar(self, conn, statement, params=None):
        return conn.scalar(self._compiled(statement), params)

    def _compiled(self, statement) -> FixedSQL:
        """``statement`` (one of the prebuilt reads) as compiled SQL, once."""
        fixed = self._fixed_reads.get(statement)
        if fixed is None:
            fixed = self._fixed_reads[statement] = FixedSQL.compiled(
                statement, self._dialect
            )
        return fixed


def _pyformat_mariadb_dialect():
    """The MariaDB dialect of PyMySQL with ``%(name)s`` parameters, for
    compiling the hot reads once (no server is asked: 10.3 is the oldest
    supported, the first with sequences)."""
    from sqlalchemy.dialects.mysql.mariadb import loader

    dialect = loader("pymysql")(paramstyle="pyformat")
    dialect.server_version_info = (10, 3)
    dialect.supports_sequences = True
    return dialect
