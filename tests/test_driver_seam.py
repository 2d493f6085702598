"""The hot path's DB-API seam keeps what SQLAlchemy's execution gave: wrapped
errors the service and the error handlers understand, and UTC instants."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError, OperationalError

from app.database import autocommit
from app.extensions import db
from app.locks.driver import DriverConnection, DriverSQL

pytestmark = pytest.mark.usefixtures("backend")


@pytest.fixture
def driver(app, backend):
    if backend == "sqlite":
        # SQLite's hot path is a transaction of SQLAlchemy statements, not the seam.
        return None
    with app.app_context():
        return DriverConnection(autocommit(db.engine))


def test_a_row_comes_back_by_name_with_utc_instants(driver, backend):
    if driver is None:
        return
    now_sql = "SELECT 7 AS fence, %s AS now" % (
        "clock_timestamp()" if backend == "postgresql" else "UTC_TIMESTAMP(6)"
    )
    row = driver.one(DriverSQL(now_sql + " WHERE :x = :x"), {"x": 1})
    assert row.fence == 7
    if backend == "postgresql":
        assert row.now.tzinfo is UTC
    assert driver.one(DriverSQL("SELECT 1 AS one WHERE 1 = :no"), {"no": 2}) is None


def test_a_duplicate_insert_is_an_integrity_error(driver):
    """What the service retries (a concurrent first insert won)."""
    if driver is None:
        return
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


def test_an_unreachable_server_is_an_operational_error(driver):
    """What the API answers with a 503, not a 500."""
    if driver is None:
        return
    url = make_url(str(driver.engine.url)).set(host="127.0.0.1", port=1)
    dead = DriverConnection(create_engine(url, isolation_level="AUTOCOMMIT"))
    with pytest.raises(OperationalError):
        dead.one(DriverSQL("SELECT 1 AS one"), {})
