"""The client's ``guard(conn, lock)``: the same check through SQLAlchemy (Core
Connection, ORM Session) and plain DB-API connections (psycopg, PyMySQL), the
database's refusals as the client's exceptions, and no database library imported
by the client itself."""

from __future__ import annotations

import subprocess
import sys
import uuid
from datetime import UTC, datetime

import psycopg
import pymysql
import pytest
from lockkeeper_client import (
    ConfigurationError,
    GuardNotInstalled,
    GuardOutsideTransaction,
    GuardRefused,
    LockLost,
    guard,
)
from lockkeeper_core.schema import database_revisions
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from app.config import normalize_database_url
from app.extensions import lock_service
from app.ops.upgrade import upgrade
from tests.clock import FakeClock
from tests.databases import SERVER_URLS

SERVERS = ("postgresql", "mariadb")
RESOURCE = "guard:client"


def pytest_generate_tests(metafunc):
    if "server" in metafunc.fixturenames:
        chosen = metafunc.config.getoption("--backends").split(",")
        metafunc.parametrize("server", [s for s in SERVERS if s in chosen])


@pytest.fixture
def database_url(server, databases, tmp_path) -> str:
    return databases(server).fresh(tmp_path)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(datetime.now(UTC))


@pytest.fixture
def service(make_app, clock):
    app = make_app(LOCKKEEPER_CLOCK=clock)
    with app.app_context():
        yield lock_service()


@pytest.fixture
def engine(database_url):
    engine = create_engine(normalize_database_url(database_url))
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE IF NOT EXISTS client_notes (fence BIGINT)")
        conn.exec_driver_sql("DELETE FROM client_notes")
    yield engine
    engine.dispose()


def _dbapi(database_url, server):
    url = make_url(database_url)
    if server == "postgresql":
        return psycopg.connect(
            host=url.host, port=url.port, user=url.username, dbname=url.database
        )
    return pymysql.connect(
        host=url.host, port=url.port, user=url.username, database=url.database
    )


def _lost(service, clock):
    """A grant of w-1 that w-2 took over: (the lost grant, the current one)."""
    first = service.acquire(RESOURCE, "w-1", ttl=30).lock
    clock.advance(31)
    return first, service.acquire(RESOURCE, "w-2", ttl=30).lock


def test_the_client_imports_no_database_library():
    code = (
        "import sys, lockkeeper_client; "
        "found = {'sqlalchemy', 'psycopg', 'psycopg2', 'pymysql', 'MySQLdb'}"
        " & set(sys.modules); assert not found, found"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_core_connection_guards_its_write(service, engine):
    lock = service.acquire(RESOURCE, "w-1", ttl=30).lock
    with engine.begin() as conn:
        guard(conn, lock)
        conn.execute(text("INSERT INTO client_notes VALUES (:f)"), {"f": lock.fence})
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT fence FROM client_notes").scalar() == (
            lock.fence
        )


def test_a_core_connection_in_autocommit_is_refused_before_the_call(service, engine):
    lock = service.acquire(RESOURCE, "w-1", ttl=30).lock
    autocommit = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    with autocommit as conn, pytest.raises(GuardOutsideTransaction):
        guard(conn, lock)


def test_an_orm_session_guards_in_its_transaction(service, clock, engine):
    lock = service.acquire(RESOURCE, "w-1", ttl=30).lock
    with Session(engine) as session, session.begin():
        guard(session, lock)
        session.execute(text("INSERT INTO client_notes VALUES (:f)"), {"f": lock.fence})
    lost, _ = _lost(service, clock)
    with Session(engine) as session:
        with session.begin():
            with pytest.raises(GuardRefused) as refused:
                guard(session, lost)
            session.rollback()
    assert refused.value.reason == "lost"
    assert refused.value.sqlstate == "LK001"
    assert refused.value.fence == lost.fence
    assert isinstance(refused.value, LockLost)
    with engine.connect() as conn:
        assert conn.exec_driver_sql(
            "SELECT fence FROM client_notes"
        ).scalars().all() == [lock.fence]


def test_the_guard_holds_the_row_until_the_session_commits(service, engine):
    lock = service.acquire(RESOURCE, "w-1", ttl=30).lock
    nowait = "SELECT id FROM distributed_locks WHERE resource = :r FOR UPDATE NOWAIT"
    with Session(engine) as session, engine.connect() as other:
        with session.begin():
            guard(session, lock)
            with pytest.raises(DBAPIError):
                other.execute(text(nowait), {"r": RESOURCE})
            other.rollback()
        assert other.execute(text(nowait), {"r": RESOURCE}).scalar() is not None
        other.rollback()


@pytest.mark.parametrize(
    ("case", "reason", "sqlstate"),
    [("lost", "lost", "LK001"), ("never", "never held", "LK003")],
)
def test_a_dbapi_connection_gets_the_clients_refusals(
    service, clock, database_url, server, case, reason, sqlstate
):
    lost, current = _lost(service, clock)
    refused_lock = lost if case == "lost" else _Lock(RESOURCE, current.fence + 100)
    conn = _dbapi(database_url, server)
    try:
        guard(conn, current)
        conn.commit()
        with pytest.raises(GuardRefused) as refused:
            guard(conn, refused_lock)
        conn.rollback()
    finally:
        conn.close()
    assert (refused.value.reason, refused.value.sqlstate) == (reason, sqlstate)
    assert str(refused.value).startswith(f"lockkeeper_guard: {reason}:")


