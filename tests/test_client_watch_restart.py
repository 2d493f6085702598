"""``watch()`` with its defaults follows the audit log across a server restart:
the old server ends its streams at once on a graceful shutdown (a reconnect
hint), the watcher waits out the downtime with its own backoff, and resumes
exactly where it was on the new server."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from lockkeeper_client import LockClient
from werkzeug.serving import make_server

from app.api.events import stop_streams

pytestmark = [
    pytest.mark.usefixtures("backend"),
    pytest.mark.backends("sqlite", "postgresql"),
]


@contextmanager
def serving(app, port: int = 0) -> Iterator[int]:
    server = make_server("127.0.0.1", port, app, threaded=True)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _deadline_poll(condition, what: str, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen in {seconds} s"
        time.sleep(0.02)


def test_a_default_watch_follows_across_a_restart_with_every_event_once(make_app):
    from app.auth.service import create_token

    first = make_app()
    with first.app_context():
        token = create_token("watcher")
    seen: list[int] = []
    failure: list[BaseException] = []

    with serving(first) as port:
        url = f"http://127.0.0.1:{port}"
        client = LockClient(url, token)
        stream = client.watch(prefix="restart:")

        def follow() -> None:
            try:
                for event in stream:
                    seen.append(event.id)
                    if len(seen) == 20:
                        return
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                failure.append(exc)

        watcher = threading.Thread(target=follow, daemon=True)
        watcher.start()
        _deadline_poll(lambda: _streams_open(first) == 1, "the watcher's stream")
        for n in range(10):
            client.acquire(f"restart:{n}", "w", ttl=30)
        _deadline_poll(lambda: len(seen) == 10, "the first ten events")
        stopped_at = time.monotonic()
        stop_streams(first)  # what SIGTERM does to a gunicorn worker
        _deadline_poll(lambda: _streams_open(first) == 0, "the stream's end", 2)
        assert time.monotonic() - stopped_at < 1.0
    # Down for 2.5 s: the ordinary calls' 4 retries (about 1.5 s) would give up.
    time.sleep(2.5)
    second = make_app()  # the same database, a new process's app
    with serving(second, port):
        with LockClient(url, token) as writer:
            for n in range(10, 20):
                writer.acquire(f"restart:{n}", "w", ttl=30)
        watcher.join(30)
    client.close()
    assert not failure, failure
    assert len(seen) == 20
    assert seen == sorted(set(seen))  # once each, in order


def _streams_open(app) -> int:
    from app.api.events import STREAMS

    streams = app.extensions.get(STREAMS)
    if streams is None or streams._slots is None:
        return 0
    return streams.limit - streams._slots._value
