"""Readiness: ``/healthz`` is 503 while the database is empty or behind the schema
this code's migration scripts end at, and the start says so in the log;
``/livez`` answers whatever the database does."""

from __future__ import annotations

import logging
import uuid

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from app.config import normalize_database_url
from app.ops.schema import READY_RECHECK_SECONDS, SchemaCheck, required_revisions
from app.paths import MIGRATIONS_DIR


def head_and_previous() -> tuple[str, str]:
    scripts = ScriptDirectory(str(MIGRATIONS_DIR))
    (head,) = scripts.get_heads()
    return head, scripts.get_revision(head).down_revision


@pytest.fixture
def empty_url(request, databases, tmp_path):
    """A database with no schema at all, on this test's backend."""
    backend = request.getfixturevalue("backend")
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.sqlite3'}"
        return
    server = databases(backend)
    name = f"lk_empty_{uuid.uuid4().hex[:8]}"
    with server.admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    try:
        yield (
            make_url(server.url)
            .set(database=name)
            .render_as_string(hide_password=False)
        )
    finally:
        with server.admin.connect() as conn:
            force = " WITH (FORCE)" if backend == "postgresql" else ""
            conn.execute(text(f"DROP DATABASE IF EXISTS {name}{force}"))


def stamp(url: str, revision: str) -> None:
    engine = create_engine(normalize_database_url(url))
    try:
        with engine.begin() as conn:
            conn.execute(
                text("UPDATE alembic_version SET version_num = :r"), {"r": revision}
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


@pytest.mark.usefixtures("backend")
def test_a_database_a_newer_release_migrated_stays_ready(make_app, database_url):
    head, _ = head_and_previous()
    stamp(database_url, "9999_from_a_newer_release")
    try:
        response = make_app().test_client().get("/healthz")
    finally:
        stamp(database_url, head)
    assert response.status_code == 200


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
