"""PostgreSQL's acquire, renew and release are server-side functions, created and
dropped by their migration; the lock semantics themselves are tested through the
service on every backend (test_locks, test_token_holders, the races)."""

from __future__ import annotations

import pytest
from lockkeeper_core.errors import LockNotFound
from sqlalchemy import text

from app import create_app
from app.extensions import db, lock_service
from app.factory import upgrade_schema
from tests.databases import ServerDatabase, downgrade_schema, unavailable

# 0007's hot path, and 0008's guard (tests/test_guard.py), all gone at 0006.
FUNCTIONS = {
    "lockkeeper_acquire",
    "lockkeeper_renew",
    "lockkeeper_release",
    "lockkeeper_guard",
    # 0013: a session's heartbeat
    "lockkeeper_heartbeat",
    # 0021: a semaphore's holder or a shared grant
    "lockkeeper_acquire_place",
    # 0022: renewing or releasing a holder
    "lockkeeper_renew_place",
    "lockkeeper_release_place",
    # 0041: a set's acquire
    "lockkeeper_acquire_set",
    # 0042: a set's release
    "lockkeeper_release_set",
}


def _functions(app) -> set[str]:
    with app.app_context(), db.engine.connect() as conn:
        return set(
            conn.scalars(
                text("SELECT proname FROM pg_proc WHERE proname LIKE 'lockkeeper_%'")
            )
        )


def test_the_lock_functions_come_and_go_with_their_migration(tmp_path):
    try:
        database = ServerDatabase("postgresql", tmp_path)
    except ConnectionError as exc:
        unavailable(str(exc))
    app = create_app(
        {
            "TESTING": True,
            "SECRET_KEY": "test-secret",
            "LOCKKEEPER_DATABASE_URL": database.url,
            "LOCKKEEPER_INSTANCE_PATH": str(tmp_path / "instance"),
            "LOCKKEEPER_BOOTSTRAP": False,
            "LOCKKEEPER_AUTO_MIGRATE": False,
        }
    )
    try:
        assert _functions(app) == FUNCTIONS
        with app.app_context():
            downgrade_schema("0006")
        assert _functions(app) == set()

        upgrade_schema(app)
        assert _functions(app) == FUNCTIONS
        with app.app_context():
            service = lock_service()
            granted = service.acquire("functions.job", "worker", ttl=30)
            assert granted.acquired
            assert granted.lock.fence is not None
            renewed = service.renew("functions.job", "worker", ttl=60)
            assert renewed.fence == granted.lock.fence
            assert renewed.expires_at > granted.lock.expires_at
            service.release("functions.job", "worker")
            with pytest.raises(LockNotFound):
                service.get("functions.job")
    finally:
        with app.app_context():
            db.session.remove()
            db.engine.dispose()
        database.close()
