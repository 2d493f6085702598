"""The app factory: paths, configuration precedence, first start."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from lockkeeper_core.schema import VERSION_TABLE
from sqlalchemy import create_engine, inspect, text

from app import create_app
from app.config import ConfigError, normalize_database_url
from app.paths import INSTANCE_DIR, STATIC_DIR, TEMPLATES_DIR
from bench.ports import free_port


def test_top_level_folders_exist_and_are_wired_absolutely(app):
    assert Path(app.template_folder) == TEMPLATES_DIR
    assert Path(app.static_folder) == STATIC_DIR
    for folder in (TEMPLATES_DIR, STATIC_DIR, INSTANCE_DIR):
        assert folder.is_dir()
    assert os.path.isabs(app.instance_path)


def test_instance_config_file_is_overridden_by_env_and_then_by_test_map(
    tmp_path, monkeypatch
):
    instance = tmp_path / "instance"
    instance.mkdir()
    (instance / "config.py").write_text(
        "LOCKKEEPER_DEFAULT_TTL = 11.0\nLOCKKEEPER_MAX_TTL = 100.0\n"
        "LOCKKEEPER_EXPIRING_WITHIN = 3.0\n"
    )
    monkeypatch.setenv("LOCKKEEPER_INSTANCE_PATH", str(instance))
    monkeypatch.setenv("LOCKKEEPER_MAX_TTL", "200")
    app = create_app({"LOCKKEEPER_EXPIRING_WITHIN": 5.0, "LOCKKEEPER_BOOTSTRAP": False})
    assert app.instance_path == str(instance)
    assert app.config["LOCKKEEPER_DEFAULT_TTL"] == 11.0  # file
    assert app.config["LOCKKEEPER_MAX_TTL"] == 200.0  # env beats file
    assert app.config["LOCKKEEPER_EXPIRING_WITHIN"] == 5.0  # test map beats env
    assert app.config["SQLALCHEMY_DATABASE_URI"] == (
        f"sqlite:///{instance / 'lockkeeper.sqlite3'}"
    )


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"LOCKKEEPER_MAX_TTL": 0.0}, "LOCKKEEPER_MAX_TTL"),
        ({"LOCKKEEPER_DEFAULT_TTL": 100.0, "LOCKKEEPER_MAX_TTL": 10.0}, "exceed"),
        ({"LOCKKEEPER_EXPIRING_WITHIN": -1.0}, "EXPIRING_WITHIN"),
    ],
)
def test_unusable_settings_stop_the_start_with_a_clear_message(
    tmp_path, config, message
):
    with pytest.raises(ConfigError, match=message):
        create_app({"LOCKKEEPER_INSTANCE_PATH": str(tmp_path), **config})


def test_bootstrap_can_be_switched_off_from_the_environment(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("LOCKKEEPER_BOOTSTRAP", "false")
    app = create_app({"LOCKKEEPER_INSTANCE_PATH": str(tmp_path)})
    assert app.config["LOCKKEEPER_BOOTSTRAP"] is False
    assert "created operator" not in capsys.readouterr().err


def test_non_numeric_environment_setting_is_a_config_error(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCKKEEPER_DEFAULT_TTL", "thirty")
    with pytest.raises(ConfigError, match="LOCKKEEPER_DEFAULT_TTL"):
        create_app({"LOCKKEEPER_INSTANCE_PATH": str(tmp_path)})


@pytest.mark.parametrize(
    ("written", "used"),
    [
        ("postgresql://u@db/locks", "postgresql+psycopg://u@db/locks"),
        ("postgres://u@db/locks", "postgresql+psycopg://u@db/locks"),
        ("mysql://u:p@db/locks", "mysql+pymysql://u:p@db/locks"),
        ("mariadb://u@db/locks", "mariadb+pymysql://u@db/locks"),
        ("postgresql+psycopg2://u@db/x", "postgresql+psycopg2://u@db/x"),
        ("sqlite:////tmp/x.db", "sqlite:////tmp/x.db"),
    ],
)
def test_database_urls_work_as_users_write_them(written, used):
    assert normalize_database_url(written) == used


def test_first_start_on_empty_sqlite_creates_schema_key_and_bootstrap(tmp_path, capsys):
    app = create_app({"LOCKKEEPER_INSTANCE_PATH": str(tmp_path)})
    engine = create_engine(app.config["SQLALCHEMY_DATABASE_URI"])
    assert {"distributed_locks", "lock_events", "users", "api_tokens"} <= set(
        inspect(engine).get_table_names()
    )
    engine.dispose()
    assert (tmp_path / "secret_key").read_text().strip() == app.config["SECRET_KEY"]
    printed = capsys.readouterr().err
    assert "created operator 'admin'" in printed
    assert re.search(r'"token": "lk_\S+"', printed)
    # A second start finds everything in place and prints no credentials.
    again = create_app({"LOCKKEEPER_INSTANCE_PATH": str(tmp_path)})
    assert again.config["SECRET_KEY"] == app.config["SECRET_KEY"]
    assert "created operator" not in capsys.readouterr().err


@pytest.mark.slow
def test_four_gunicorn_workers_on_an_empty_database_start_once(tmp_path):
    """One schema, one secret key, one admin and one token, printed once."""
    port = free_port()
    env = {**os.environ, "LOCKKEEPER_INSTANCE_PATH": str(tmp_path)}
    env.pop("LOCKKEEPER_DATABASE_URL", None)
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "app:create_app()",
            "-w",
            "4",
            "--no-control-socket",
            "-b",
            f"127.0.0.1:{port}",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/login", timeout=1).is_success:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        else:
            pytest.fail("gunicorn did not answer within 60 s")
        time.sleep(2)  # let the slowest worker finish its start
    finally:
        server.send_signal(signal.SIGTERM)
        _, stderr = server.communicate(timeout=60)
    assert stderr.count("created operator 'admin'") == 1, stderr
    assert stderr.count("and API token 'bootstrap'") == 1
    assert "Traceback" not in stderr
    engine = create_engine(f"sqlite:///{tmp_path / 'lockkeeper.sqlite3'}")
    with engine.connect() as conn:
        assert conn.scalar(text("SELECT count(*) FROM users")) == 1
        assert conn.scalar(text("SELECT count(*) FROM api_tokens")) == 1
        assert conn.scalar(text(f"SELECT count(*) FROM {VERSION_TABLE}")) == 1
    engine.dispose()
    assert len(list(tmp_path.glob(".secret_key.*"))) == 0
