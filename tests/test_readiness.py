"""Readiness: ``/healthz`` is 503 while the database is empty, behind the schema
this code's migration scripts end at, or at a newer revision that admits only
newer code; so is every other request (never a 500); the start says so in the
log; ``/livez`` answers whatever the database does."""

from __future__ import annotations

import logging
from contextlib import contextmanager

import pytest
from alembic.script import ScriptDirectory
from lockkeeper_core.schema import (
    MIGRATIONS_DIR,
    READY_RECHECK_SECONDS,
    VERSION_TABLE,
    SchemaCheck,
    required_revisions,
)
from sqlalchemy import create_engine, text

from app.config import normalize_database_url
from app.extensions import db
from tests.conftest import ApiClient


def head_and_previous() -> tuple[str, str]:
    scripts = ScriptDirectory(str(MIGRATIONS_DIR))
    (head,) = scripts.get_heads()
    return head, scripts.get_revision(head).down_revision


def stamp(url: str, revision: str) -> None:
    engine = create_engine(normalize_database_url(url))
    try:
        with engine.begin() as conn:
            conn.execute(
                text(f"UPDATE {VERSION_TABLE} SET version_num = :r"), {"r": revision}
            )
    finally:
        engine.dispose()


def assert_not_ready(response, database_revision: str) -> None:
    head, _ = head_and_previous()
    assert response.status_code == 503, response.get_data(as_text=True)
    assert response.mimetype == "application/problem+json"
    body = response.json
    assert body["database_revision"] == database_revision
    assert body["required_revision"] == head
    assert body["command"] == "lockkeeper db upgrade"
    assert "lockkeeper db upgrade" in body["detail"]
    assert response.headers["Retry-After"]


def test_the_needed_revision_is_the_head_of_the_migration_scripts():
    head, _ = head_and_previous()
    assert required_revisions() == {head}


@pytest.mark.usefixtures("backend")
def test_healthz_is_503_naming_both_revisions_on_an_empty_database(make_app, empty_url):
    app = make_app(LOCKKEEPER_DATABASE_URL=empty_url)
    client = app.test_client()

    assert_not_ready(client.get("/healthz"), "none")
    assert client.get("/livez").status_code == 200


@pytest.mark.usefixtures("backend")
def test_healthz_is_503_one_migration_behind_and_200_once_upgraded(
    make_app, database_url
):
    head, previous = head_and_previous()
    stamp(database_url, previous)
    try:
        client = make_app().test_client()
        assert_not_ready(client.get("/healthz"), previous)
        assert client.get("/livez").json == {"status": "ok"}
    finally:
        stamp(database_url, head)
    # Not ready is looked at again on every check: ready as soon as upgraded.
    assert client.get("/healthz").status_code == 200


NEWER = "9999_from_a_newer_release"


@contextmanager
def stamped_newer(url: str, admits: str | None):
    """The database as a newer release left it: at a revision this code does not
    know, which admits code of revision ``admits`` or newer (None: says nothing)."""
    head, _ = head_and_previous()
    stamp(url, NEWER)
    engine = create_engine(normalize_database_url(url))
    try:
        if admits is not None:
            with engine.begin() as conn:
                conn.execute(
                    text("INSERT INTO schema_compatibility VALUES (:r, :a)"),
                    {"r": NEWER, "a": admits},
                )
        yield
    finally:
        with engine.begin() as conn:
            conn.execute(
                text("DELETE FROM schema_compatibility WHERE revision = :r"),
                {"r": NEWER},
            )
        engine.dispose()
        stamp(url, head)


@pytest.mark.usefixtures("backend")
def test_a_newer_release_that_admits_this_code_leaves_it_ready(make_app, database_url):
    # 0016: the oldest code every revision since (additive all) admits.
    with stamped_newer(database_url, "0016"):
        client = make_app().test_client()
        assert client.get("/healthz").status_code == 200
        assert client.get("/api/v1/locks").status_code == 401  # served: no token


@pytest.mark.usefixtures("backend")
@pytest.mark.parametrize("admits", [NEWER, None])
def test_code_older_than_the_newer_schema_admits_is_not_ready_anywhere(
    make_app, database_url, admits
):
    head, _ = head_and_previous()
    with stamped_newer(database_url, admits):
        app = make_app()
        api = ApiClient(app)
        health = app.test_client().get("/healthz")
        acquire = api.post("/api/v1/locks/sem:1", json={"owner": "a", "limit": 2})
        page = app.test_client().get("/")
    for response in (health, acquire):
        assert response.status_code == 503, response.get_data(as_text=True)
        assert response.headers["Retry-After"]
        body = response.json
        assert body["database_revision"] == NEWER
        assert body["required_revision"] == head
        assert "command" not in body  # no command of this code fixes it
        if admits:
            assert body["database_admits_code"] == admits
        assert "newer release's code" in body["detail"]
    assert page.status_code == 503
    assert page.headers["Retry-After"]
    assert NEWER in page.get_data(as_text=True)


@pytest.mark.usefixtures("backend")
def test_every_request_is_503_not_500_on_an_empty_database(make_app, empty_url):
    app = make_app(LOCKKEEPER_DATABASE_URL=empty_url)
    client = app.test_client()
    for method, path, body in (
        ("GET", "/api/v1/locks", None),
        ("POST", "/api/v1/locks/job:1", {"owner": "a"}),
        ("POST", "/api/v1/sessions", {"owner": "a", "ttl": 30}),
    ):
        response = client.open(
            path, method=method, json=body, headers={"Authorization": "Bearer x"}
        )
        assert_not_ready(response, "none")
    for path in ("/", "/login"):
        assert client.get(path).status_code == 503, path


