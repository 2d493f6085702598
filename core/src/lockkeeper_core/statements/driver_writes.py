"""The hot path's writes as SQL written once, which the drivers of SQLite and
MariaDB both take (``DriverWrites``): through SQLAlchemy each statement cost
more Python than the round trip it makes."""

from __future__ import annotations

from typing import Any

from lockkeeper_core.statements.common import LOST_FIRST_INSERT
from lockkeeper_core.transactions import Raced

_INSERT_LOCK_SQL = """INSERT INTO distributed_locks
    (resource, owner, token, fence, acquired_at, expires_at)
VALUES (:resource, :owner, :token, :fence, :acquired_at, :expires_at)"""
# MariaDB: an upsert that changes nothing when the row is there (its insert id
# is then 0): see ``insert_lock_row``.
UPSERT_LOCK_SQL = _INSERT_LOCK_SQL + "\nON DUPLICATE KEY UPDATE id = id"
_UPDATE_LOCK_SQL = """UPDATE distributed_locks
SET owner = :owner, token = :token, fence = :fence, acquired_at = :acquired_at,
    expires_at = :expires_at
WHERE id = :id"""
# A new tenure (not a re-acquire): see ``TransactionalStatements._write_grant``.
_NEW_TENURE_SQL = """UPDATE distributed_locks
SET owner = :owner, token = :token, fence = :fence, acquired_at = :acquired_at,
    expires_at = :expires_at, holder_limit = 1, places_until = NULL,
    session_id = NULL
WHERE id = :id"""
_SET_EXPIRY_SQL = "UPDATE distributed_locks SET expires_at = :expires_at WHERE id = :id"
_FREE_SQL = (
    "UPDATE distributed_locks SET owner = NULL, token = NULL, "
    "expires_at = :expires_at WHERE id = :id"
)
_FREE_BOUND_SQL = (
    "UPDATE distributed_locks SET owner = NULL, token = NULL, session_id = NULL, "
    "expires_at = :expires_at WHERE id = :id"
)
_DEQUEUE_SQL = "DELETE FROM lock_waiters WHERE id = :id"
# A new exclusive tenure over holders that ran out: see ``_clear_holders``.
_HOLDERS_OF_SQL = """SELECT id, resource, owner, token, mode, fence, acquired_at,
       expires_at, session_id
FROM lock_holders WHERE resource = :resource ORDER BY expires_at, id"""
_DELETE_HOLDERS_SQL = "DELETE FROM lock_holders WHERE resource = :resource"
_INSERT_EVENT_SQL = """INSERT INTO lock_events
    (resource, action, owner, previous_owner, token, fence, acquired_at,
     expires_at, actor, reason, occurred_at, mode, details)
VALUES (:resource, :action, :owner, :previous_owner, :token, :fence, :acquired_at,
        :expires_at, :actor, :reason, :occurred_at, :mode, :details)"""
# The hot path's writes: SQL that both SQLite and MariaDB take (``DriverWrites``).
DRIVER_WRITES = {
    "insert_lock": _INSERT_LOCK_SQL,
    "update_lock": _UPDATE_LOCK_SQL,
    "new_tenure": _NEW_TENURE_SQL,
    "set_expiry": _SET_EXPIRY_SQL,
    "free": _FREE_SQL,
    "free_bound": _FREE_BOUND_SQL,
    "dequeue": _DEQUEUE_SQL,
    "holders_of": _HOLDERS_OF_SQL,
    "delete_holders": _DELETE_HOLDERS_SQL,
    "insert_event": _INSERT_EVENT_SQL,
}


class DriverWrites:
    """The hot path's writes as SQL written once, which SQLite and MariaDB both
    take; ``_writes`` holds it in the form the dialect's ``DriverTransaction``
    runs (``:name`` text for sqlite3, ``FixedSQL`` for PyMySQL)."""

    _writes: dict[str, Any]

    def _write_grant(self, conn, row, resource, values, *, new_tenure=True) -> None:
        if row is None:
            made = conn.execute(
                self._writes["insert_lock"], {"resource": resource, **values}
            ).lastrowid
            if not made:
                # MariaDB's upsert found the row a concurrent first grant made.
                raise Raced(LOST_FIRST_INSERT)
        else:
            # A new tenure resets what holders and sessions left on the row; a row
            # they never touched (the exclusive lock's usual case) needs only the
            # plain update, which SQLite runs measurably faster.
            name = "new_tenure" if new_tenure and _leaves_traces(row) else "update_lock"
            conn.execute(self._writes[name], {"id": row.id, **values})

    def _write_expiry(self, conn, row, expires_at) -> None:
        conn.execute(
            self._writes["set_expiry"], {"id": row.id, "expires_at": expires_at}
        )

    def _write_free(self, conn, row, now) -> None:
        name = "free" if row.session_id is None else "free_bound"
        conn.execute(self._writes[name], {"id": row.id, "expires_at": now})

    def _dequeue(self, conn, waiter) -> None:
        conn.execute(self._writes["dequeue"], {"id": waiter})

    def _holders_to_clear(self, conn, resource) -> list[Any]:
        return conn.all(self._writes["holders_of"], {"resource": resource})

    def _delete_holders(self, conn, resource) -> None:
        conn.execute(self._writes["delete_holders"], {"resource": resource})

    def _insert_event(self, conn, params) -> None:
        conn.execute(self._writes["insert_event"], params)


def _leaves_traces(row) -> bool:
    """Whether ``row`` carries a semaphore's limit, holders or a session that a
    new exclusive tenure must clear."""
    return (
        row.holder_limit != 1
        or row.places_until is not None
        or row.session_id is not None
    )
