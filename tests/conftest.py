"""Fixtures: a fresh app per test from the factory, on SQLite by default.

A test (or module, via ``pytestmark = pytest.mark.usefixtures("backend")``) that
uses the ``backend`` fixture runs once per database: SQLite, PostgreSQL, MariaDB,
or only on those its ``@pytest.mark.backends("postgresql", ...)`` names.
"""

from __future__ import annotations

import functools
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import text
from sqlalchemy.engine import make_url

from app import create_app
from app.audit import refusals
from app.extensions import db
from tests.clock import FakeClock
from tests.connections import ORDINARY_SHARE, budget_for
from tests.dashboard_helpers import log_in, make_user
from tests.databases import (
    BACKENDS,
    SERVER_URLS,
    ServerDatabase,
    SqliteDatabases,
    unavailable,
)


def _same_checkout() -> None:
    """The lock core under test is this checkout's ``core/``, as ``app`` is: an
    environment installed from another clone would test that clone's core."""
    import lockkeeper_core

    from app.paths import PROJECT_ROOT

    found = Path(lockkeeper_core.__file__).resolve()
    if not found.is_relative_to(PROJECT_ROOT / "core" / "src"):
        raise pytest.UsageError(
            f"lockkeeper_core is imported from {found.parent}, not from this"
            f" checkout's {PROJECT_ROOT / 'core' / 'src'}: install it with"
            " `pip install -e ./core` or put that folder on PYTHONPATH"
        )


_same_checkout()

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


# First: pytest-xdist's worker turns each item's ``xdist_group`` marker into its
# node id's ``@group`` suffix in this same hook, and this conftest is loaded
# before the worker registers it, so without ``tryfirst`` the markers of
# ``schedule_for_workers`` came after that and no group was ever kept together.
@pytest.hookimpl(tryfirst=True)
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
    schedule_for_workers(items)


# Tests that share one pytest-xdist worker (``--dist loadgroup``), one after the
# other: the browser tests (one Chromium, and countdowns and polls that a second
# browser on two cores would make late) and the fault runs (each starts its own
# database servers and app instances, and judges recovery times).
WORKER_GROUPS = {"browser": "browser", "faults": "faults"}


def schedule_for_workers(items) -> None:
    """The longest tests first, so that no worker is left with one at the end
    while the others idle; each group of ``WORKER_GROUPS`` on a worker of its own.
    Without ``-n`` this is only an order."""
    for item in items:
        folder = item.path.parent.name
        if folder in WORKER_GROUPS:
            item.add_marker(pytest.mark.xdist_group(WORKER_GROUPS[folder]))

    def weight(item) -> int:
        if item.path.parent.name in WORKER_GROUPS:
            return 0
        return 1 if item.get_closest_marker("slow") else 2

    items.sort(key=weight)


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


# Operator passwords are hashed with scrypt (about 100 ms of CPU to hash and as
# much to check): hundreds of tests create and log in users. A one-round hash
# keeps what they test (a hash is stored and checked, never the password) at a
# fraction of the cost; login checks read the method from the stored hash.
CHEAP_PASSWORD_HASH = "pbkdf2:sha256:1"


@pytest.fixture(autouse=True, scope="session")
def cheap_password_hashes() -> Iterator[None]:
    from werkzeug.security import generate_password_hash

    from app.auth import service

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            service,
            "generate_password_hash",
            functools.partial(generate_password_hash, method=CHEAP_PASSWORD_HASH),
        )
        yield


@pytest.fixture(autouse=True)
def server_connections(request) -> Iterator[None]:
    """Every test on a server database holds its share of that server's
    connections (``tests/connections.py``) for its whole run: an ordinary share,
    or the ``@pytest.mark.connections(N)`` it declares. A test that uses a
    server without the ``backend`` fixture names it: ``connections(N,
    backend="postgresql")``."""
    marker = request.node.get_closest_marker("connections")
    callspec = getattr(request.node, "callspec", None)
    backend = callspec.params.get("backend") if callspec else None
    count = ORDINARY_SHARE
    if marker is not None:
        count = marker.args[0]
        backend = marker.kwargs.get("backend", backend)
        if backend not in SERVER_URLS:
            # A race on SQLite opens no server connection, but it takes the
            # same share of the one budget every race draws on: two races at
            # once starve each other's threads of this machine's cores, and a
            # SQLite writer starved past its busy timeout fails.
            backend = "postgresql"
    budget = budget_for(SERVER_URLS[backend]) if backend in SERVER_URLS else None
    if budget is None:  # SQLite, or a server that is not there (the test says so)
        yield
        return
    with budget.share(count, request.node.nodeid):
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
def empty_url(request, databases, tmp_path) -> Iterator[str]:
    """A database with no schema at all, on this test's backend."""
    backend = (
        request.getfixturevalue("backend")
        if "backend" in request.fixturenames
        else "sqlite"
    )
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
    from app.extensions import lock_service

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


CPU_AT_START = pytest.StashKey[tuple[int, int] | None]()


def _cpu_ticks() -> tuple[int, int] | None:
    """(busy, total) jiffies of all the machine's CPUs since boot (Linux)."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()[1:]
    except OSError:
        return None
    ticks = [int(value) for value in fields]
    idle = ticks[3] + ticks[4]  # idle, iowait
    return sum(ticks) - idle, sum(ticks)


def pytest_sessionstart(session):
    session.config.stash[CPU_AT_START] = _cpu_ticks()


def pytest_terminal_summary(terminalreporter):
    """How busy the machine's cores were over the run (whether more or fewer
    xdist workers would help: idle cores say more), and tooz's own suite, which
    runs inside one of our tests: its summary lines."""
    start, end = terminalreporter.config.stash.get(CPU_AT_START, None), _cpu_ticks()
    if start is not None and end is not None and end[1] > start[1]:
        busy = (end[0] - start[0]) / (end[1] - start[1])
        terminalreporter.line(
            f"the machine's {os.cpu_count()} CPUs were {busy:.0%} busy over the run"
        )
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
