"""SQLite: the transaction of ``TransactionalStatements`` as fixed SQL on the
sqlite3 connection."""

from __future__ import annotations

from typing import Any

from lockkeeper_core.statements.driver_writes import DRIVER_WRITES, DriverWrites
from lockkeeper_core.statements.transaction import TransactionalStatements

# Waiters of :resource live at :now, :waiter's own row excluded (``waiters``) and
# those ahead of it (``ahead``): see ``queue_columns``.
_SQLITE_QUEUE = """
       (SELECT count(*) FROM lock_waiters AS w
        WHERE w.resource = :resource AND w.deadline > :now
          AND (:waiter IS NULL OR w.id != :waiter)) AS waiters,
       (SELECT count(*) FROM lock_waiters AS w
        WHERE w.resource = :resource AND w.deadline > :now
          AND (:waiter IS NULL OR w.id < :waiter)) AS ahead"""
# The live locks of :quota_token, counted no further than :max_locks.
_SQLITE_LIVE = """((SELECT count(*) FROM (
        SELECT 1 FROM distributed_locks AS mine
        WHERE mine.token = :quota_token AND mine.expires_at > :now
        LIMIT :max_locks)) + (SELECT count(*) FROM (
        SELECT 1 FROM lock_holders AS mine
        WHERE mine.token = :quota_token AND mine.expires_at > :now
        LIMIT :max_locks)))"""
_SQLITE_LOCK_ROW = """SELECT l.id, l.resource, l.owner, l.token, l.fence,
       l.acquired_at, l.expires_at, l.session_id, l.holder_limit, l.places_until,
      {queue}{live}
FROM distributed_locks AS l WHERE l.resource = :resource"""
_SQLITE_COVERING = """SELECT {columns} FROM lock_freezes AS f
    WHERE f.prefix = substr(:resource, 1, length(f.prefix))
      AND (f.ends_at IS NULL OR f.ends_at > :now)"""
_SQLITE_NEXT_FENCE = (
    "UPDATE lock_fence_counter SET value = value + 1 WHERE id = 1{unless} "
    "RETURNING value"
)


_SQLITE_TOKEN_ROW = "SELECT revoked_at, expires_at FROM api_tokens WHERE name = :token"


class SQLiteStatements(DriverWrites, TransactionalStatements):
    """``TransactionalStatements``' acquire, renew and release, run by the service
    on a ``DriverTransaction`` (``lockkeeper_core.driver``): the same BEGIN IMMEDIATE
    transaction and statements, as SQL written once. Through SQLAlchemy each
    statement's execution context, cache key and result object cost about three
    quarters of an acquire+release cycle's CPU. Operator actions stay on
    SQLAlchemy connections (``transactional``).
    """

    driver_transaction = "BEGIN IMMEDIATE"
    _writes = DRIVER_WRITES

    def __init__(self) -> None:
        super().__init__("sqlite")
        self.transactional = TransactionalStatements("sqlite")
        # Read by ``clock_after_lock`` and ``_next_fence`` through conn.scalar.
        self._live_count = "SELECT " + _SQLITE_LIVE
        self._next_fence_statement = _SQLITE_NEXT_FENCE.format(unless="")
        self._bound_statement = (
            "SELECT id FROM lock_sessions WHERE id = :id AND expires_at = :expires_at"
            " AND owner = :owner AND token = :token"
        )
        self._next_fence_unless_frozen = _SQLITE_NEXT_FENCE.format(
            unless=" AND NOT EXISTS (" + _SQLITE_COVERING.format(columns="1") + ")"
        )
        self._sqlite_lock_row = {
            counting: _SQLITE_LOCK_ROW.format(
                queue=_SQLITE_QUEUE,
                live=",\n       " + _SQLITE_LIVE + " AS live" if counting else "",
            )
            for counting in (False, True)
        }
        self._sqlite_freeze_row = (
            _SQLITE_COVERING.format(
                columns="f.id, f.prefix, f.reason, f.actor, f.frozen_at, f.ends_at"
            )
            + " ORDER BY f.prefix LIMIT 1"
        )

    def lock_row(
        self, conn, resource, now, waiter=None, *, quota_token=None, max_locks=None
    ):
        counting = bool(max_locks) and quota_token is not None
        params: dict[str, Any] = {"resource": resource, "waiter": waiter, "now": now}
        if counting:
            params.update(quota_token=quota_token, max_locks=max_locks)
        return conn.one(self._sqlite_lock_row[counting], params)

    def freeze_of(self, conn, resource, now):
        return conn.one(self._sqlite_freeze_row, {"resource": resource, "now": now})

    def _token_row(self, conn, token, *, exclusive):
        # BEGIN IMMEDIATE already made this the only writer.
        return conn.one(_SQLITE_TOKEN_ROW, {"token": token})
