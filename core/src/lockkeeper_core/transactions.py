"""The transaction runner: one bound and one backoff for every error a retry fixes.

Each lock operation is one transaction (or one autocommit statement) followed by
a decision on the row it returned. The runner repeats the pair, up to
``retries + 1`` tries in all whatever mix of causes, when

- the database aborted the transaction to break a deadlock or a serialization
  conflict, or a row-lock wait timed out (PostgreSQL 40P01/40001, MariaDB
  1213/1205): the next try usually goes through;
- its first insert of a resource lost to a concurrent one (a unique violation:
  PostgreSQL 23505, MariaDB 1062, SQLite's UNIQUE/PRIMARY KEY): the next try sees
  the winner's row and decides against it;
- the decision found the row changed since the statement read it (``decide``
  raised ``Raced``): the next try decides on the new row;
- the first try found its pooled connection dead (a database restart): the pool
  is invalidated, the next try gets a fresh connection. Only on the first try:
  a database that stays down answers 503 at once, not after the backoff.

Before each retry it waits a random time in ``[0, BASE_WAIT * 2**(n - 1)]`` after
the n-th try, capped at ``MAX_WAIT`` (full jitter): transactions that collided do
not collide again in step. When the tries run out, ``ServiceBusy`` (503) chained
to the last error, or the answer the last ``Raced`` offered.

SQLite's writer lock still taken when its ``busy_timeout`` ran out is
``ServiceBusy`` at once, not retried: the writers ahead of it kept the database
for that long, and a retry would wait as long again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from tenacity import (
    RetryCallState,
    Retrying,
    stop_after_attempt,
    wait_random_exponential,
)

from lockkeeper_core.errors import ServiceBusy

T = TypeVar("T")

# PostgreSQL deadlock / serialization failure; MariaDB deadlock / lock wait timeout.
CONFLICT_SQLSTATES = frozenset({"40P01", "40001"})
CONFLICT_MYSQL_ERRNOS = frozenset({1213, 1205})
# A unique key violated: the resource's row (or a freeze's prefix) exists after all.
UNIQUE_SQLSTATE = "23505"
MYSQL_DUPLICATE_KEY = 1062
SQLITE_UNIQUE = frozenset({"SQLITE_CONSTRAINT_UNIQUE", "SQLITE_CONSTRAINT_PRIMARYKEY"})

BASE_WAIT = 0.002
MAX_WAIT = 0.1


class Raced(Exception):
    """The row changed between the statement and the decision on it.

    ``answer``: what the operation returns if every try races (None: it raises
    ``ServiceBusy`` with this exception's message).
    """

    def __init__(self, message: str, answer: Any = None):
        super().__init__(message)
        self.answer = answer


def _mysql_errno(orig: BaseException | None) -> int | None:
    args = getattr(orig, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def is_conflict(exc: BaseException) -> bool:
    """A deadlock, serialization failure or lock-wait timeout."""
    if not isinstance(exc, DBAPIError):
        return False
    orig = exc.orig
    return (
        getattr(orig, "sqlstate", None) in CONFLICT_SQLSTATES
        or _mysql_errno(orig) in CONFLICT_MYSQL_ERRNOS
    )


def is_lost_insert(exc: BaseException) -> bool:
    """A unique violation: a concurrent insert of the same key won."""
    if not isinstance(exc, IntegrityError):
        return False
    orig = exc.orig
    return (
        getattr(orig, "sqlstate", None) == UNIQUE_SQLSTATE
        or _mysql_errno(orig) == MYSQL_DUPLICATE_KEY
        or getattr(orig, "sqlite_errorname", None) in SQLITE_UNIQUE
    )


def is_busy(exc: BaseException) -> bool:
    """SQLite's writer lock stayed taken for its whole ``busy_timeout``: other
    writers kept the database, which is overloaded. Not retried: a retry
    would wait as long again behind the same queue."""
    return isinstance(exc, OperationalError) and (
        getattr(exc.orig, "sqlite_errorname", None) == "SQLITE_BUSY"
    )


BUSY = "the database stayed locked by other writers; try again"


def retryable(exc: BaseException | None, *, first_try: bool) -> bool:
    if exc is None:
        return False
    if isinstance(exc, Raced) or is_conflict(exc) or is_lost_insert(exc):
        return True
    return first_try and isinstance(exc, DBAPIError) and exc.connection_invalidated


def _retry(state: RetryCallState) -> bool:
    return retryable(state.outcome.exception(), first_try=state.attempt_number == 1)


def _gave_up(state: RetryCallState) -> Any:
    last = state.outcome.exception()
    if isinstance(last, Raced):
        if last.answer is not None:
            return last.answer
        raise ServiceBusy(str(last)) from last
    raise ServiceBusy("the database kept aborting the transaction; try again") from last


class TransactionRunner:
    """Calls a try until it succeeds, fails for good, or ``attempts`` are used."""

    def __init__(
        self,
        retries: int,
        *,
        sleep: Callable[[float], None] = time.sleep,
        base_wait: float = BASE_WAIT,
        max_wait: float = MAX_WAIT,
    ):
        self.attempts = retries + 1
        self._retrying = Retrying(
            stop=stop_after_attempt(self.attempts),
            wait=wait_random_exponential(multiplier=base_wait, max=max_wait),
            retry=_retry,
            sleep=sleep,
            retry_error_callback=_gave_up,
        )

    def __call__(self, attempt: Callable[[], T]) -> T:
        # The first try is a plain call: tenacity's bookkeeping costs tens of
        # microseconds a call, a tenth of an acquire, and almost every operation
        # succeeds at once. A failed first try is replayed to the Retrying as
        # its first attempt, so the bound and the rules are the same for it.
        try:
            return attempt()
        except BaseException as exc:  # noqa: BLE001 - the Retrying judges it
            if is_busy(exc):
                raise ServiceBusy(BUSY) from exc
            first: BaseException | None = exc

        def replay() -> T:
            nonlocal first
            if first is not None:
                failed, first = first, None
                raise failed
            return attempt()

        try:
            return self._retrying(replay)
        except OperationalError as exc:
            if is_busy(exc):
                raise ServiceBusy(BUSY) from exc
            raise
