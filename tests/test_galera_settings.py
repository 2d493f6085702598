"""What a Galera cluster needs, seen from one plain MariaDB server: the fence
sequence in the form Galera accepts (revision 0034) on new and existing
installs, the engine's per-connection settings, and the start-up check that
stays silent off Galera. The cluster itself: ``tests/faults/test_galera.py``."""

from __future__ import annotations

import pytest
from lockkeeper_core.engine import GALERA_SYNC_WAIT, on_galera
from sqlalchemy import create_engine, text

from app.config import normalize_database_url
from app.extensions import db
from app.ops.galera import galera_problems
from app.ops.upgrade import upgrade

pytestmark = pytest.mark.backends("mariadb")


def _sequence(conn) -> tuple[int, int]:
    row = conn.execute(text("SELECT increment, cache_size FROM lock_fence_seq")).one()
    return row.increment, row.cache_size


def test_a_new_install_creates_the_fence_sequence_as_galera_accepts_it(
    backend, make_app, empty_url
):
    app = make_app(LOCKKEEPER_DATABASE_URL=empty_url)
    upgrade(app)
    with app.app_context(), db.engine.connect() as conn:
        # Off Galera 0038 leaves the cache (a Galera node's sequence has none).
        assert _sequence(conn) == (0, 1000)
        drawn = [conn.execute(text("SELECT NEXTVAL(lock_fence_seq)")).scalar()]
        drawn.append(conn.execute(text("SELECT NEXTVAL(lock_fence_seq)")).scalar())
        # One server steps by its auto_increment_increment: 1.
        assert drawn == [1, 2]
        assert galera_problems(conn) is None


def test_0034_brings_an_existing_sequence_to_increment_by_0_without_reusing_a_fence(
    backend, make_app, empty_url
):
    app = make_app(LOCKKEEPER_DATABASE_URL=empty_url)
    upgrade(app, "0033")
    engine = create_engine(normalize_database_url(empty_url))
    try:
        with engine.connect() as conn:
            # As revision 0001 made it before: INCREMENT BY 1 with a cache.
            conn.execute(text("ALTER SEQUENCE lock_fence_seq INCREMENT BY 1"))
            assert _sequence(conn) == (1, 1000)
            drawn = [
                conn.execute(text("SELECT NEXTVAL(lock_fence_seq)")).scalar()
                for _ in range(5)
            ]
        upgrade(app)
        with engine.connect() as conn:
            assert _sequence(conn) == (0, 1000)
            after = conn.execute(text("SELECT NEXTVAL(lock_fence_seq)")).scalar()
            assert after > max(drawn), (drawn, after)
            following = conn.execute(text("SELECT NEXTVAL(lock_fence_seq)")).scalar()
            assert following == after + 1
    finally:
        engine.dispose()


def test_off_galera_the_engine_sets_nothing_and_the_start_checks_nothing(backend, app):
    with app.app_context(), db.engine.connect() as conn:
        assert not on_galera(conn.connection.dbapi_connection)
        assert conn.execute(text("SELECT @@session.wsrep_sync_wait")).scalar() == 0
        assert galera_problems(conn) is None
    assert GALERA_SYNC_WAIT & 1, "reads wait"
