"""Connections the server or the pooler dropped: after ``pg_terminate_backend``
of every backend of the app, or a PgBouncer restart, the next 100 requests all
succeed. Each pool (the transaction one and the autocommit one of the hot path)
finds its dead connections when it hands them out and replaces them, instead of
letting a request find them."""

from __future__ import annotations

import time

import lockkeeper_core.engine as lock_engine
import pytest
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import make_url

from app.config import normalize_database_url
from app.database import autocommit
from app.extensions import db
from bench.pgbouncer import PgBouncer, find_pgbouncer
from tests.conftest import ApiClient
from tests.databases import SERVER_URLS, unavailable

APP_NAME = "lk_reconnect_test"


def fill_pools(app, connections: int = 4) -> None:
    """Leave ``connections`` idle connections in each of the app's pools, as a
    worker that served a burst has."""
    with app.app_context():
        for engine in (db.engine, autocommit(db.engine)):
            held = [engine.connect() for _ in range(connections)]
            for conn in held:
                conn.execute(text("SELECT 1"))
            for conn in held:
                conn.close()


def hundred_requests(api: ApiClient) -> list[tuple[int, str, int]]:
    """100 requests across the API, the token check and /healthz; the ones that
    did not answer as a healthy server would: (index, what, status)."""
    failures = []
    for n in range(25):
        resource = f"reconnect:{n % 5}"
        for what, response, expected in (
            (
                "acquire",
                api.post(f"/api/v1/locks/{resource}", json={"owner": "w"}),
                200,
            ),
            ("renew", api.patch(f"/api/v1/locks/{resource}", json={"owner": "w"}), 200),
            (
                "release",
                api.delete(f"/api/v1/locks/{resource}", json={"owner": "w"}),
                204,
            ),
            ("healthz", api.client.get("/healthz"), 200),
        ):
            if response.status_code != expected:
                failures.append((len(failures), what, response.status_code))
    return failures


def terminate_backends(admin_url: str, application_name: str) -> int:
    """End the backends of ``application_name`` on the database of ``admin_url``
    and wait until they are gone; how many were ended.

    Only this test's database: the tests run in parallel, each worker on a
    database of its own, and every test here names its connections alike. Ending
    them on the whole server ended other workers' connections too, in the middle
    of their statements. Autocommit: within one transaction PostgreSQL shows the
    same snapshot of ``pg_stat_activity`` throughout, so the wait below would
    never see a backend go."""
    admin = create_engine(
        normalize_database_url(admin_url), isolation_level="AUTOCOMMIT"
    )
    mine = "application_name = :name AND datname = current_database()"
    try:
        with admin.connect() as conn:
            ended = conn.execute(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    f" WHERE {mine}"
                ),
                {"name": application_name},
            ).scalar()
            deadline = time.monotonic() + 30
            while conn.execute(
                text(f"SELECT count(*) FROM pg_stat_activity WHERE {mine}"),
                {"name": application_name},
            ).scalar():
                assert time.monotonic() < deadline, "terminated backends still there"
                time.sleep(0.02)
    finally:
        admin.dispose()
    return ended


@pytest.fixture
def pg_url(databases, tmp_path) -> str:
    url = make_url(databases("postgresql").fresh(tmp_path))
    return url.update_query_dict({"application_name": APP_NAME}).render_as_string(
        hide_password=False
    )


def test_after_pg_terminate_backend_no_request_fails(make_app, pg_url):
    app = make_app(LOCKKEEPER_DATABASE_URL=pg_url)
    api = ApiClient(app)
    assert api.post("/api/v1/locks/warm", json={"owner": "w"}).status_code == 200
    fill_pools(app)

    assert terminate_backends(pg_url.split("?")[0], APP_NAME) >= 8

    assert hundred_requests(api) == []


@pytest.fixture
def bouncer():
    if find_pgbouncer() is None:
        unavailable("pgbouncer missing (apt-get install pgbouncer)")
    try:
        running = PgBouncer(SERVER_URLS["postgresql"])
    except RuntimeError as exc:
        unavailable(f"pgbouncer: {exc}")
    yield running
    running.close()


@pytest.mark.slow
def test_after_a_pgbouncer_restart_no_request_fails(
    make_app, databases, tmp_path, bouncer
):
    url = bouncer.url_for(databases("postgresql").fresh(tmp_path))
    app = make_app(LOCKKEEPER_DATABASE_URL=url, LOCKKEEPER_PGBOUNCER=True)
    api = ApiClient(app)
    assert api.post("/api/v1/locks/warm", json={"owner": "w"}).status_code == 200
    fill_pools(app)

    bouncer.restart()

    assert hundred_requests(api) == []


@pytest.mark.slow
def test_after_pg_terminate_backend_behind_pgbouncer_no_request_fails(
    make_app, databases, tmp_path, bouncer
):
    direct = databases("postgresql").fresh(tmp_path)
    app = make_app(
        LOCKKEEPER_DATABASE_URL=bouncer.url_for(direct), LOCKKEEPER_PGBOUNCER=True
    )
    api = ApiClient(app)
    assert api.post("/api/v1/locks/warm", json={"owner": "w"}).status_code == 200
    fill_pools(app)
    # PgBouncer's own server connections carry no application_name of ours:
    # end every backend of this database but the one asking.
    admin = create_engine(normalize_database_url(SERVER_URLS["postgresql"]))
    try:
        with admin.connect() as conn:
            ended = conn.execute(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE datname = :name AND pid <> pg_backend_pid()"
                ),
                {"name": make_url(direct).database},
            ).scalar()
    finally:
        admin.dispose()
    databases("postgresql").engine.dispose()  # the harness's own, ended too
    assert ended >= 1

    assert hundred_requests(api) == []


