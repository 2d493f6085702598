"""PostgreSQL behind PgBouncer in transaction pooling mode: the lock contract and
the races hold through it, with ``LOCKKEEPER_PGBOUNCER`` on (no prepared
statements). A private PgBouncer is started on a free port for this module."""

from __future__ import annotations

import pytest

from bench.pgbouncer import PgBouncer, find_pgbouncer
from tests import test_races
from tests.conftest import ApiClient
from tests.databases import SERVER_URLS, unavailable

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
def database_url(databases, tmp_path, bouncer, monkeypatch):
    """This test's PostgreSQL database, reached through PgBouncer. The setting goes
    through the environment so the race tests' child processes see it too."""
    monkeypatch.setenv("LOCKKEEPER_PGBOUNCER", "true")
    return bouncer.url_for(databases("postgresql").fresh(tmp_path))


def test_the_app_does_not_prepare_statements_behind_pgbouncer(app):
    from app.extensions import db

    with app.app_context():
        with db.engine.connect() as conn:
            assert conn.connection.dbapi_connection.prepare_threshold is None


def test_acquire_renew_release_contract_through_pgbouncer(app):
    api = ApiClient(app)
    other = api.with_token("other")
    fences = []
    # More rounds than psycopg's prepare threshold (5): a prepared statement
    # would be missing on another server connection by now.
    for round_number in range(12):
        path = f"/api/v1/locks/bouncer:{round_number % 3}"
        granted = api.post(path, json={"owner": "w-1", "ttl": 30})
        assert granted.status_code == 200, granted.get_json()
        fences.append(granted.get_json()["lock"]["fence"])
        refused = other.post(path, json={"owner": "w-2", "ttl": 30})
        assert refused.status_code == 409
        assert refused.get_json()["lock"]["owner"] == "w-1"
        renewed = api.patch(path, json={"owner": "w-1", "ttl": 60})
        assert renewed.status_code == 200
        assert renewed.get_json()["fence"] == fences[-1]
        assert other.delete(path, json={"owner": "w-2"}).status_code == 403
        assert api.delete(path, json={"owner": "w-1"}).status_code == 204
        assert api.delete(path, json={"owner": "w-1"}).status_code == 404
    assert fences == sorted(set(fences))


def test_threads_racing_for_a_free_resource_through_pgbouncer(app):
    test_races.test_threads_racing_for_a_free_resource_yield_one_winner(app)


def test_processes_racing_for_a_free_resource_through_pgbouncer(app, database_url):
    test_races.test_processes_racing_for_a_free_resource_yield_one_winner(
        app, database_url
    )
