"""A gunicorn restart does not wait for open event streams: the shipped config
ends them at SIGTERM with a reconnect hint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from app.paths import PROJECT_ROOT
from bench.ports import free_port

pytestmark = pytest.mark.slow

STREAMS = 8


def test_sigterm_to_gunicorn_with_eight_open_streams_ends_within_two_seconds(
    make_app, database_url, tmp_path
):
    from app.auth.service import create_token

    with make_app().app_context():
        token = create_token("watcher")
    port = free_port()
    env = {
        **os.environ,
        "LOCKKEEPER_DATABASE_URL": database_url,
        "LOCKKEEPER_INSTANCE_PATH": str(tmp_path / "instance"),
        "LOCKKEEPER_BIND": f"127.0.0.1:{port}",
        "LOCKKEEPER_WORKERS": "1",
        "LOCKKEEPER_MAX_STREAMS": str(STREAMS),
        # One token follows all eight: its share must admit them.
        "LOCKKEEPER_MAX_STREAMS_PER_TOKEN": str(STREAMS),
        "LOCKKEEPER_GRACEFUL_TIMEOUT": "30",
    }
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "-c",
            "python:app.ops.gunicorn_conf",
            "app:create_app()",
        ],
        cwd=PROJECT_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    ended: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/livez", timeout=1).is_success:
                    break
            except httpx.TransportError:
                pass
            assert server.poll() is None, server.stderr.read()
            assert time.monotonic() < deadline, "gunicorn did not come up"
            time.sleep(0.1)
        opened = threading.Barrier(STREAMS + 1)

        def follow() -> None:
            headers = {"Authorization": f"Bearer {token}"}
            with httpx.stream(
                "GET",
                f"{url}/api/v1/events",
                params={"follow": "true"},
                headers=headers,
                timeout=httpx.Timeout(10, read=60),
            ) as response:
                assert response.status_code == 200
                lines = response.iter_lines()
                next(lines)  # ": open": the stream is up
                opened.wait(30)
                ended.append("".join(lines))  # until the server ends it

        readers = [threading.Thread(target=follow) for _ in range(STREAMS)]
        for reader in readers:
            reader.start()
        opened.wait(30)
        stopped_at = time.monotonic()
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
        took = time.monotonic() - stopped_at
        for reader in readers:
            reader.join(10)
    finally:
        if server.poll() is None:
            server.kill()
        server.communicate(timeout=10)
    assert took < 2.0, f"gunicorn took {took:.1f} s to stop"
    assert server.returncode == 0
    assert len(ended) == STREAMS
    assert all("retry: 1000" in rest for rest in ended)
