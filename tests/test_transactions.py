"""The transaction runner, driven by fake connections that raise what PostgreSQL,
MariaDB and SQLite raise: which errors are retried, how many tries, the backoff
between them, and what the caller gets when the tries run out."""

from __future__ import annotations

import sqlite3
from types import SimpleNamespace

import pymysql
import pytest
from lockkeeper_core.errors import LockNotFound, ServiceBusy
from lockkeeper_core.statements.common import Outcome
from lockkeeper_core.transactions import BASE_WAIT, MAX_WAIT, Raced, TransactionRunner
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError, OperationalError
from tenacity import wait as tenacity_wait


class PgError(Exception):
    """What psycopg raises: the SQLSTATE is an attribute."""

    def __init__(self, sqlstate: str):
        super().__init__(f"SQLSTATE {sqlstate}")
        self.sqlstate = sqlstate


def sqlite_unique_violation() -> sqlite3.IntegrityError:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (resource TEXT PRIMARY KEY, owner TEXT NOT NULL)")
    conn.execute("INSERT INTO t VALUES ('a', 'w')")
    try:
        conn.execute("INSERT INTO t VALUES ('a', 'w')")
    except sqlite3.IntegrityError as exc:
        return exc
    finally:
        conn.close()
    raise AssertionError("no violation")


def sqlite_not_null_violation() -> sqlite3.IntegrityError:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (owner TEXT NOT NULL)")
    try:
        conn.execute("INSERT INTO t VALUES (NULL)")
    except sqlite3.IntegrityError as exc:
        return exc
    finally:
        conn.close()
    raise AssertionError("no violation")


def deadlock_pg():
    return OperationalError("UPDATE", {}, PgError("40P01"))


def serialization_pg():
    return OperationalError("UPDATE", {}, PgError("40001"))


def deadlock_mariadb():
    return OperationalError("UPDATE", {}, pymysql.err.OperationalError(1213, "x"))


def lock_wait_mariadb():
    return OperationalError("UPDATE", {}, pymysql.err.OperationalError(1205, "x"))


def lost_insert_pg():
    return IntegrityError("INSERT", {}, PgError("23505"))


def lost_insert_mariadb():
    return IntegrityError("INSERT", {}, pymysql.err.IntegrityError(1062, "dup"))


def lost_insert_sqlite():
    return IntegrityError("INSERT", {}, sqlite_unique_violation())


RETRIED = [
    deadlock_pg,
    serialization_pg,
    deadlock_mariadb,
    lock_wait_mariadb,
    lost_insert_pg,
    lost_insert_mariadb,
    lost_insert_sqlite,
]


class FakeConnection:
    """Raises the queued errors, one per execute, then answers ``result``."""

    def __init__(self, *errors: BaseException, result: object = "row"):
        self.errors = list(errors)
        self.result = result
        self.executed = 0

    def execute(self) -> object:
        self.executed += 1
        if self.errors:
            raise self.errors.pop(0)
        return self.result


@pytest.fixture
def waits(monkeypatch) -> list[float]:
    """The runner's sleeps; the jitter draws its upper bound, so the schedule is
    exact."""
    monkeypatch.setattr(tenacity_wait.random, "uniform", lambda low, high: high)
    return []


def runner(waits: list[float], retries: int = 5) -> TransactionRunner:
    return TransactionRunner(retries, sleep=waits.append)


@pytest.mark.parametrize("error", RETRIED, ids=lambda e: e.__name__)
def test_a_retryable_error_is_retried_with_growing_backoff(error, waits):
    conn = FakeConnection(error(), error(), error())
    assert runner(waits)(conn.execute) == "row"
    assert conn.executed == 4
    assert waits == [BASE_WAIT, 2 * BASE_WAIT, 4 * BASE_WAIT]


