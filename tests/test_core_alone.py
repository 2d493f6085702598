"""The lock core stands alone: a worker's own process (the embedded mode) runs
it on a plain SQLAlchemy engine where Flask cannot even be imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from lockkeeper_core.engine import autocommit
from sqlalchemy import create_engine

from app.paths import PROJECT_ROOT

# Run as its own interpreter: a finder first on ``sys.meta_path`` refuses Flask,
# every Flask extension and Werkzeug, as a worker without them installed would.
WORKER = textwrap.dedent(
    """
    import json
    import sys


    class NoWebStack:
        def find_spec(self, name, path=None, target=None):
            top = name.partition(".")[0]
            if top in ("flask", "werkzeug") or top.startswith("flask_"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None


    sys.meta_path.insert(0, NoWebStack())

    from sqlalchemy import create_engine

    from lockkeeper_core.clock import SystemClock
    from lockkeeper_core.engine import install_engine_events
    from lockkeeper_core.service import LockService, LockSettings

    engine = create_engine(sys.argv[1])
    install_engine_events(engine)
    service = LockService(engine, SystemClock(), LockSettings())
    acquired = service.acquire("embedded:job", "worker-1", 30)
    held = service.get("embedded:job")
    released = service.release("embedded:job", "worker-1")
    engine.dispose()
    web = sorted(
        name
        for name in sys.modules
        if name.partition(".")[0] in ("flask", "werkzeug")
        or name.startswith("flask_")
    )
    print(
        json.dumps(
            {
                "acquired": acquired.acquired,
                "fence": acquired.lock.fence,
                "held_by": held.owner,
                "released_fence": released.fence,
                "web_modules": web,
            }
        )
    )
    """
)


def test_the_core_acquires_and_releases_without_flask(backend, app, tmp_path):
    """The app migrates the database; the worker process then takes and gives
    back a lock through the core alone, on its own plain engine (made without
    the autocommit twin the server's engines get: the core attaches it, else
    on PostgreSQL and MariaDB every grant was silently rolled back)."""
    url = app.config["SQLALCHEMY_DATABASE_URI"]
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    finished = subprocess.run(
        [sys.executable, str(script), url],
        cwd=tmp_path,
        env={
            "PYTHONPATH": f"{PROJECT_ROOT}{os.pathsep}{PROJECT_ROOT / 'core' / 'src'}",
            "PATH": "/usr/bin:/bin",
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert finished.returncode == 0, finished.stderr
    seen = json.loads(finished.stdout)
    assert seen["acquired"] is True
    assert seen["held_by"] == "worker-1"
    assert seen["released_fence"] == seen["fence"]
    assert seen["web_modules"] == []


def test_the_worker_process_really_cannot_import_flask(tmp_path):
    """The blocker itself works: without it the test above proves nothing."""
    blocker = WORKER.split("from sqlalchemy")[0]
    script = tmp_path / "blocked.py"
    script.write_text(blocker + "import flask_sqlalchemy\n")
    finished = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert finished.returncode != 0
    assert "No module named 'flask_sqlalchemy'" in finished.stderr


# The embedded mode's whole path: the worker client on the in-process
# transport, where the web stack cannot be imported.
CLIENT_WORKER = WORKER.split("from sqlalchemy")[0] + textwrap.dedent(
    """
    from lockkeeper_client import LockClient

    from lockkeeper_core.embedded import EmbeddedTransport

    transport = EmbeddedTransport(sys.argv[1])
    with LockClient("http://embedded", sys.argv[2], transport=transport) as client:
        with client.lock("embedded:client", ttl=30) as held:
            fence = held.fence
            holder = client.get("embedded:client").owner
    web = sorted(
        name
        for name in sys.modules
        if name.partition(".")[0] in ("flask", "werkzeug", "gunicorn")
        or name.startswith("flask_")
    )
    print(json.dumps({"fence": fence, "holder": holder, "web_modules": web}))
    """
)


def test_the_client_locks_in_process_without_flask(app, tmp_path):
    from app.auth.service import create_token

    with app.app_context():
        token = create_token("alone")
    script = tmp_path / "client_worker.py"
    script.write_text(CLIENT_WORKER)
    finished = subprocess.run(
        [sys.executable, str(script), app.config["SQLALCHEMY_DATABASE_URI"], token],
        cwd=tmp_path,
        env={
            "PYTHONPATH": os.pathsep.join(
                str(path)
                for path in (
                    PROJECT_ROOT,
                    PROJECT_ROOT / "core" / "src",
                    PROJECT_ROOT / "client" / "src",
                )
            ),
            "PATH": "/usr/bin:/bin",
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert finished.returncode == 0, finished.stderr
    seen = json.loads(finished.stdout)
    assert seen["fence"] >= 1
    assert seen["holder"]
    assert seen["web_modules"] == []


@pytest.mark.backends("postgresql", "mariadb")  # SQLite's run on the engine itself
def test_a_worker_engines_single_statements_connect_as_the_engine_does(backend, app):
    """The core's autocommit twin of a worker's own engine (made without one)
    connects with that engine's connect_args, not with its URL alone: a TLS or
    timeout setting of the worker's holds for every statement the core runs."""
    url = app.config["SQLALCHEMY_DATABASE_URI"]
    if backend == "postgresql":
        args, probe = {"application_name": "lk-worker-probe"}, "SHOW application_name"
    else:
        args, probe = (
            {"init_command": "SET @lk_probe = 'lk-worker-probe'"},
            ("SELECT @lk_probe"),
        )
    engine = create_engine(url, connect_args=args)
    try:
        with autocommit(engine).connect() as conn:
            assert conn.exec_driver_sql(probe).scalar() == "lk-worker-probe"
    finally:
        engine.dispose()


def test_the_cores_schema_command_creates_and_checks_a_database(tmp_path, capsys):
    """``python -m lockkeeper_core``: what a worker's deploy step runs."""
    from lockkeeper_core.__main__ import main

    url = f"sqlite:///{tmp_path / 'worker.sqlite3'}"
    assert main(["current", url]) == 1
    assert "empty (no schema)" in capsys.readouterr().out
    assert main(["upgrade", url]) == 0
    assert "Upgraded the database from revision none to" in capsys.readouterr().out
    assert main(["upgrade", url]) == 0
    assert ": nothing to do." in capsys.readouterr().out
    assert main(["current", url]) == 0
    assert "ready: this code's head" in capsys.readouterr().out


def test_the_cores_schema_command_says_when_the_database_does_not_answer(capsys):
    from lockkeeper_core.__main__ import main

    assert main(["current", "postgresql+psycopg://nobody@127.0.0.1:1/none"]) == 2
    assert "the database does not answer" in capsys.readouterr().err


@pytest.mark.backends("postgresql", "mariadb")
def test_the_cores_schema_command_takes_a_plain_url(backend, empty_url, capsys):
    """``postgresql://…`` or ``mariadb://…`` as a worker writes it: the drivers
    the core ships, not SQLAlchemy's defaults (psycopg2, mysqlclient)."""
    from lockkeeper_core.__main__ import main
    from sqlalchemy.engine import make_url

    url = make_url(empty_url)
    plain = url.set(drivername=url.get_backend_name())
    assert "+" not in plain.drivername
    assert main(["upgrade", plain.render_as_string(hide_password=False)]) == 0
    assert "Upgraded the database from revision none" in capsys.readouterr().out
    assert main(["current", plain.render_as_string(hide_password=False)]) == 0