def test_an_expired_grant_is_refused_as_expired(make_app, database_url, server):
    app = make_app()  # the real clock: the grant and the guard agree on the time
    with app.app_context():
        lock = lock_service().acquire(RESOURCE, "w-1", ttl=0.05).lock
    conn = _dbapi(database_url, server)
    try:
        deadline = datetime.now(UTC).timestamp() + 10
        while lock.expires_at > _database_now(conn, server):
            assert datetime.now(UTC).timestamp() < deadline
        with pytest.raises(GuardRefused) as refused:
            guard(conn, lock)
        conn.rollback()
        assert (refused.value.reason, refused.value.sqlstate) == ("expired", "LK002")
    finally:
        conn.close()


def test_a_dbapi_connection_in_autocommit_is_refused(service, database_url, server):
    lock = service.acquire(RESOURCE, "w-1", ttl=30).lock
    conn = _dbapi(database_url, server)
    try:
        if server == "postgresql":
            conn.autocommit = True
        else:
            conn.autocommit(True)
        with pytest.raises(GuardOutsideTransaction):
            guard(conn, lock)
    finally:
        conn.close()


def _database_now(conn, server) -> datetime:
    with conn.cursor() as cursor:
        cursor.execute(
            "SELECT clock_timestamp()"
            if server == "postgresql"
            else "SELECT UTC_TIMESTAMP(6)"
        )
        now = cursor.fetchone()[0]
    conn.rollback()
    return now.astimezone(UTC) if now.tzinfo else now.replace(tzinfo=UTC)


def test_a_transaction_begun_by_hand_on_an_autocommit_connection_is_guarded(
    service, database_url, server
):
    lock = service.acquire(RESOURCE, "w-1", ttl=30).lock
    conn = _dbapi(database_url, server)
    try:
        if server == "postgresql":
            conn.autocommit = True
            with conn.transaction():
                guard(conn, lock)
        else:
            conn.autocommit(True)
            conn.begin()
            guard(conn, lock)
            conn.commit()
    finally:
        conn.close()


class _Lock:
    def __init__(self, resource: str, fence: int):
        self.resource = resource
        self.fence = fence


@pytest.fixture
def unmigrated_engine(server):
    """An empty database beside the lock service's: no guard routine in it."""
    admin_url = make_url(normalize_database_url(SERVER_URLS[server]))
    name = f"lk_noguard_{uuid.uuid4().hex[:8]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    engine = create_engine(admin_url.set(database=name))
    try:
        yield engine
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE {name}")
        admin.dispose()


def test_a_database_without_the_guard_is_named_not_passed_on_raw(unmigrated_engine):
    """A connection to a database the lock service never migrated (another
    database, or one behind on its schema): the client says what to do, through
    SQLAlchemy and through the driver alike, instead of the driver's raw error."""
    engine = unmigrated_engine
    lock = _Lock(RESOURCE, 1)
    with engine.connect() as conn, pytest.raises(GuardNotInstalled) as through_core:
        guard(conn, lock)
    raw = engine.raw_connection()
    try:
        with pytest.raises(GuardNotInstalled) as through_driver:
            guard(raw.driver_connection, lock)
        raw.rollback()
    finally:
        raw.close()
    for refused in (through_core.value, through_driver.value):
        assert "lockkeeper db upgrade" in str(refused)
        assert isinstance(refused, ConfigurationError)


def test_a_database_whose_schema_predates_the_guard_is_told_to_upgrade(
    unmigrated_engine, make_app
):
    """The lock service's schema one revision before the guard (0007: its
    tables, no routine): the same clear error, not the driver's."""
    url = unmigrated_engine.url.render_as_string(hide_password=False)
    upgrade(make_app(LOCKKEEPER_DATABASE_URL=url), "0007")
    lock = _Lock(RESOURCE, 1)
    with unmigrated_engine.connect() as conn:
        assert database_revisions(conn) == {"0007"}
        with pytest.raises(GuardNotInstalled) as through_core:
            guard(conn, lock)
    raw = unmigrated_engine.raw_connection()
    try:
        with pytest.raises(GuardNotInstalled) as through_driver:
            guard(raw.driver_connection, lock)
        raw.rollback()
    finally:
        raw.close()
    for refused in (through_core.value, through_driver.value):
        assert "run `lockkeeper db upgrade`" in str(refused)


def _blind_connections(server, database_url):
    """A Core connection and a driver connection that cannot see the migrated
    database's routines: on MariaDB made without a database (the procedure is
    looked for nowhere), on PostgreSQL with the lock schema off the search_path."""
    url = make_url(normalize_database_url(database_url))
    if server == "mariadb":
        # Built anew: URL.set(database=None) keeps the database it had.
        engine = create_engine(
            URL.create(url.drivername, url.username, host=url.host, port=url.port)
        )
        core = engine.connect()
        driver = pymysql.connect(host=url.host, port=url.port, user=url.username)
    else:
        engine = create_engine(url)
        core = engine.connect()
        core.exec_driver_sql("SET search_path TO pg_catalog")
        driver = _dbapi(database_url, server)
        with driver.cursor() as cursor:
            cursor.execute("SET search_path TO pg_catalog")
    return engine, core, driver


def test_a_connection_that_cannot_see_the_lock_database_is_told_to_connect_to_it(
    service, database_url, server
):
    lock = service.acquire(RESOURCE, "w-1", ttl=30).lock
    engine, core, driver = _blind_connections(server, database_url)
    try:
        with pytest.raises(GuardNotInstalled) as through_core:
            guard(core, lock)
        core.rollback()
        with pytest.raises(GuardNotInstalled) as through_driver:
            guard(driver, lock)
        driver.rollback()
    finally:
        core.close()
        driver.close()
        engine.dispose()
    for refused in (through_core.value, through_driver.value):
        assert "connect to the lock service's database" in str(refused)