@pytest.mark.parametrize("error", RETRIED, ids=lambda e: e.__name__)
def test_the_tries_are_bounded_and_the_caller_gets_a_503(error, waits):
    errors = [error() for _ in range(10)]
    conn = FakeConnection(*errors)
    with pytest.raises(ServiceBusy) as raised:
        runner(waits, retries=5)(conn.execute)
    assert conn.executed == 6
    assert raised.value.__cause__ is errors[5]
    assert waits == [BASE_WAIT * 2**n for n in range(5)]


def test_mixed_causes_share_one_bound(waits):
    conn = FakeConnection(
        deadlock_pg(),
        lost_insert_pg(),
        Raced("changed"),
        lock_wait_mariadb(),
        lost_insert_mariadb(),
        deadlock_mariadb(),
    )
    with pytest.raises(ServiceBusy):
        runner(waits, retries=5)(conn.execute)
    assert conn.executed == 6


def test_the_backoff_is_capped(waits):
    conn = FakeConnection(*[deadlock_pg() for _ in range(12)])
    with pytest.raises(ServiceBusy):
        runner(waits, retries=11)(conn.execute)
    assert max(waits) == MAX_WAIT
    assert waits[-1] == MAX_WAIT


def test_the_backoff_is_jittered_from_zero(monkeypatch):
    drawn: list[tuple[float, float]] = []

    def uniform(low: float, high: float) -> float:
        drawn.append((low, high))
        return low

    monkeypatch.setattr(tenacity_wait.random, "uniform", uniform)
    waits: list[float] = []
    conn = FakeConnection(deadlock_pg(), deadlock_pg())
    assert TransactionRunner(5, sleep=waits.append)(conn.execute) == "row"
    assert drawn == [(0, BASE_WAIT), (0, 2 * BASE_WAIT)]
    assert waits == [0, 0]


@pytest.mark.parametrize(
    "error",
    [
        lambda: OperationalError("SELECT", {}, PgError("57P01")),  # admin shutdown
        lambda: OperationalError("SELECT", {}, pymysql.err.OperationalError(2013, "")),
        lambda: IntegrityError("INSERT", {}, PgError("23502")),  # not null
        lambda: IntegrityError("INSERT", {}, pymysql.err.IntegrityError(1048, "")),
        lambda: IntegrityError("INSERT", {}, sqlite_not_null_violation()),
        lambda: LockNotFound("job"),
        lambda: ValueError("a bug"),
    ],
)
def test_other_errors_are_raised_at_once(error, waits):
    failure = error()
    conn = FakeConnection(failure)
    with pytest.raises(type(failure)) as raised:
        runner(waits)(conn.execute)
    assert raised.value is failure
    assert conn.executed == 1
    assert waits == []


def sqlite_busy(path) -> OperationalError:
    """What SQLite raises when another connection kept its writer lock for the
    whole busy timeout (here none)."""
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    waiter = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        waiter.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as exc:
        return OperationalError("BEGIN IMMEDIATE", {}, exc)
    finally:
        waiter.close()
        holder.close()
    raise AssertionError("not busy")


def test_sqlite_busy_past_its_timeout_is_a_503_at_once(waits, tmp_path):
    """The writers ahead kept the database for the whole busy timeout: a retry
    would wait as long again, so the caller is told at once."""
    busy = sqlite_busy(tmp_path / "busy.sqlite3")
    conn = FakeConnection(busy)
    with pytest.raises(ServiceBusy, match="locked by other writers") as raised:
        runner(waits)(conn.execute)
    assert raised.value.__cause__ is busy
    assert conn.executed == 1
    assert waits == []


def test_sqlite_busy_on_a_retry_is_a_503_too(waits, tmp_path):
    busy = sqlite_busy(tmp_path / "busy.sqlite3")
    conn = FakeConnection(lost_insert_sqlite(), busy)
    with pytest.raises(ServiceBusy, match="locked by other writers"):
        runner(waits)(conn.execute)
    assert conn.executed == 2


def invalidated() -> OperationalError:
    return OperationalError("SELECT", {}, PgError("57P01"), connection_invalidated=True)