@pytest.mark.usefixtures("backend")
def test_this_code_on_an_older_schema_answers_503_never_500(make_app, empty_url):
    """The new code on the previous release's schema (0020: PostgreSQL has no
    holder functions yet) refuses every call until `db upgrade`, then serves."""
    from app.ops.upgrade import upgrade

    app = make_app(LOCKKEEPER_DATABASE_URL=empty_url)
    upgrade(app, "0020")
    api = ApiClient(app)
    for body in (
        {"owner": "a", "limit": 2},
        {"owner": "a", "mode": "shared"},
        {"owner": "a"},
    ):
        assert_not_ready(api.post("/api/v1/locks/res:1", json=body), "0020")
    upgrade(app)
    assert (
        api.post("/api/v1/locks/res:1", json={"owner": "a", "limit": 2}).status_code
        == 200
    )


def test_the_start_logs_what_to_run_on_a_database_behind(
    make_app, database_url, caplog
):
    head, previous = head_and_previous()
    stamp(database_url, previous)
    try:
        with caplog.at_level(logging.INFO, logger="app"):
            make_app()
    finally:
        stamp(database_url, head)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        f"at revision {previous}" in m and head in m and "lockkeeper db upgrade" in m
        for m in warnings
    ), warnings


def test_a_ready_schema_is_looked_at_again_only_after_the_recheck_time():
    class Clock:
        now = 0.0

        def __call__(self):
            return self.now

    clock = Clock()
    check = SchemaCheck(clock)
    assert check.cached() is None
    ready = type("State", (), {"ready": True})()
    check._state, check._ready_until = ready, READY_RECHECK_SECONDS
    clock.now = READY_RECHECK_SECONDS - 1
    assert check.cached() is ready
    clock.now = READY_RECHECK_SECONDS
    assert check.cached() is None


# Where each database goes back to when "restored" under a ready instance: a
# revision whose schema lacks what a semaphore acquire of this code uses. On
# PostgreSQL (0020) the holder function, an undefined_function; on MariaDB and
# SQLite (0011) the holder columns, which PyMySQL's error 1054 and SQLite raise
# as an OperationalError, the class a database that does not answer raises.
RESTORED_TO = {"postgresql": "0020", "mariadb": "0011", "sqlite": "0011"}


@pytest.mark.usefixtures("backend")
def test_a_schema_moved_under_a_ready_instance_is_503_not_500(
    make_app, empty_url, backend
):
    """The instance found the schema ready a moment ago; then it went back to an
    older revision (a restore): the semaphore acquire that meets the missing
    function or column is a 503 naming the revisions and what is missing, not a
    500, nor "the lock database is not answering"."""

    from app.ops.upgrade import upgrade
    from tests.databases import downgrade_schema

    app = make_app(LOCKKEEPER_DATABASE_URL=empty_url)
    upgrade(app)
    api = ApiClient(app)
    body = {"owner": "a", "limit": 2}
    assert api.post("/api/v1/locks/sem:1", json=body).status_code == 200
    restored = RESTORED_TO[backend]
    with app.app_context():
        downgrade_schema(restored)
    response = api.post("/api/v1/locks/sem:2", json=body)
    assert_not_ready(response, restored)
    assert "holder_limit" in response.json["missing"] or (
        "lockkeeper_acquire_place" in response.json["missing"]
    )


def call_the_guard():
    """A statement of this code that calls a MariaDB procedure, as the guard's
    callers do (the server's own statements call none on MariaDB yet)."""
    db.session.execute(text("CALL lockkeeper_guard('job:1', 1)"))
    return "", 204


@pytest.mark.backends("mariadb")
@pytest.mark.usefixtures("backend")
def test_a_missing_mariadb_procedure_is_a_named_503_not_database_down(
    make_app, empty_url, caplog
):
    """MariaDB's error 1305 (``PROCEDURE … does not exist``), which PyMySQL raises
    as an OperationalError: on a schema that fits this code (a migration between
    dropping the procedure and creating it again: MariaDB's DDL commits at once)
    a 503 that names the revision and what is missing and says to try again; on
    a schema moved back under the instance, the not-ready 503 with the command;
    a page, not a 500, to a browser."""
    from app.ops.upgrade import upgrade

    head, previous = head_and_previous()
    app = make_app(LOCKKEEPER_DATABASE_URL=empty_url)
    app.add_url_rule("/api/v1/test-guard", view_func=call_the_guard)
    app.add_url_rule("/test-guard", view_func=call_the_guard)
    upgrade(app)
    client = app.test_client()
    assert client.get("/healthz").status_code == 200  # found ready: cached
    engine = create_engine(normalize_database_url(empty_url))
    try:
        with engine.begin() as conn:
            conn.execute(text("DROP PROCEDURE lockkeeper_guard"))
    finally:
        engine.dispose()
    with caplog.at_level(logging.WARNING, logger="app"):
        replacing = client.get("/api/v1/test-guard")
    assert replacing.status_code == 503, replacing.get_data(as_text=True)
    assert replacing.mimetype == "application/problem+json"
    assert replacing.headers["Retry-After"]
    body = replacing.json
    assert body["database_revision"] == body["required_revision"] == head
    assert body["missing"] == "PROCEDURE lockkeeper_guard does not exist"
    assert "a migration is replacing it" in body["detail"]
    assert "not answering" not in body["detail"]
    assert any("lockkeeper_guard" in r.getMessage() for r in caplog.records)
    page = client.get("/test-guard")
    assert page.status_code == 503
    assert page.headers["Retry-After"]
    assert "lockkeeper_guard" in page.get_data(as_text=True)

    stamp(empty_url, previous)
    moved = client.get("/api/v1/test-guard")
    assert_not_ready(moved, previous)
    assert "lockkeeper_guard does not exist" in moved.json["missing"]
