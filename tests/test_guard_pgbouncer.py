"""The guard through PgBouncer in transaction pooling mode: it keeps no session
state, so a guarded transaction holds the grant's row on whichever server
connection PgBouncer gave it, and a take-over through PgBouncer waits for it."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError

from app.config import normalize_database_url
from app.extensions import db, lock_service
from bench.pgbouncer import PgBouncer, find_pgbouncer
from tests.clock import FakeClock
from tests.databases import SERVER_URLS, unavailable
from tests.row_waits import run_blocked

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bouncer():
    if find_pgbouncer() is None:
        unavailable("pgbouncer missing (apt-get install pgbouncer)")
    try:
        running = PgBouncer(SERVER_URLS["postgresql"])
    except RuntimeError as exc:
        unavailable(f"pgbouncer: {exc}")
    yield running
    running.close()


@pytest.fixture
def direct_url(databases, tmp_path) -> str:
    return databases("postgresql").fresh(tmp_path)


def test_guarded_writes_and_a_waiting_take_over_through_pgbouncer(
    make_app, direct_url, bouncer, monkeypatch
):
    monkeypatch.setenv("LOCKKEEPER_PGBOUNCER", "true")
    clock = FakeClock(datetime.now(UTC))
    app = make_app(
        LOCKKEEPER_DATABASE_URL=bouncer.url_for(direct_url), LOCKKEEPER_CLOCK=clock
    )
    # The worker's own engine, through PgBouncer, preparing nothing.
    worker = create_engine(
        normalize_database_url(bouncer.url_for(direct_url)),
        connect_args={"prepare_threshold": None},
    )
    guard = text("SELECT lockkeeper_guard(:resource, :fence)")
    try:
        with app.app_context(), worker.connect() as conn:
            service = lock_service()
            lock = service.acquire("bounced:job", "w-1", ttl=30).lock
            conn.exec_driver_sql("CREATE TABLE bounced_notes (n INT)")
            conn.commit()
            # More rounds than psycopg's prepare threshold (5).
            for n in range(12):
                conn.execute(guard, {"resource": "bounced:job", "fence": lock.fence})
                conn.execute(text("INSERT INTO bounced_notes VALUES (:n)"), {"n": n})
                conn.commit()
            assert conn.exec_driver_sql("SELECT count(*) FROM bounced_notes").scalar()
            conn.rollback()

            conn.execute(guard, {"resource": "bounced:job", "fence": lock.fence})
            clock.advance(31)

            def take_over():
                with app.app_context():
                    return lock_service().acquire("bounced:job", "w-2", ttl=30)

            taking = run_blocked(service, take_over)
            assert not taking.done()
            conn.commit()
            taken = taking.result(timeout=30)
            assert taken.acquired
            assert taken.lock.fence > lock.fence
            with pytest.raises(DBAPIError) as lost:
                conn.execute(guard, {"resource": "bounced:job", "fence": lock.fence})
            assert lost.value.orig.sqlstate == "LK001"
            conn.rollback()
    finally:
        worker.dispose()
        with app.app_context():
            # The table is the worker's own, not the schema's: it must not stay
            # in the database the next test on this xdist worker takes as fresh.
            with db.engine.begin() as conn:
                conn.exec_driver_sql("DROP TABLE IF EXISTS bounced_notes")
            db.engine.dispose()
