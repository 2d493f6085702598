"""The hot path's DB-API seam keeps what SQLAlchemy's execution gave: wrapped
errors the service and the error handlers understand, and UTC instants."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime

import pytest
from lockkeeper_core.driver import DriverConnection, DriverSQL, FixedSQL
from lockkeeper_core.engine import connection_is_dead
from lockkeeper_core.statements import (
    LockStatements,
    TransactionalStatements,
    statements_for,
)
from lockkeeper_core.transactions import Raced
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DataError, IntegrityError, OperationalError

from app.database import autocommit
from app.extensions import db

pytestmark = pytest.mark.usefixtures("backend")


# The dialects whose hot path is one autocommit statement on the seam; SQLite's
# is always a transaction on it (below).
AUTOCOMMIT = ("postgresql", "mariadb")
# The dialects whose hot path is one transaction on the seam (their statements
# declare a ``driver_transaction``); PostgreSQL's is one autocommit statement.
TRANSACTIONAL = ("sqlite", "mariadb")


@pytest.fixture
def driver(app, backend):
    with app.app_context():
        return DriverConnection(autocommit(db.engine))


@pytest.mark.backends(*AUTOCOMMIT)
def test_a_row_comes_back_by_name_with_utc_instants(driver, backend):
    now_sql = "SELECT 7 AS fence, %s AS now" % (
        "clock_timestamp()" if backend == "postgresql" else "UTC_TIMESTAMP(6)"
    )
    row = driver.one(DriverSQL(now_sql + " WHERE :x = :x"), {"x": 1})
    assert row.fence == 7
    if backend == "postgresql":
        assert row.now.tzinfo is UTC
    assert driver.one(DriverSQL("SELECT 1 AS one WHERE 1 = :no"), {"no": 2}) is None


@pytest.mark.backends(*AUTOCOMMIT)
def test_a_duplicate_insert_is_an_integrity_error(driver):
    """What the service retries (a concurrent first insert won)."""
    insert = DriverSQL(
        "INSERT INTO distributed_locks (resource, owner, fence, acquired_at,"
        " expires_at) VALUES (:r, NULL, 1, :t, :t)"
    )
    when = datetime(2026, 1, 1, tzinfo=UTC)
    if driver.dialect.name != "postgresql":
        when = when.replace(tzinfo=None)
    assert driver.one(insert, {"r": "seam:1", "t": when}) is None
    with pytest.raises(IntegrityError):
        driver.one(insert, {"r": "seam:1", "t": when})


@pytest.mark.backends(*AUTOCOMMIT)
def test_an_unreachable_server_is_an_operational_error(driver):
    """What the API answers with a 503, not a 500."""
    url = make_url(str(driver.engine.url)).set(host="127.0.0.1", port=1)
    dead = DriverConnection(create_engine(url, isolation_level="AUTOCOMMIT"))
    with pytest.raises(OperationalError):
        dead.one(DriverSQL("SELECT 1 AS one"), {})


# -- transactions (SQLite, MariaDB) ------------------------------------------------


@pytest.fixture
def transactional(app, backend):
    """The statements and connection of a dialect whose hot path is one
    transaction on the seam."""
    statements = statements_for(backend)
    assert statements.driver_transaction is not None
    with app.app_context():
        return statements, DriverConnection(db.engine)


@pytest.mark.backends(*TRANSACTIONAL)
def test_a_transaction_binds_and_reads_back_aware_utc_instants(transactional):
    statements, connection = transactional
    acquired = datetime(2026, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)
    values = {
        "owner": "w-1",
        "token": "t",
        "fence": 3,
        "acquired_at": acquired,
        "expires_at": acquired.replace(minute=5),
    }
    with connection.transaction(statements.driver_transaction) as conn:
        statements._write_grant(conn, None, "seam:2", values)
    with connection.transaction(statements.driver_transaction) as conn:
        row = statements.lock_row(conn, "seam:2", acquired)
    assert (row.owner, row.fence, row.waiters, row.ahead) == ("w-1", 3, 0, 0)
    assert row.acquired_at == acquired
    assert row.expires_at == values["expires_at"]
    assert row.expires_at.tzinfo is UTC


@pytest.mark.backends(*TRANSACTIONAL)
def test_a_transaction_refuses_a_naive_instant_and_writes_nothing(transactional):
    statements, connection = transactional
    naive = datetime(2026, 5, 1, 12, 0)  # noqa: DTZ001 - the point of the test
    values = {
        "owner": "w-1",
        "token": "t",
        "fence": 4,
        "acquired_at": naive,
        "expires_at": naive,
    }
    with (
        pytest.raises(ValueError, match="naive"),
        connection.transaction(statements.driver_transaction) as conn,
    ):
        statements._write_grant(conn, None, "seam:3", values)
    with connection.transaction(statements.driver_transaction) as conn:
        assert statements.lock_row(conn, "seam:3", naive.replace(tzinfo=UTC)) is None


@pytest.mark.backends(*TRANSACTIONAL)
def test_a_duplicate_insert_in_a_transaction_is_a_lost_race(transactional):
    """A second first insert of one name fails as the service retries it: a
    unique violation (IntegrityError), or on MariaDB, whose first insert is an
    upsert (no shared next-key locks to deadlock on), ``Raced`` itself."""
    statements, connection = transactional
    lost = Raced if statements.dialect_name in ("mariadb", "mysql") else IntegrityError
    when = datetime(2026, 5, 1, tzinfo=UTC)
    values = {
        "owner": "w-1",
        "token": "t",
        "fence": 5,
        "acquired_at": when,
        "expires_at": when,
    }
    with connection.transaction(statements.driver_transaction) as conn:
        statements._write_grant(conn, None, "seam:4", values)
    with (
        pytest.raises(lost),
        connection.transaction(statements.driver_transaction) as conn,
    ):
        statements._write_grant(conn, None, "seam:4", values)


@pytest.mark.parametrize("dialect", ["postgresql", "sqlite", "mariadb", "mysql"])
def test_every_dialects_statements_declare_what_the_service_asks(dialect):
    """The service reads these declarations and never probes with getattr."""
    statements = statements_for(dialect)
    assert isinstance(statements, LockStatements)
    assert isinstance(statements.autocommit, bool)
    assert statements.driver_transaction is None or isinstance(
        statements.driver_transaction, str
    )
    assert isinstance(statements.transactional, TransactionalStatements)


def test_the_seams_cases_run_on_every_dialect_that_has_that_path(backend):
    """The tests above run where each path is: a dialect that gains or loses a
    transaction on the seam moves in or out of them, never passes them unseen."""
    statements = statements_for(backend)
    assert (statements.driver_transaction is not None) == (backend in TRANSACTIONAL)
    assert (backend in AUTOCOMMIT) == (backend != "sqlite")


# -- row shapes: found once per statement text -------------------------------------


def test_a_statements_row_shape_is_found_once_and_converts_only_its_instants(
    app, backend
):
    """The hot path's rows: instants (and only they) come back as aware UTC,
    a NULL instant stays None, and a statement's text has one shape however
    many times (and through however many objects) it is sent."""
    with app.app_context():
        if backend == "postgresql":
            connection = DriverConnection(autocommit(db.engine))
            sql = (
                "SELECT clock_timestamp() AS now, CAST(NULL AS timestamptz) AS ends_at,"
                " 'x' AS owner, 7 AS fence WHERE :x = :x"
            )
            rows = [connection.one(DriverSQL(sql), {"x": 1}) for _ in range(3)]
        else:  # a transaction's statement (MariaDB reads its rows column by
            # column: the same answers, no shape)
            connection = DriverConnection(db.engine)
            if backend == "sqlite":
                begin, sql = (
                    "BEGIN",
                    (
                        "SELECT '2026-05-01 12:00:00.123456' AS expires_at, NULL AS"
                        " ends_at, '2026-05-01 12:00:00.123456' AS owner, 7 AS fence"
                    ),
                )
            else:
                begin, sql = (
                    "",
                    FixedSQL.written(
                        "SELECT UTC_TIMESTAMP(6) AS now, NULL AS ends_at, 'x' AS owner,"
                        " 7 AS fence"
                    ),
                )
            rows = []
            for _ in range(3):
                with connection.transaction(begin) as conn:
                    rows.append(conn.one(sql, {}))
    first = rows[0]
    instant = first.expires_at if backend == "sqlite" else first.now
    assert isinstance(instant, datetime)
    assert instant.tzinfo is UTC
    if backend == "sqlite":
        assert instant == datetime(2026, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)
        assert first.owner == "2026-05-01 12:00:00.123456"  # not an instant column
    else:
        assert first.owner == "x"
    assert (first.ends_at, first.fence) == (None, 7)
    assert all(row._fields == first._fields for row in rows)
    assert len(connection._shapes) == (0 if backend == "mariadb" else 1)


# -- the connection kept between statements ----------------------------------------


def _connection_id_sql(backend: str) -> str:
    return {
        "postgresql": "SELECT pg_backend_pid() AS id WHERE :x = :x",
        "mariadb": "SELECT CONNECTION_ID() AS id FROM DUAL WHERE :x = :x",
    }[backend]


def _checkouts(engine) -> list[object]:
    seen: list[object] = []
    event.listen(engine.pool, "checkout", lambda dbapi, *_: seen.append(dbapi))
    return seen


@pytest.mark.backends(*AUTOCOMMIT)
def test_statements_in_a_row_run_on_one_kept_connection_without_a_checkout(
    driver, backend
):
    """The pool's checkout and checkin cost as much CPU as the statement's own
    work in the driver: the connection stays with the seam in between."""
    sql = DriverSQL(_connection_id_sql(backend))
    first = driver.one(sql, {"x": 1}).id
    checkouts = _checkouts(driver.engine)
    assert {driver.one(sql, {"x": 1}).id for _ in range(5)} == {first}
    assert checkouts == []


@pytest.mark.backends(*AUTOCOMMIT)
def test_two_statements_at_once_never_share_the_kept_connection(driver, backend):
    kept = driver._kept
    first = kept.take()
    second = kept.take()
    try:
        assert first.dbapi_connection is not second.dbapi_connection
    finally:
        kept.give_back(first)
        kept.give_back(second)  # one connection kept: this one checked in
    assert kept._idle == [first]


@pytest.mark.backends(*AUTOCOMMIT)
def test_a_kept_connection_is_closed_when_its_engine_is_disposed_of(driver, backend):
    """Disposing of an engine closes the connections it is not lending: the
    kept one too (a race waits for its connections to go)."""
    sql = DriverSQL(_connection_id_sql(backend))
    before = driver.one(sql, {"x": 1}).id
    kept = driver._kept._idle[0]
    driver.engine.dispose()
    assert driver._kept._idle == []
    assert kept.dbapi_connection is None
    assert driver.one(sql, {"x": 1}).id != before


@pytest.mark.backends(*AUTOCOMMIT)
def test_a_kept_connection_the_server_closed_is_replaced_without_an_error(
    driver, backend, app
):
    sql = DriverSQL(_connection_id_sql(backend))
    victim = driver.one(sql, {"x": 1}).id
    with app.app_context(), db.engine.connect() as admin:
        if backend == "postgresql":
            admin.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": victim})
        else:
            admin.execute(text(f"KILL {int(victim)}"))
    deadline = time.monotonic() + 10
    # The server's goodbye reaches the kept socket a moment later.
    while not connection_is_dead(driver._kept._idle[0].dbapi_connection):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert driver.one(sql, {"x": 1}).id != victim


@pytest.mark.backends(*TRANSACTIONAL)
def test_a_committed_transactions_connection_is_kept_and_a_failed_ones_is_not(
    transactional,
):
    statements, connection = transactional
    one = "SELECT 1 AS one"
    with connection.transaction(statements.driver_transaction) as conn:
        conn.one(
            one if connection.dialect.name == "sqlite" else FixedSQL.written(one), {}
        )
    kept = list(connection._kept._idle)
    assert len(kept) == 1
    with pytest.raises(ZeroDivisionError):
        with connection.transaction(statements.driver_transaction):
            raise ZeroDivisionError
    # Taken for the failed one, then checked in with its rollback: none kept.
    assert connection._kept._idle == []


@pytest.mark.backends(*AUTOCOMMIT)
def test_a_forked_child_never_uses_its_parents_kept_connection(driver, backend):
    """The child would share the parent's socket: it checks out its own, and
    the parent's session goes on unharmed."""
    url = driver.engine.url.render_as_string(hide_password=False)
    # An engine of its own: its pool holds no connection but the kept one.
    seam = DriverConnection(create_engine(url, isolation_level="AUTOCOMMIT"))
    sql = DriverSQL(_connection_id_sql(backend))
    parent = seam.one(sql, {"x": 1}).id
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its connection's id, touch nothing else
        try:
            os.write(writer, str(seam.one(sql, {"x": 1}).id).encode())
        finally:
            os._exit(0)
    os.close(writer)
    with os.fdopen(reader) as answer:
        child = int(answer.read() or 0)
    os.waitpid(pid, 0)
    try:
        assert child not in (0, parent)
        assert seam.one(sql, {"x": 1}).id == parent
    finally:
        seam.close()
        seam.engine.dispose()


@pytest.mark.backends("postgresql")
def test_a_connection_runs_each_statement_on_its_own_cursor_until_one_fails(driver):
    sql = DriverSQL(_connection_id_sql("postgresql"))
    other = DriverSQL("SELECT :x + 1 AS next")
    driver.one(sql, {"x": 1})
    cursors = driver._kept._idle[0].info["lockkeeper.cursors"]
    cursor = cursors[sql.raw]
    assert driver.one(other, {"x": 1}).next == 2
    assert driver.one(sql, {"x": 1}).id
    # Each statement kept its cursor, so psycopg kept its adapters for it.
    assert cursors[sql.raw] is cursor
    assert cursors[other.raw] is not cursor
    assert cursor._last_query is sql.raw
    with pytest.raises(DataError):
        driver.one(DriverSQL("SELECT 1 / 0 AS no WHERE :x = :x"), {"x": 1})
    assert cursor.closed
    assert driver.one(sql, {"x": 1}).id
    assert driver._kept._idle[0].info["lockkeeper.cursors"][sql.raw] is not cursor
