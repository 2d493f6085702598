"""The CLI an operator leans on: the first-start bootstrap only where a server
starts, the database every command acts on named (password hidden) and never
guessed, the service's environment file, Lockkeeper's own version and help."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, func, select, text

from app.auth.models import User
from app.auth.service import create_token, create_user
from app.cli.main import build_cli
from app.extensions import db
from app.paths import PROJECT_ROOT
from tests.databases import SERVER_URLS

LOCKKEEPER = [sys.executable, "-c", "from app.cli.main import main; main()"]


def run_cli(*args: str, env: dict[str, str], stdin: str | None = None):
    return subprocess.run(
        [*LOCKKEEPER, *args],
        env={"PATH": os.environ["PATH"], **env},
        input=stdin,
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        timeout=60,
    )


def counts(url: str) -> tuple[int, int]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            users = conn.execute(text("SELECT count(*) FROM users")).scalar()
            tokens = conn.execute(text("SELECT count(*) FROM api_tokens")).scalar()
    finally:
        engine.dispose()
    return users, tokens


@pytest.fixture
def env(database_url, tmp_path) -> dict[str, str]:
    return {
        "LOCKKEEPER_DATABASE_URL": database_url,
        "LOCKKEEPER_INSTANCE_PATH": str(tmp_path / "instance"),
    }


@pytest.mark.slow
def test_help_db_current_and_users_create_bootstrap_nothing(env, database_url):
    for args, stdin in (
        (("--help",), None),
        (("db", "current"), None),
        (("users", "--help"), None),
        (("tokens", "list"), None),
        (
            ("users", "create", "alice", "--role", "operator", "--password-stdin"),
            "a-long-enough-password\n",
        ),
    ):
        result = run_cli(*args, env=env, stdin=stdin)
        assert result.returncode == 0, (args, result.stderr)
        assert "Lockkeeper first start:" not in result.stderr + result.stdout, args
        assert "bootstrap" not in result.stdout, args
    assert counts(database_url) == (1, 0)  # alice, and no 'admin' nor token


def test_a_development_server_start_bootstraps_the_empty_database(env, database_url):
    port = 20000 + os.getpid() % 20000
    server = subprocess.Popen(
        [*LOCKKEEPER, "run", "--port", str(port), "--no-reload"],
        env={"PATH": os.environ["PATH"], **env},
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        cwd=PROJECT_ROOT,
    )
    try:
        seen = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = server.stderr.readline()
            seen.append(line)
            if '"first_start"' in line or server.poll() is not None:
                break
        assert any("created operator 'admin'" in line for line in seen), seen
    finally:
        server.terminate()
        server.wait(timeout=10)
    assert counts(database_url) == (1, 1)


def test_a_development_server_creates_the_default_sqlite_file_private(tmp_path):
    instance = tmp_path / "instance"
    port = 20000 + (os.getpid() + 7) % 20000
    server = subprocess.Popen(
        [*LOCKKEEPER, "run", "--port", str(port), "--no-reload"],
        env={
            "PATH": os.environ["PATH"],
            "LOCKKEEPER_INSTANCE_PATH": str(instance),
            "LOCKKEEPER_BOOTSTRAP": "false",
        },
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        cwd=PROJECT_ROOT,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and server.poll() is None:
            if "start: the lock database is at revision" in server.stderr.readline():
                break
    finally:
        server.terminate()
        server.wait(timeout=10)
    database = instance / "lockkeeper.sqlite3"
    assert database.stat().st_mode & 0o777 == 0o600
    assert (instance / "secret_key").stat().st_mode & 0o777 == 0o600
    assert instance.stat().st_mode & 0o777 == 0o700


@pytest.mark.slow
def test_every_command_on_locks_users_tokens_names_its_database(
    env, databases, tmp_path
):
    url = SERVER_URLS["postgresql"].replace("postgres@", "postgres:s3cret@", 1)
    databases("postgresql")  # the server is there
    for group in ("locks", "users", "tokens", "events"):
        sub = "export" if group == "events" else "list"
        result = run_cli(group, sub, env={**env, "LOCKKEEPER_DATABASE_URL": url})
        assert "lockkeeper: database postgresql+psycopg://postgres:***@" in (
            result.stderr
        ), (group, result.stderr)
        assert "s3cret" not in result.stderr + result.stdout


@pytest.mark.slow
def test_the_sqlite_default_nobody_created_is_refused_not_used(tmp_path):
    env = {"LOCKKEEPER_INSTANCE_PATH": str(tmp_path / "instance")}
    assert run_cli("--help", env=env).returncode == 0
    # Nor a secret key: no command but a server's start needs one written.
    assert not (tmp_path / "instance" / "secret_key").exists()
    for args in (("locks", "list"), ("users", "list"), ("db", "current")):
        result = run_cli(*args, env=env)
        assert result.returncode == 1, (args, result.stderr)
        assert "no database is configured" in result.stderr
        assert "-e FILE" in result.stderr
    assert not (tmp_path / "instance" / "lockkeeper.sqlite3").exists()
    upgraded = run_cli("db", "upgrade", env=env)
    assert upgraded.returncode == 0, upgraded.stderr
    assert "Upgraded the database from revision none to" in upgraded.stdout
    again = run_cli("db", "upgrade", env=env)
    assert "nothing to do" in again.stdout
    assert run_cli("locks", "list", env=env).returncode == 0


def test_a_database_behind_is_refused_with_the_command_to_run(env, tmp_path):
    empty = {**env, "LOCKKEEPER_DATABASE_URL": f"sqlite:///{tmp_path / 'e.db'}"}
    result = run_cli("locks", "list", env=empty)
    assert result.returncode == 1
    assert "run `lockkeeper db upgrade`" in result.stderr


def test_the_env_file_option_loads_the_services_environment(env, tmp_path):
    env_file = tmp_path / "lockkeeper.env"
    env_file.write_text(
        "# as systemd's EnvironmentFile= reads it\n"
        f"LOCKKEEPER_DATABASE_URL={env['LOCKKEEPER_DATABASE_URL']}\n"
    )
    shell = {
        "LOCKKEEPER_INSTANCE_PATH": env["LOCKKEEPER_INSTANCE_PATH"],
        # A stale export in the shell: the file named on purpose wins.
        "LOCKKEEPER_DATABASE_URL": f"sqlite:///{tmp_path / 'elsewhere.db'}",
    }
    result = run_cli("-e", str(env_file), "users", "list", env=shell)
    assert result.returncode == 0, result.stderr
    assert env["LOCKKEEPER_DATABASE_URL"] in result.stderr
    assert not (tmp_path / "elsewhere.db").exists()


def test_version_is_lockkeepers_and_flask_internals_are_not_offered():
    from lockkeeper_core.schema import required_revisions

    from app.ops.version import RELEASE

    runner = build_cli()
    from click.testing import CliRunner

    version = CliRunner().invoke(runner, ["--version"])
    (head,) = required_revisions()
    assert version.output.strip() == f"lockkeeper {RELEASE} (schema {head})"
    assert "Flask" not in version.output
    helped = CliRunner().invoke(
        runner, ["--help"], env={"LOCKKEEPER_INSTANCE_PATH": "/nonexistent/x"}
    )
    commands = [
        line.split()[0]
        for line in helped.output.split("Commands:")[1].splitlines()
        if line.strip()
    ]
    assert commands == ["db", "events", "exec", "locks", "run", "tokens", "users"]
    assert "--app" not in helped.output
    assert "-A," not in helped.output
    assert "--env-file" in helped.output


def test_users_list_shows_the_accounts_and_delete_removes_one(app, runner):
    with app.app_context():
        create_user("admin", "a-long-enough-password", "operator")
        create_user("vic", "a-long-enough-password", "viewer")
    assert runner.invoke(args=["users", "disable", "vic"]).exit_code == 0

    listed = runner.invoke(args=["users", "list"])
    assert listed.exit_code == 0, listed.output
    rows = [line.split("\t")[:3] for line in listed.stdout.splitlines()]
    assert rows == [
        ["name", "role", "status"],
        ["admin", "operator", "active"],
        ["vic", "viewer", "disabled"],
    ]
    deleted = runner.invoke(args=["users", "delete", "admin"])
    assert deleted.exit_code == 0, deleted.output
    with app.app_context():
        assert db.session.scalar(select(func.count()).select_from(User)) == 1
    missing = runner.invoke(args=["users", "delete", "admin"])
    assert missing.exit_code == 1
    assert "no user named 'admin'" in missing.output


def test_the_cli_runner_names_the_database_on_stderr(app, runner):
    with app.app_context():
        create_token("worker")
    result = runner.invoke(args=["tokens", "list"])
    assert result.exit_code == 0
    assert "lockkeeper: database sqlite:///" in result.stderr
    assert "lockkeeper: database" not in result.stdout
    assert Path(app.instance_path).name == "instance"