def test_after_mariadb_kills_the_apps_connections_no_request_fails(
    make_app, databases, tmp_path
):
    server = databases("mariadb")
    url = server.fresh(tmp_path)
    app = make_app(LOCKKEEPER_DATABASE_URL=url)
    api = ApiClient(app)
    assert api.post("/api/v1/locks/warm", json={"owner": "w"}).status_code == 200
    fill_pools(app)
    with server.admin.connect() as conn:
        ids = conn.execute(
            text(
                "SELECT id FROM information_schema.processlist"
                " WHERE db = :name AND id <> CONNECTION_ID()"
            ),
            {"name": server.name},
        ).scalars()
        ids = list(ids)
        for connection_id in ids:
            conn.execute(text(f"KILL CONNECTION {int(connection_id)}"))
    server.engine.dispose()  # the test harness's own, killed too
    assert len(ids) >= 8

    assert hundred_requests(api) == []


def test_a_new_connection_closed_before_its_first_use_is_a_503_not_a_500(
    make_app, databases, tmp_path
):
    """A fault run through HAProxy answered 500 twice at a failover: a pooled
    connection found closed at its checkout was replaced by a new one, which
    HAProxy cut at once (it moved the node's sessions), the checkout found
    that one closed too, the pool's two attempts were used up and it raised
    InvalidRequestError ("This connection is closed"). Here every new
    connection is killed by the server as it is made, after the pooled ones
    were: a 503 problem, and 200 once new connections live."""
    server = databases("mariadb")
    url = server.fresh(tmp_path)
    app = make_app(LOCKKEEPER_DATABASE_URL=url)
    api = ApiClient(app)
    assert api.post("/api/v1/locks/warm", json={"owner": "w"}).status_code == 200
    fill_pools(app)
    with server.admin.connect() as conn:
        ids = conn.scalars(
            text(
                "SELECT id FROM information_schema.processlist"
                " WHERE db = :name AND id <> CONNECTION_ID()"
            ),
            {"name": server.name},
        ).all()
        for connection_id in ids:
            conn.execute(text(f"KILL CONNECTION {int(connection_id)}"))
    server.engine.dispose()  # the harness's own, killed too
    cutting = [True]

    def cut(dbapi_connection, _record) -> None:
        if not cutting[0]:
            return
        with server.admin.connect() as conn:
            conn.execute(text(f"KILL CONNECTION {int(dbapi_connection.thread_id())}"))
        deadline = time.monotonic() + 10
        while not lock_engine.connection_is_dead(dbapi_connection):
            assert time.monotonic() < deadline, "the killed connection stays open"
            time.sleep(0.01)

    with app.app_context():
        for engine in (db.engine, autocommit(db.engine)):
            event.listen(engine, "connect", cut)

    cut_off = api.post("/api/v1/locks/job:1", json={"owner": "w"})
    cutting[0] = False
    served = api.post("/api/v1/locks/job:1", json={"owner": "w"})

    assert cut_off.status_code == 503, cut_off.get_data(as_text=True)
    assert cut_off.mimetype == "application/problem+json"
    assert served.status_code == 200, served.get_data(as_text=True)


@pytest.mark.parametrize("server", ["postgresql", "mariadb"])
def test_an_uncached_token_on_a_connection_that_died_unseen_is_looked_up_again(
    make_app, databases, tmp_path, monkeypatch, server
):
    """A token's first request (no cached identity) right after the server went
    away, on a pooled connection whose death the check-out could not see (a
    failover to another host sends no FIN): the lookup fails on that connection,
    which is dropped with its pool, and is tried once more on a fresh one, as
    the lock operations are. Before: one 503."""
    database = databases(server)
    url = database.fresh(tmp_path)
    if server == "postgresql":
        url = (
            make_url(url)
            .update_query_dict({"application_name": APP_NAME})
            .render_as_string(hide_password=False)
        )
    app = make_app(LOCKKEEPER_DATABASE_URL=url)
    api = ApiClient(app)
    assert api.post("/api/v1/locks/warm", json={"owner": "w"}).status_code == 200
    fresh = api.with_token("fresh")  # created, never looked up: not cached
    fill_pools(app)
    monkeypatch.setattr(lock_engine, "connection_is_dead", lambda _conn: False)
    if server == "postgresql":
        assert terminate_backends(url.split("?")[0], APP_NAME) >= 8
    else:
        with database.admin.connect() as conn:
            ids = conn.scalars(
                text(
                    "SELECT id FROM information_schema.processlist"
                    " WHERE db = :name AND id <> CONNECTION_ID()"
                ),
                {"name": database.name},
            ).all()
            for connection_id in ids:
                conn.execute(text(f"KILL CONNECTION {int(connection_id)}"))
        assert len(ids) >= 8
    database.engine.dispose()  # the harness's own, ended too

    acquired = fresh.post("/api/v1/locks/fresh:1", json={"owner": "w"})

    assert acquired.status_code == 200, acquired.get_data(as_text=True)
    assert acquired.json["acquired"]
