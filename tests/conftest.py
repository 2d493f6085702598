"""Fixtures: a fresh app per test from the factory, on SQLite by default.

A test (or module, via ``pytestmark = pytest.mark.usefixtures("backend")``) that
uses the ``backend`` fixture runs once per database: SQLite, PostgreSQL, MariaDB,
or only on those its ``@pytest.mark.backends("postgresql", ...)`` names.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from filelock import FileLock
from flask import Flask

from app import create_app
from app.audit import refusals
from app.extensions import db
from tests.clock import FakeClock
from tests.dashboard_helpers import log_in, make_user
from tests.databases import BACKENDS, ServerDatabase, SqliteDatabases, unavailable

# Apps that tests build outside `make_app` (races, fault harness) and the servers
# they start count refused acquires too: no flusher thread of theirs may write
# into a database another test is using meanwhile. Tests flush by hand.
os.environ.setdefault("LOCKKEEPER_REFUSALS_FLUSH_SECONDS", "0")

# `live_server`: the app under a real threaded HTTP server (worker client, browsers).
pytest_plugins = ["tests.live_server"]


def pytest_addoption(parser):
    parser.addoption(
        "--backends",
        default=",".join(BACKENDS),
        help="comma-separated databases for tests that use the `backend` fixture",
    )


def pytest_generate_tests(metafunc):
    if "backend" in metafunc.fixturenames:
        chosen = metafunc.config.getoption("--backends").split(",")
        metafunc.parametrize(
            "backend", [b for b in backends_of(metafunc.definition) if b in chosen]
        )


def pytest_collection_modifyitems(config, items):
    """A case whose databases are none of the chosen ones is deselected, not
    skipped for an empty parameter set."""
    chosen = config.getoption("--backends").split(",")
    kept, dropped = [], []
    for item in items:
        applies = "backend" not in getattr(item, "fixturenames", ()) or any(
            b in chosen for b in backends_of(item)
        )
        (kept if applies else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def backends_of(item) -> tuple[str, ...]:
    """The databases a test applies to: every one, or those its closest
    ``@pytest.mark.backends(...)`` names (a case that does not apply to a
    database is not collected there, rather than passing without checking)."""
    marker = item.get_closest_marker("backends")
    if marker is None:
        return BACKENDS
    unknown = set(marker.args) - set(BACKENDS)
    if unknown or not marker.args:
        raise pytest.UsageError(f"{item.nodeid}: backends{marker.args}: unknown")
    return tuple(b for b in BACKENDS if b in marker.args)


_databases: dict[str, Any] = {}


@pytest.fixture(scope="session")
def databases(tmp_path_factory) -> Iterator[Callable[[str], Any]]:
    """Opens each backend once per session, on first use."""
    workdir = tmp_path_factory.mktemp("databases")

    def get(backend: str):
        if backend not in _databases:
            try:
                if backend == "sqlite":
                    _databases[backend] = SqliteDatabases(workdir)
                else:
                    _databases[backend] = ServerDatabase(backend, workdir)
            except ConnectionError as exc:
                _databases[backend] = exc
        found = _databases[backend]
        if isinstance(found, Exception):
            unavailable(str(found))
        return found

    yield get
    # What the apps counted goes to their databases while these still exist,
    # not at the interpreter's exit, after the server databases were dropped.
    refusals.stop_all()
    for found in _databases.values():
        if not isinstance(found, Exception):
            found.close()
    _databases.clear()


@pytest.fixture
def many_connections(tmp_path_factory) -> Iterator[None]:
    """Held by a test that opens dozens of server connections (the races of 32
    clients): one such test at a time on this machine, across pytest-xdist
    workers and concurrent sessions, so that two of them never exceed the
    server's ``max_connections`` (100 by default) together."""
    shared = tmp_path_factory.getbasetemp().parent
    if "PYTEST_XDIST_WORKER" in os.environ:
        shared = shared.parent  # the workers' common folder
    with FileLock(str(shared / "many-connections.lock")):
        yield


