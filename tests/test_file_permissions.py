"""The SQLite database, its -wal/-shm, the secret key and the instance folder are
readable by their owner only, however they were created (first start, gunicorn
workers racing, or an older version that left them 0644)."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from app import create_app
from app.extensions import db
from bench.ports import free_port


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@contextmanager
def umask(value: int):
    old = os.umask(value)
    try:
        yield
    finally:
        os.umask(old)


def private_files(instance: Path) -> dict[str, int]:
    names = ("lockkeeper.sqlite3", "lockkeeper.sqlite3-wal", "lockkeeper.sqlite3-shm")
    found = {name: mode(instance / name) for name in names}
    found["secret_key"] = mode(instance / "secret_key")
    found["instance/"] = mode(instance)
    return found


EXPECTED = {
    "lockkeeper.sqlite3": 0o600,
    "lockkeeper.sqlite3-wal": 0o600,
    "lockkeeper.sqlite3-shm": 0o600,
    "secret_key": 0o600,
    "instance/": 0o700,
}


def start(instance: Path):
    return create_app(
        {
            "LOCKKEEPER_INSTANCE_PATH": str(instance),
            "LOCKKEEPER_BOOTSTRAP": False,
            "LOCKKEEPER_AUTO_MIGRATE": True,
        }
    )


def test_a_first_start_creates_everything_owner_only(tmp_path, monkeypatch):
    monkeypatch.delenv("LOCKKEEPER_DATABASE_URL", raising=False)
    monkeypatch.delenv("LOCKKEEPER_SECRET_KEY", raising=False)
    instance = tmp_path / "instance"
    with umask(0o022):  # the usual umask: files 0644 unless we say otherwise
        app = start(instance)
        with app.app_context():
            with db.engine.connect() as conn:  # the WAL files exist while open
                conn.execute(text("SELECT count(*) FROM users"))
                assert private_files(instance) == EXPECTED
            db.engine.dispose()
    assert not list(instance.glob(".secret_key.*"))


def test_files_an_older_version_left_readable_are_tightened(tmp_path, monkeypatch):
    monkeypatch.delenv("LOCKKEEPER_DATABASE_URL", raising=False)
    monkeypatch.delenv("LOCKKEEPER_SECRET_KEY", raising=False)
    instance = tmp_path / "instance"
    with umask(0o022):
        app = start(instance)
        with app.app_context():
            with db.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
                for path in instance.iterdir():
                    path.chmod(0o644)
                instance.chmod(0o755)
                again = start(instance)
                assert private_files(instance) == EXPECTED
            db.engine.dispose()
        with again.app_context():
            db.engine.dispose()


@pytest.mark.slow
def test_gunicorn_workers_on_a_fresh_instance_create_private_files(tmp_path):
    instance = tmp_path / "instance"
    port = free_port()
    env = {**os.environ, "LOCKKEEPER_INSTANCE_PATH": str(instance)}
    for name in ("LOCKKEEPER_DATABASE_URL", "LOCKKEEPER_SECRET_KEY"):
        env.pop(name, None)
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "app:create_app()",
            "-w",
            "2",
            "--no-control-socket",
            "-b",
            f"127.0.0.1:{port}",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: os.umask(0o022),
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/login", timeout=1).is_success:
                    break
            except httpx.TransportError:
                pass
            assert server.poll() is None, server.stderr.read()
            assert time.monotonic() < deadline, "gunicorn did not come up"
            time.sleep(0.1)
        assert private_files(instance) == EXPECTED
    finally:
        server.send_signal(signal.SIGTERM)
        server.communicate(timeout=60)
