"""PostgreSQL: one statement per hot operation (the lock functions of the schema);
operator actions as transactions."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from sqlalchemy.exc import DBAPIError

from lockkeeper_core.driver import DriverConnection, DriverSQL
from lockkeeper_core.errors import SessionBound
from lockkeeper_core.state import Action
from lockkeeper_core.statements.common import FreezeRow, Outcome
from lockkeeper_core.statements.transaction import TransactionalStatements
from lockkeeper_core.values import Ask

# The statements live in the database as functions, each as it is now in
# ``sql/postgresql/<name>.sql`` (``routines.py``): PostgreSQL plans each once per
# connection, with or without a pooler that cannot carry prepared statements.
# ``now`` NULL: the server's clock, read after the row lock; a datetime: a
# test's fake clock.
_PG_ACQUIRE = DriverSQL(
    "SELECT * FROM lockkeeper_acquire(:resource, :owner, :token, :ttl, :actor,"
    " :max_locks, :waiter, :now)"
)
_PG_RENEW = DriverSQL(
    "SELECT * FROM lockkeeper_renew(:resource, :owner, :token, :ttl, :actor, :now)"
)
_PG_RELEASE = DriverSQL(
    "SELECT * FROM lockkeeper_release(:resource, :owner, :token, :actor, :now,"
    " :details)"
)
# A semaphore's holder or a shared grant (migration 0021): the holders path's
# plain look, decision and writes in one statement.
# The functions keep the old name of a holder, "place": only a migration renames them.
_PG_ACQUIRE_HOLDER = DriverSQL(
    "SELECT * FROM lockkeeper_acquire_place(:resource, :owner, :token, :ttl,"
    " :actor, :max_locks, :waiter, :now, :limit, :mode)"
)
# Renewing or releasing a holder, after the exclusive statement (migration 0022).
_PG_RENEW_HOLDER = DriverSQL(
    "SELECT * FROM lockkeeper_renew_place(:resource, :owner, :token, :ttl, :actor,"
    " :now)"
)
_PG_RELEASE_HOLDER = DriverSQL(
    "SELECT * FROM lockkeeper_release_place(:resource, :owner, :token, :actor,"
    " :now, :details)"
)
_PG_READ_NOW = DriverSQL("SELECT clock_timestamp() AS now")
# A set's acquire (migration 0041): every member's grant and the set's name on
# its event, or an error that leaves nothing written (LKS01: a member has no
# row yet; LKS02: a member refused).
_PG_ACQUIRE_SET = DriverSQL(
    "SELECT * FROM lockkeeper_acquire_set(CAST(:resources AS varchar[]),"
    " CAST(:limits AS integer[]), CAST(:modes AS varchar[]),"
    " CAST(:waiters AS bigint[]), :owner, :token, :ttl, :actor, :max_locks,"
    " :now, :set_id)"
)
_SET_DECIDED_AGAIN = frozenset({"LKS01", "LKS02"})
# A set's release (migration 0042): a row for each member released, its
# event naming the set its grant was made by.
_PG_RELEASE_SET = DriverSQL(
    "SELECT * FROM lockkeeper_release_set(CAST(:resources AS varchar[]),"
    " :owner, :token, :actor, :now)"
)


class PostgresStatements:
    """Single-statement acquire/renew/release; operator actions as transactions.

    The hot operations take a ``DriverConnection`` (``lockkeeper_core.driver``), not a
    SQLAlchemy connection: their SQL is fixed, so it goes to the driver's cursor.
    """

    autocommit = True
    driver_transaction = None
    # What the methods send; the benchmark's driver baseline sends the same.
    acquire_sql = _PG_ACQUIRE
    renew_sql = _PG_RENEW
    release_sql = _PG_RELEASE
    acquire_holder_sql = _PG_ACQUIRE_HOLDER
    renew_holder_sql = _PG_RENEW_HOLDER
    release_holder_sql = _PG_RELEASE_HOLDER

    def __init__(self) -> None:
        self.transactional = TransactionalStatements("postgresql")

    def _run(
        self, conn: DriverConnection, statement: DriverSQL, params: dict[str, Any]
    ) -> Outcome:
        return self._outcome(conn, conn.one(statement, params), params["now"])

    def _outcome(self, conn: DriverConnection, row: Any, now: Any) -> Outcome:
        if row is None:
            return Outcome(False, None, None, now or conn.one(_PG_READ_NOW, {}).now)
        if row.done:
            return Outcome(True, Action(row.action), row, row.now)
        freeze = (
            FreezeRow(
                row.frozen_prefix,
                row.frozen_reason,
                row.frozen_actor,
                row.frozen_at,
                row.frozen_until,
            )
            if getattr(row, "frozen_prefix", None) is not None
            else None
        )
        over_quota = bool(getattr(row, "over_quota", False))
        # A refused acquire always answers one row; fence NULL: there is no row.
        holder = row if row.fence is not None else None
        places_until = getattr(row, "places_until", None)
        return Outcome(
            False,
            None,
            holder,
            row.now,
            freeze,
            over_quota,
            bool(getattr(row, "token_ended", False)),
            held_by_holders=places_until is not None and places_until > row.now,
            limit_mismatch=getattr(row, "limit_mismatch", None),
        )

    def acquire(self, conn, ask: Ask, now, waiter=None) -> Outcome:
        return self._run(
            conn,
            self.acquire_sql,
            {
                "resource": ask.resource,
                "owner": ask.owner,
                "token": ask.token,
                "ttl": ask.ttl,
                "actor": ask.actor,
                "max_locks": ask.max_locks,
                "waiter": waiter,
                "now": now,
            },
        )

    def acquire_set(
        self,
        conn: DriverConnection,
        ordered: list[Ask],
        set_id: str,
        places: dict[str, int] | None,
        now=None,
    ) -> dict[str, Outcome] | None:
        """A set's acquire with no session in one autocommit statement
        (``lockkeeper_acquire_set``): {resource: its grant's outcome}, every
        member's event naming ``set_id``. None when a member refused or has
        no row yet: nothing was written, and the caller decides the set by
        its transaction, which names the member and why (a refusal costs
        that statement more, a grant six fewer for a set of three)."""
        ask = ordered[0]
        params = {
            "resources": [a.resource for a in ordered],
            "limits": [a.limit for a in ordered],
            "modes": [a.mode for a in ordered],
            "waiters": [(places or {}).get(a.resource) for a in ordered],
            "owner": ask.owner,
            "token": ask.token,
            "ttl": ask.ttl,
            "actor": ask.actor,
            "max_locks": ask.max_locks,
            "now": now,
            "set_id": set_id,
        }
        try:
            rows = conn.all(_PG_ACQUIRE_SET, params)
        except DBAPIError as exc:
            if getattr(exc.orig, "sqlstate", None) in _SET_DECIDED_AGAIN:
                return None
            raise
        return {row.resource: Outcome(True, Action(row.action), row, row.now)
                for row in rows}  # fmt: skip

    def release_set(
        self, conn: DriverConnection, resources: list[str], owner, token, actor, now
    ) -> dict[str, Outcome]:
        """A set's release in one autocommit statement
        (``lockkeeper_release_set``): {resource: its release's outcome} for
        each member still validly held by (``token``, ``owner``), each ended
        as ``release`` (else ``release_holder``) ends it, its event naming the
        set its grant was made by; the members not held are left out."""
        rows = conn.all(
            _PG_RELEASE_SET,
            {
                "resources": resources,
                "owner": owner,
                "token": token,
                "actor": actor,
                "now": now,
            },
        )
        return {row.resource: Outcome(True, Action(row.action), row, row.now)
                for row in rows}  # fmt: skip

    def acquire_holder(self, conn, ask: Ask, now, waiter=None) -> Outcome:
        """The holders path's decision with no session (``HoldersStatements``'
        ``peek_holder`` and ``acquire_holder``, the same answers) in one statement.

        :raise SessionBound: the caller's holder is bound to a live session.
        """
        return self._place(
            conn,
            self.acquire_holder_sql,
            {
                "resource": ask.resource,
                "owner": ask.owner,
                "token": ask.token,
                "ttl": ask.ttl,
                "actor": ask.actor,
                "max_locks": ask.max_locks,
                "waiter": waiter,
                "now": now,
                "limit": ask.limit,
                "mode": ask.mode,
            },
        )

    def renew_holder(self, conn, resource, owner, token, ttl, actor, now) -> Outcome:
        """Extend the caller's live holder (``HoldersStatements.renew_holder``'s
        answers); refused (row None) when it has none.

        :raise SessionBound: the holder is bound to a live session.
        """
        return self._place(
            conn,
            self.renew_holder_sql,
            {
                "resource": resource,
                "owner": owner,
                "token": token,
                "ttl": ttl,
                "actor": actor,
                "now": now,
            },
        )

    def release_holder(
        self, conn, resource, owner, token, actor, now, details=None
    ) -> Outcome:
        """End the caller's live holder (``HoldersStatements.release_holder``'s
        answers); refused (row None) when it has none."""
        return self._place(
            conn,
            self.release_holder_sql,
            {
                "resource": resource,
                "owner": owner,
                "token": token,
                "actor": actor,
                "now": now,
                "details": details,
            },
        )

    def _place(
        self, conn: DriverConnection, statement: DriverSQL, params: dict[str, Any]
    ) -> Outcome:
        row = conn.one(statement, params)
        if row.bound_session is not None:
            raise SessionBound(params["resource"], row.bound_session)
        return self._outcome(conn, row, params["now"])

    def renew(self, conn, resource, owner, token, ttl, actor, now) -> Outcome:
        return self._run(
            conn,
            self.renew_sql,
            {
                "resource": resource,
                "owner": owner,
                "token": token,
                "ttl": ttl,
                "actor": actor,
                "now": now,
            },
        )

    def release(
        self, conn, resource, owner, token, actor, now, details=None
    ) -> Outcome:
        return self._run(
            conn,
            self.release_sql,
            {
                "resource": resource,
                "owner": owner,
                "token": token,
                "actor": actor,
                "now": now,
                "details": details,
            },
        )


class InTransaction:
    """A ``DriverConnection``'s ``one`` on a SQLAlchemy connection, inside its
    transaction: the one-statement functions then run as steps of that
    transaction (a set's), one round trip each. Instants come back in UTC, as
    the driver path gives them."""

    def __init__(self, conn) -> None:
        self.conn = conn

    def one(self, statement, params: dict[str, Any]) -> Any:
        row = self.conn.exec_driver_sql(statement.sql, params).one_or_none()
        return None if row is None else _in_utc(row)


def _in_utc(row) -> SimpleNamespace:
    return SimpleNamespace(
        **{
            name: value.astimezone(UTC) if isinstance(value, datetime) else value
            for name, value in row._mapping.items()
        }
    )
