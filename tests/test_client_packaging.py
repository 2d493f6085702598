"""The worker client and the lock core as distributions of their own: built from
``client/`` and ``core/`` into fresh virtual environments, with nothing of the
web server, usable from a worker project with its own ``app`` package."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest
from lockkeeper_client import LockClient, LockMissing

from app.paths import PROJECT_ROOT
from tests.live_server import serve

pytest_plugins = ["tests.live_server"]
# These tests on one pytest-xdist worker: each worker would build its own
# venvs (a venv and a pip install, 15 s of CPU each).
pytestmark = pytest.mark.xdist_group("client-venv")

# What the server needs and a worker must never be made to install.
SERVER_ONLY = {
    "flask",
    "flask-sqlalchemy",
    "flask-migrate",
    "sqlalchemy",
    "alembic",
    "psycopg",
    "psycopg-binary",
    "pymysql",
    "gunicorn",
    "prometheus-client",
    "lockkeeper",
}


def _run(*args, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(args, capture_output=True, text=True, timeout=300, **kwargs)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory) -> Path:
    """``pip install ./client`` into a new virtual environment."""
    root = tmp_path_factory.mktemp("client-dist")
    source = _copy("client", root)
    venv = root / "venv"
    _run(sys.executable, "-m", "venv", str(venv))
    _run(str(venv / "bin" / "pip"), "install", "-q", str(source))
    return venv


def _copy(name: str, root: Path) -> Path:
    """A copy of a distribution's folder: a build writes into its source tree,
    and tests run in parallel."""
    source = root / name
    shutil.copytree(
        PROJECT_ROOT / name,
        source,
        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"),
    )
    return source


@pytest.fixture(scope="module")
def embedded_venv(tmp_path_factory) -> Path:
    """What a worker that locks in its own process installs: the client and the
    core's ``embedded`` extra (SQLite: no driver)."""
    root = tmp_path_factory.mktemp("core-dist")
    client, core = _copy("client", root), _copy("core", root)
    venv = root / "venv"
    _run(sys.executable, "-m", "venv", str(venv))
    _run(str(venv / "bin" / "pip"), "install", "-q", str(client), f"{core}[embedded]")
    return venv


def _installed(venv: Path) -> dict[str, str]:
    listed = _run(str(venv / "bin" / "pip"), "list", "--format=freeze").stdout
    pairs = (line.split("==", 1) for line in listed.splitlines() if "==" in line)
    return {name.lower().replace("_", "-"): version for name, version in pairs}


@pytest.mark.slow
def test_the_client_installs_alone_without_anything_of_the_server(client_venv):
    installed = _installed(client_venv)
    assert "lockkeeper-client" in installed
    assert "httpx" in installed
    assert not SERVER_ONLY & installed.keys(), sorted(installed)


@pytest.mark.slow
def test_the_installed_client_takes_a_lock_from_a_project_with_its_own_app_package(
    client_venv, tmp_path, live_server
):
    """The most common worker layout (Flask, FastAPI) has a top-level ``app``:
    the client must neither be shadowed by it nor shadow it."""
    project = tmp_path / "worker-project"
    (project / "app").mkdir(parents=True)
    (project / "app" / "__init__.py").write_text("WORKER_APP = True\n")
    (project / "job.py").write_text(
        textwrap.dedent(
            """
            import sys

            import app
            from lockkeeper_client import LockClient

            assert app.WORKER_APP, "the project's own app package"
            assert "flask" not in sys.modules and "sqlalchemy" not in sys.modules
            with LockClient(sys.argv[1], sys.argv[2]) as client:
                with client.lock("job:packaged", ttl=10, wait=5) as lock:
                    print(lock.fence)
            """
        )
    )
    result = _run(
        str(client_venv / "bin" / "python"),
        "job.py",
        live_server.url,
        live_server.token,
        cwd=project,
    )
    assert int(result.stdout.strip()) >= 1  # granted a fence
    # A cron host with only the client has the exec command too.
    env = {
        "PATH": os.environ["PATH"],
        "LOCKKEEPER_URL": live_server.url,
        "LOCKKEEPER_TOKEN": live_server.token,
    }
    ran = _run(
        str(client_venv / "bin" / "lockkeeper-exec"),
        "job:packaged",
        "--",
        "sh",
        "-c",
        'test -n "$LOCKKEEPER_FENCE" && test -z "$LOCKKEEPER_TOKEN" && echo ran',
        cwd=project,
        env=env,
    )
    assert ran.stdout.strip() == "ran"
    with (
        LockClient(live_server.url, live_server.token) as observer,
        pytest.raises(LockMissing),
    ):
        observer.get("job:packaged")  # and released on leaving the block


# The web server's parts, which the embedded mode must not bring.
WEB_SERVER = {"flask", "werkzeug", "flask-sqlalchemy", "gunicorn"}


@pytest.mark.slow
def test_the_core_installs_for_a_worker_without_the_web_server(embedded_venv):
    installed = _installed(embedded_venv)
    assert {"lockkeeper-core", "lockkeeper-client", "sqlalchemy"} <= installed.keys()
    assert not (WEB_SERVER | {"lockkeeper"}) & installed.keys(), sorted(installed)


@pytest.mark.slow
def test_a_worker_with_its_own_app_package_locks_in_process_with_the_core(
    embedded_venv, make_app, tmp_path
):
    """A worker's environment alone creates the lock schema in a new database;
    a project with its own top-level ``app`` then takes a lock in its own
    process, in five lines, and a server on that database sees the grant in
    the lock's history. The server made only the API token."""
    database = f"sqlite:///{tmp_path / 'worker.sqlite3'}"
    core = [str(embedded_venv / "bin" / "python"), "-m", "lockkeeper_core"]
    empty = subprocess.run(
        [*core, "current", database], capture_output=True, text=True, timeout=60
    )
    assert empty.returncode == 1, empty.stdout + empty.stderr
    assert "python -m lockkeeper_core upgrade" in empty.stdout
    upgraded = _run(*core, "upgrade", database).stdout
    assert upgraded.startswith("Upgraded the database from revision none to ")
    assert _run(*core, "current", database).stdout.endswith("ready: this code's head\n")

    project = tmp_path / "worker-project"
    (project / "app").mkdir(parents=True)
    (project / "app" / "__init__.py").write_text("WORKER_APP = True\n")
    (project / "job.py").write_text(
        textwrap.dedent(
            """
            import sys

            import app
            from lockkeeper_client import LockClient
            from lockkeeper_core.embedded import EmbeddedTransport

            transport = EmbeddedTransport(sys.argv[1])
            with LockClient("http://embedded", sys.argv[2], transport=transport) as c:
                with c.lock("job:embedded", ttl=10) as lock:
                    print(lock.fence)

            assert app.WORKER_APP, "the project's own app package"
            assert not any(m.partition(".")[0] == "flask" for m in sys.modules)
            """
        )
    )
    with serve(make_app(LOCKKEEPER_DATABASE_URL=database)) as server:
        result = _run(
            str(embedded_venv / "bin" / "python"),
            "job.py",
            database,
            server.token,
            cwd=project,
        )
        fence = int(result.stdout.strip())
        history = httpx.get(
            f"{server.url}/api/v1/locks/job:embedded/events",
            headers=server.auth_headers,
        ).json()["events"]
    assert [event["action"] for event in history if event["fence"] == fence] == [
        "released",  # newest first
        "acquired",
    ]
