"""MariaDB/MySQL: the transaction of ``TransactionalStatements`` as compiled or
written-once SQL on PyMySQL's connection."""

from __future__ import annotations

from typing import Any

from lockkeeper_core.driver import FixedSQL
from lockkeeper_core.statements.common import Clock
from lockkeeper_core.statements.driver_writes import (
    DRIVER_WRITES,
    UPSERT_LOCK_SQL,
    DriverWrites,
)
from lockkeeper_core.statements.transaction import TransactionalStatements

_TOKEN_GRANT = FixedSQL.written(
    "CALL lockkeeper_token_grant(:token, :resource, :max_locks, :shared, :fence)"
)
# How many tokens near their quota a process remembers (``_near_quota``); past
# that it forgets them all, and each one's next grant learns again.
_NEAR_QUOTA_KEPT = 1024


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
        # Tokens whose last grant here found them near their quota: their next
        # grant asks for the token's row alone (``lockkeeper_token_grant``).
        # Only a hint: the count after the lock decides the quota either way,
        # and a shared lock that finds the token near is refused and retried.
        self._near_quota: set[str] = set()

    def _picks_token_lock_in_call(self, now) -> bool:
        # The server's clock: the hot path, whose call locks the token's row.
        return now is None

    def _token_then_clock(self, conn, token, now, quota, *, resource):
        """The token's row, then the clock, freeze, quota count and fence, in
        one round trip: ``lockkeeper_token_grant`` (migration 0044). With a
        clock given (tests), the statements one by one."""
        if not quota.in_call:
            return super()._token_then_clock(conn, token, now, quota, resource=resource)
        row = self._token_call(conn, token, resource, quota.max_locks, fence=True)
        clock = Clock(row.now, row.fence, bool(row.frozen), bool(row.over_quota))
        return quota._replace(
            row=row if row.found else None, far=bool(row.far), clock=clock
        )

    def _token_then_count(self, conn, token, now, quota):
        """A take-over's token row and quota count: the same call, drawing no
        fence (the take-over drew its own)."""
        if not quota.in_call:
            return super()._token_then_count(conn, token, now, quota)
        row = self._token_call(conn, token, None, quota.max_locks, fence=False)
        return quota._replace(
            row=row if row.found else None,
            far=bool(row.far),
            over_quota=bool(row.over_quota),
        )

    def _token_call(self, conn, token, resource, max_locks, *, fence):
        """``lockkeeper_token_grant``: the token's row locked shared unless its
        last grant here found it near its quota, and what the count after
        that lock finds kept for its next grant."""
        near_quota = self._near_quota
        row = conn.one(
            _TOKEN_GRANT,
            {
                "token": token,
                "resource": resource,
                "max_locks": max_locks or None,
                "shared": token not in near_quota,
                "fence": fence,
            },
        )
        if row.near:
            if len(near_quota) >= _NEAR_QUOTA_KEPT:
                near_quota.clear()
            near_quota.add(token)
        else:
            near_quota.discard(token)
        return row

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