def test_a_dead_pooled_connection_is_retried_once(waits):
    conn = FakeConnection(invalidated())
    assert runner(waits)(conn.execute) == "row"
    assert conn.executed == 2


def test_a_database_that_stays_down_fails_on_the_second_try(waits):
    second = invalidated()
    conn = FakeConnection(invalidated(), second)
    with pytest.raises(OperationalError) as raised:
        runner(waits)(conn.execute)
    assert raised.value is second
    assert conn.executed == 2


def test_a_race_that_keeps_losing_returns_its_answer(waits):
    refused = SimpleNamespace(acquired=False)
    conn = FakeConnection(*[Raced("changed", refused) for _ in range(6)])
    assert runner(waits)(conn.execute) is refused
    assert conn.executed == 6


def test_a_race_without_an_answer_is_a_503_with_its_message(waits):
    conn = FakeConnection(*[Raced("release of 'job' kept racing") for _ in range(6)])
    with pytest.raises(ServiceBusy, match="release of 'job' kept racing"):
        runner(waits)(conn.execute)


def test_no_retries_means_one_try(waits):
    conn = FakeConnection(deadlock_pg())
    with pytest.raises(ServiceBusy):
        runner(waits, retries=0)(conn.execute)
    assert conn.executed == 1
    assert waits == []


# -- through the service ------------------------------------------------------


@pytest.fixture
def quick_service(service, waits):
    service.core.runner = TransactionRunner(
        service.settings.retries, sleep=waits.append
    )
    return service


def test_the_service_retries_its_transactions(quick_service, waits):
    failures = [deadlock_mariadb(), lost_insert_pg()]

    def work(conn):
        if failures:
            raise failures.pop(0)
        return conn.scalar(text("SELECT 1"))

    assert quick_service.run_transaction(work) == 1
    assert waits == [BASE_WAIT, 2 * BASE_WAIT]


def test_an_acquire_that_keeps_racing_is_refused_after_the_bound(
    quick_service, monkeypatch
):
    calls = []

    def acquire(conn, ask, *args):
        calls.append(ask.resource)
        # Free, no waiters, not held: the row changed between statement and decision.
        return Outcome(done=False, action=None, row=None, now=quick_service.now())

    monkeypatch.setattr(quick_service.statements, "acquire", acquire)
    result = quick_service.acquire("job", "w-1", ttl=30)
    assert not result.acquired
    assert result.lock is None
    assert len(calls) == quick_service.settings.retries + 1


def test_a_release_that_keeps_racing_is_a_503(quick_service, monkeypatch):
    quick_service.acquire("job", "w-1", ttl=30)
    calls = []
    live = quick_service.get("job")

    def release(conn, resource, owner, token, actor, now, details=None):
        calls.append(resource)
        # Held by us and valid, yet not released: the row changed under us.
        row = SimpleNamespace(
            owner="w-1", token=None, expires_at=live.expires_at, waiters=0
        )
        return SimpleNamespace(done=False, row=row, now=quick_service.now())

    monkeypatch.setattr(quick_service.statements, "release", release)
    with pytest.raises(ServiceBusy, match="release of 'job' kept racing"):
        quick_service.release("job", "w-1")
    assert len(calls) == quick_service.settings.retries + 1


@pytest.mark.backends("sqlite")
def test_an_acquire_behind_a_writer_that_keeps_sqlite_is_a_503(
    backend, service, monkeypatch
):
    """Through the service, on a real file: another connection holds SQLite's
    writer lock past the busy timeout; the acquire answers ServiceBusy (the
    API's 503), not the driver's error, and goes through once it is let go."""
    import lockkeeper_core.engine

    monkeypatch.setattr(lockkeeper_core.engine, "SQLITE_BUSY_TIMEOUT_MS", 50)
    service.core.engine.dispose()  # new connections take the short timeout
    holder = sqlite3.connect(service.core.engine.url.database, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(ServiceBusy, match="locked by other writers"):
            service.acquire("job:busy", "w-1", ttl=30)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert service.acquire("job:busy", "w-1", ttl=30).acquired
