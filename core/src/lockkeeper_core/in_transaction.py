"""Acquire, renew and release inside the caller's own transaction
(``Embedded.in_transaction``): the worker commands, each run as a savepoint of
the caller's transaction on its connection."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, event
from sqlalchemy.exc import IntegrityError

from lockkeeper_core.commands import Commands
from lockkeeper_core.core import LockCore
from lockkeeper_core.driver import DriverSQL
from lockkeeper_core.errors import AccessRefused, InvalidInput, ServiceBusy
from lockkeeper_core.identity import Identity
from lockkeeper_core.queue import WaitQueue
from lockkeeper_core.results import AcquireResult, Lock
from lockkeeper_core.service import LockService
from lockkeeper_core.transactions import Raced, is_lost_insert


class _CallerCore:
    """The core, with every transaction of a command run as a savepoint of the
    caller's own transaction on ``conn`` (the transactional statements on
    every dialect: PostgreSQL's one-statement functions run in autocommit).

    A savepoint undoes only our part when a first insert lost a race to a
    concurrent one or the decision found the row changed (``Raced``): those
    are tried again inside it. A deadlock or a lock-wait timeout is not: on
    MariaDB it rolls back the caller's whole transaction, so it is raised for
    the caller to retry its transaction as a whole."""

    def __init__(self, base: LockCore, conn: Connection):
        self._base = base
        self._conn = conn
        # PostgreSQL's one-statement functions run as they are, in the
        # caller's transaction (``_OnConnection``); elsewhere the transactional
        # statements, on the caller's SQLAlchemy connection.
        self._one_statement = base.statements.autocommit
        if not self._one_statement:
            self.statements = base.transactional
            self.holder_statements = base.transactional

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)

    def run(self, work, *, autocommit=False, driver=False, decide=None):
        raced: Raced | None = None
        for _ in range(self._base.settings.retries + 1):
            try:
                with self._conn.begin_nested():
                    result = work(
                        _OnConnection(self._conn)
                        if autocommit and self._one_statement
                        else self._conn
                    )
                return result if decide is None else decide(result)
            except Raced as exc:
                raced = exc
            except IntegrityError as exc:
                if not is_lost_insert(exc):
                    raise
        if raced is not None and raced.answer is not None:
            return raced.answer
        raise ServiceBusy("the lock's row kept changing; try again")


class _OnConnection:
    """``DriverConnection``'s one method on the caller's connection: a
    function of the schema run inside the caller's transaction."""

    def __init__(self, conn: Connection):
        self._conn = conn

    def one(self, statement: DriverSQL, params: dict[str, Any]) -> Any | None:
        return self._conn.exec_driver_sql(statement.sql, params).first()


class _AfterCommit:
    """The waiting line's wake-up, rung once the caller's transaction has
    committed (before it, a woken waiter would find the lock still held)."""

    def __init__(self, queue: WaitQueue, conn: Connection):
        self._queue = queue
        self._conn = conn

    def notify_released(self, resource: str, waiting: int) -> None:
        if waiting > 0:
            event.listen(
                self._conn,
                "commit",
                lambda _conn: self._queue.notify_released(resource, waiting),
                once=True,
            )

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        raise InvalidInput([("wait", IN_TRANSACTION_WAIT)])


def in_transaction_commands(service: LockService, conn: Connection) -> Commands:
    """``service``'s worker commands, each run in ``conn``'s transaction."""
    return Commands(
        _CallerCore(service.core, conn),  # type: ignore[arg-type]
        _AfterCommit(service.queue, conn),  # type: ignore[arg-type]
        service.reads.holders,
    )


IN_TRANSACTION_WAIT = (
    "an acquire inside your transaction does not wait: a transaction that "
    "waits holds every lock it has taken meanwhile; acquire with wait=0 and "
    "retry the transaction, or wait outside it"
)


class InTransaction:
    """Acquire, renew and release in the caller's own transaction: the grant,
    its fence and its audit event commit with the caller's writes or vanish
    with its rollback (a fence number a rollback skips is never used again:
    fences increase, they need not be dense).

    Refused here, because they cannot be made safe: waiting (``wait`` > 0:
    the transaction would hold its locks while it waits) and a grant bound to
    a session (the session's heartbeat is not the caller's transaction).
    The caller's transaction holds the resource's row until it ends: keep it
    short, as any transaction that takes a row lock.

    On SQLite the caller's engine needs the core's setup (``engine_for``), and
    a transaction that writes is best begun ``BEGIN IMMEDIATE``
    (``engine.execution_options(sqlite_immediate=True)``), as the core's own
    are: a deferred one that turns into a writer fails at once when another
    writer went first.
    """

    def __init__(self, service: LockService, conn: Connection, identity: Identity):
        self._identity = identity
        self._commands = in_transaction_commands(service, conn)

    def _check(self, resource: str) -> None:
        if self._identity.read_only:
            raise AccessRefused("this API token is read-only")
        if not self._identity.covers(resource):
            raise AccessRefused("the resource is outside this API token's scope")

    def acquire(
        self,
        resource: str,
        owner: str,
        ttl: float | None = None,
        *,
        limit: int = 1,
        shared: bool = False,
    ) -> AcquireResult:
        """One try, no waiting: the grant (in the caller's transaction), or the
        refusal naming the holder. Raises what the API's acquire refuses with
        (``ResourceFrozen``, ``QuotaExceeded``, ``TokenEnded``, ...)."""
        self._check(resource)
        return self._commands.acquire(
            resource,
            owner,
            ttl,
            actor=self._identity.name,
            token=self._identity.name,
            max_locks=self._identity.max_locks,
            limit=limit,
            mode="shared" if shared else "exclusive",
        )

    def renew(self, resource: str, owner: str, ttl: float | None = None) -> Lock:
        self._check(resource)
        return self._commands.renew(
            resource, owner, ttl, actor=self._identity.name, token=self._identity.name
        )

    def release(self, resource: str, owner: str) -> Lock:
        self._check(resource)
        return self._commands.release(
            resource, owner, actor=self._identity.name, token=self._identity.name
        )
