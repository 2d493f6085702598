"""What the app does when its PostgreSQL server stops being a writable primary.

After a failover or switchover a pooled connection may lead to a server that is
now a standby (every write fails with SQLSTATE 25006, read_only_sql_transaction)
or that was shut down under it (57P01, admin_shutdown). Such a connection is
dropped with its pool and the operation retried once on a fresh connection; if
that fails too the answer is a 503 problem, never a 500. The fault harness
(``python -m tests.faults --database patroni``) shows the same with a real
Patroni cluster; these tests pin the mapping on the shared server.
"""

from __future__ import annotations

import socket

import pytest
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import make_url

from app.auth.service import create_token
from app.config import normalize_database_url
from app.database import autocommit
from app.extensions import db
from tests.conftest import ApiClient

APP_NAME = "lk_failover_test"


@pytest.fixture
def pg_url(databases, tmp_path) -> str:
    """A fresh PostgreSQL database; the app's sessions are named ``APP_NAME``."""
    url = make_url(databases("postgresql").fresh(tmp_path))
    return url.update_query_dict({"application_name": APP_NAME}).render_as_string(
        hide_password=False
    )


def connections_made(app) -> list[int]:
    """A list that grows by one per new DBAPI connection of ``app``'s engines
    (the ORM's and the autocommit one of the hot path)."""
    made: list[int] = []
    with app.app_context():
        for engine in {db.engine, autocommit(db.engine)}:
            event.listen(engine, "connect", lambda *_: made.append(1))
    return made


def assert_unavailable_problem(response) -> None:
    assert response.status_code == 503, response.get_data(as_text=True)
    assert response.mimetype == "application/problem+json"
    assert response.json["status"] == 503
    assert response.headers["Retry-After"]


def test_writes_to_a_read_only_server_are_503_problems(make_app, pg_url):
    # Every session read-only: what a client sees of a standby.
    url = make_url(pg_url).update_query_dict(
        {"options": "-c default_transaction_read_only=on"}
    )
    app = make_app(LOCKKEEPER_DATABASE_URL=url.render_as_string(hide_password=False))
    # The token is created over a writable connection of its own.
    writable = make_app(LOCKKEEPER_DATABASE_URL=pg_url)
    with writable.app_context():
        token = create_token("worker")
    client = app.test_client()
    headers = {"Authorization": f"Bearer {token}"}
    made = connections_made(app)

    acquire = client.post("/api/v1/locks/job:1", json={"owner": "w1"}, headers=headers)
    assert_unavailable_problem(acquire)
    # The read-only connection was dropped and the acquire tried once more.
    assert len(made) == 2
    renew = client.patch(
        "/api/v1/locks/job:1", json={"owner": "w1", "ttl": 5}, headers=headers
    )
    assert renew.status_code in (404, 503)
    assert renew.status_code != 500
    health = client.get("/healthz")
    assert_unavailable_problem(health)
    assert "read-only" in health.json["detail"]
    # Reads still work: a list is no write.
    assert client.get("/api/v1/locks", headers=headers).status_code == 200


def test_a_pooled_connection_turned_read_only_is_dropped_and_retried(make_app, pg_url):
    app = make_app(LOCKKEEPER_DATABASE_URL=pg_url)
    api = ApiClient(app)
    assert api.post("/api/v1/locks/job:1", json={"owner": "w1"}).status_code == 200
    with app.app_context():
        hot_path = autocommit(db.engine)
        hot_path.dispose()
        # The one pooled connection now behaves as a demoted primary would.
        with hot_path.connect() as conn:
            conn.execute(text("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY"))
        assert hot_path.pool.checkedin() == 1
    made = connections_made(app)

    renew = api.patch("/api/v1/locks/job:1", json={"owner": "w1", "ttl": 5})

    assert renew.status_code == 200, renew.get_data(as_text=True)
    assert len(made) == 1  # one fresh connection, to a writable server
    assert api.client.get("/healthz").status_code == 200


def test_a_terminated_connection_is_dropped_and_retried(make_app, pg_url):
    app = make_app(LOCKKEEPER_DATABASE_URL=pg_url)
    api = ApiClient(app)
    assert api.post("/api/v1/locks/job:1", json={"owner": "w1"}).status_code == 200
    admin = create_engine(normalize_database_url(pg_url.split("?")[0]))
    try:
        with admin.connect() as conn:
            # 57P01 admin_shutdown on the app's next statement, as in a switchover.
            ended = conn.execute(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE application_name = :name"
                    # This test's database only: parallel workers name their
                    # connections alike.
                    " AND datname = current_database()"
                ),
                {"name": APP_NAME},
            ).scalar()
    finally:
        admin.dispose()
    assert ended >= 1
    made = connections_made(app)

    renew = api.patch("/api/v1/locks/job:1", json={"owner": "w1", "ttl": 5})
    release = api.delete("/api/v1/locks/job:1", json={"owner": "w1"})

    assert renew.status_code == 200, renew.get_data(as_text=True)
    assert release.status_code == 204
    assert len(made) >= 1


def test_a_multi_host_url_reaches_the_writable_host(make_app, pg_url):
    """libpq tries the hosts in order: a dead one first is skipped."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = sock.getsockname()[1]
    url = make_url(pg_url)
    live = f"{url.host}:{url.port or 5432}"
    multi = (
        f"postgresql://{url.username}@/{url.database}"
        f"?host=127.0.0.1:{dead}&host={live}"
        "&target_session_attrs=read-write&connect_timeout=2"
    )
    normalized = normalize_database_url(multi)
    assert make_url(normalized).query["host"] == (f"127.0.0.1:{dead}", live)
    assert "target_session_attrs=read-write" in normalized

    app = make_app(LOCKKEEPER_DATABASE_URL=multi)
    api = ApiClient(app)

    assert api.post("/api/v1/locks/job:1", json={"owner": "w1"}).status_code == 200
    assert api.client.get("/healthz").status_code == 200
