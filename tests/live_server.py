"""A real HTTP server for tests that need one (worker client, exec, browsers, faults).

``serve(app)`` runs the app under Werkzeug's threaded WSGI server on 127.0.0.1 and
an ephemeral port, in a background thread of the test process. The ``live_server``
fixture gives every test its own server on a fresh *file* SQLite database (an
in-memory one is a single shared connection: concurrency would prove nothing)
and a fresh API token.

Use it from a test module with::

    pytest_plugins = ["tests.live_server"]

    def test_something(live_server):
        httpx.get(live_server.url + "/api/v1/locks",
                  headers=live_server.auth_headers)

For a longer-lived server (a browser session), build the app yourself and use
``with serve(app) as server:`` in a fixture of the scope you need.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
from flask import Flask
from werkzeug.serving import make_server

TOKEN_NAME = "live-server"


@dataclass
class LiveServer:
    """A running server: its root URL, an API token, and the app it serves."""

    app: Flask
    url: str
    token: str

    @property
    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def create_token(self, name: str) -> str:
        from app.auth.service import create_token

        with self.app.app_context():
            return create_token(name)

    def revoke_token(self, name: str) -> None:
        from app.auth.service import revoke_token

        with self.app.app_context():
            revoke_token(name)

    @contextmanager
    def service(self):
        """The server's LockService, in an app context of this (the test) thread."""
        from app.extensions import lock_service

        with self.app.app_context():
            yield lock_service()

    def force_release(self, resource: str, reason: str = "test") -> None:
        """What an operator does from the dashboard or ``locks release``."""
        with self.service() as locks:
            locks.force_release(resource, actor="operator:test", reason=reason)


@contextmanager
def serve(app: Flask, token: str | None = None) -> Iterator[LiveServer]:
    """Serve ``app`` on 127.0.0.1 until the block ends.

    Without ``token`` a fresh API token named ``live-server`` is created in the
    app's database (which must have its schema).
    """
    if token is None:
        from app.auth.service import create_token

        with app.app_context():
            token = create_token(TOKEN_NAME)
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(
        target=server.serve_forever,
        kwargs={"poll_interval": 0.05},
        name="live-server",
        daemon=True,
    )
    thread.start()
    try:
        yield LiveServer(
            app=app, url=f"http://127.0.0.1:{server.server_port}", token=token
        )
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def live_server(make_app) -> Iterator[LiveServer]:
    """A server for this test alone, on a fresh file SQLite database.

    CSRF stays on (the API is exempt by design; browser tests need it on).
    """
    app = make_app()
    with serve(app) as server:
        yield server