@pytest.fixture
def database_url(request, databases, tmp_path) -> str:
    """A database with the schema and no rows, on this test's backend."""
    backend = (
        request.getfixturevalue("backend")
        if "backend" in request.fixturenames
        else "sqlite"
    )
    return databases(backend).fresh(tmp_path)


@pytest.fixture
def make_app(database_url, tmp_path) -> Iterator[Callable[..., Flask]]:
    """Build apps on this test's database; ``make_app(**config)`` overrides."""
    apps: list[Flask] = []

    def build(**overrides) -> Flask:
        config = {
            "TESTING": True,
            "SECRET_KEY": "test-secret",
            "LOCKKEEPER_DATABASE_URL": database_url,
            "LOCKKEEPER_INSTANCE_PATH": str(tmp_path / "instance"),
            "LOCKKEEPER_BOOTSTRAP": False,
            "LOCKKEEPER_AUTO_MIGRATE": False,
            # No flusher thread per test app: tests flush by hand.
            "LOCKKEEPER_REFUSALS_FLUSH_SECONDS": 0,
            **overrides,
        }
        app = create_app(config)
        apps.append(app)
        return app

    yield build
    for app in apps:
        with app.app_context():
            db.session.remove()
            db.engine.dispose()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def app(make_app) -> Flask:
    """The app on the real clock (the database's, or the host's for SQLite)."""
    return make_app()


@pytest.fixture
def fake_app(make_app, clock) -> Flask:
    """The app on ``clock``, a FakeClock the test moves."""
    return make_app(LOCKKEEPER_CLOCK=clock)


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture
def runner(app):
    return app.test_cli_runner()


@pytest.fixture
def service(fake_app):
    """The LockService on a fake clock, inside an app context."""
    from app.locks.service import lock_service

    with fake_app.app_context():
        yield lock_service()


def _logged_in(app: Flask, username: str, role: str):
    make_user(app, username, role)
    client = app.test_client()
    assert log_in(client, username).status_code == 303
    return client


@pytest.fixture
def operator(fake_app):
    """A browser logged in to ``fake_app`` as the operator "olga"."""
    return _logged_in(fake_app, "olga", "operator")


@pytest.fixture
def viewer(fake_app):
    """A browser logged in to ``fake_app`` as the viewer "vic"."""
    return _logged_in(fake_app, "vic", "viewer")


class ApiClient:
    """A test client that sends the bearer token of its own API token."""

    def __init__(self, app: Flask, token_name: str = "worker", **options: Any):
        from app.auth.service import create_token

        with app.app_context():
            self.token = create_token(token_name, **options)
        self.app = app
        self.token_name = token_name
        self.client = app.test_client()

    def with_token(self, token_name: str, **options: Any) -> ApiClient:
        """Another client of the same app, under a new token ``token_name``
        (``options``: its scope, expiry and quota, as ``create_token`` takes)."""
        return ApiClient(self.app, token_name, **options)

    def open(self, method: str, path: str, **kwargs):
        headers = {"Authorization": f"Bearer {self.token}"}
        headers.update(kwargs.pop("headers", None) or {})
        return self.client.open(path, method=method, headers=headers, **kwargs)

    def get(self, path: str, **kwargs):
        return self.open("GET", path, **kwargs)

    def post(self, path: str, **kwargs):
        return self.open("POST", path, **kwargs)

    def patch(self, path: str, **kwargs):
        return self.open("PATCH", path, **kwargs)

    def delete(self, path: str, **kwargs):
        return self.open("DELETE", path, **kwargs)


@pytest.fixture
def api(fake_app) -> ApiClient:
    """An authorized JSON API client (token "worker") on ``fake_app``: move time
    with ``clock``."""
    return ApiClient(fake_app)


def pytest_terminal_summary(terminalreporter):
    """tooz's own suite runs inside one of our tests: show its summary lines."""
    lines = [
        value
        for reports in terminalreporter.stats.values()
        for report in reports
        if getattr(report, "when", None) == "call"
        for name, value in getattr(report, "user_properties", ())
        if name == "tooz_summary"
    ]
    if lines:
        terminalreporter.section("tooz test_coordination against Lockkeeper")
        for line in sorted(lines):
            terminalreporter.line(line)
