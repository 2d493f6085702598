"""The log stream is JSON lines end to end: gunicorn's own lines, the app's
warnings and errors (with the request id while serving one) and the request
lines, under a database outage too; a server that made its own metrics folder
leaves none behind."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

from app.ops.logs import JsonFormatter
from app.paths import PROJECT_ROOT
from bench.ports import free_port


def get(url: str, **headers) -> int:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status
    except urllib.error.HTTPError as error:
        return error.code


def test_the_log_stream_is_json_lines_under_a_database_outage(tmp_path):
    port, dead_port = free_port(), free_port()
    base = f"http://127.0.0.1:{port}"
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {
        "PATH": os.environ["PATH"],
        # Nobody listens there: the database is down from the first start on.
        "LOCKKEEPER_DATABASE_URL": f"postgresql://postgres@127.0.0.1:{dead_port}/x",
        "LOCKKEEPER_INSTANCE_PATH": str(tmp_path / "instance"),
        "LOCKKEEPER_SECRET_KEY": "test-secret",
        "LOCKKEEPER_WORKERS": "1",
        "LOCKKEEPER_BIND": f"127.0.0.1:{port}",
        "TMPDIR": str(temp),
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
        env=env,
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                status = get(f"{base}/livez")
                break
            except (urllib.error.URLError, ConnectionError):
                assert server.poll() is None, server.communicate()[1]
                assert time.monotonic() < deadline, "gunicorn did not come up"
                time.sleep(0.2)
        assert status == 200
        assert get(f"{base}/healthz", **{"X-Request-ID": "probe-1"}) == 503
        token = {"Authorization": "Bearer lk_not-a-real-token"}
        assert get(f"{base}/api/v1/locks", **token, **{"X-Request-ID": "api-1"}) == 503
        assert get(f"{base}/nope") == 404
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            stdout, stderr = server.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            stdout, stderr = server.communicate()

    lines = [line for line in (stdout + stderr).splitlines() if line.strip()]
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            raise AssertionError(f"not a JSON line: {line!r}") from None
    assert all(isinstance(record, dict) for record in records)
    loggers = {record.get("logger") for record in records}
    assert "gunicorn.error" in loggers  # "Starting gunicorn", "Booting worker"
    warnings = [r for r in records if r.get("level") == "warning"]
    assert any("not answering" in r["message"] for r in warnings), warnings
    # The health check's warning carries the id of the request it served.
    assert any(r.get("request_id") == "probe-1" for r in warnings), warnings
    requests = {r["request_id"]: r for r in records if r.get("event") == "request"}
    assert requests["probe-1"]["status"] == 503
    assert requests["api-1"]["status"] == 503
    # The metrics folder the server made for itself went with it.
    assert not list(temp.glob("lockkeeper-metrics-*"))


def test_an_error_with_a_traceback_stays_one_json_line():
    try:
        raise ValueError("first line\nsecond line")
    except ValueError:
        record = logging.LogRecord(
            "app", logging.ERROR, __file__, 1, "failed:\n%s", ("why",), sys.exc_info()
        )
    line = JsonFormatter().format(record)
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed["level"] == "error"
    assert parsed["message"] == "failed:\nwhy"
    assert "ValueError: first line" in parsed["exception"]
