"""The deployment docs run as written: their blocks are extracted and checked
where a machine can check them. The `pgbouncer.ini` loads in the installed
PgBouncer and carries connections; the systemd unit passes `systemd-analyze
verify`; no ini block has an inline comment; every `lockkeeper` and `gunicorn`
command line in a shell block names commands and flags that exist; the changelog
lists every migration and every setting."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click
import psycopg
import pytest
from sqlalchemy.engine import make_url

from app.cli.main import build_cli
from app.paths import PROJECT_ROOT
from bench.pgbouncer import find_pgbouncer
from bench.ports import free_port
from tests.databases import SERVER_URLS, unavailable

DOCS = (PROJECT_ROOT / "docs" / "deploy.md", PROJECT_ROOT / "README.md")
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def blocks(language: str, *paths: Path) -> list[str]:
    found = []
    for path in paths or DOCS:
        for lang, body in _FENCE.findall(path.read_text()):
            if lang == language:
                found.append(body)
    return found


def the_block(language: str, marker: str) -> str:
    (block,) = [b for b in blocks(language, DOCS[0]) if marker in b]
    return block


def test_no_ini_block_has_an_inline_comment():
    for block in blocks("ini"):
        for line in block.splitlines():
            stripped = line.strip()
            if not stripped or stripped[0] in ";#[":
                continue
            assert not re.search(r"\s[;#]", stripped), f"inline comment: {line!r}"


def _set(ini: str, key: str, value: str) -> str:
    """``key = value`` in ``ini``, replaced where the docs set it."""
    pattern = re.compile(rf"^{re.escape(key)}\s*=.*$", re.M)
    assert pattern.search(ini), f"the docs' pgbouncer.ini sets no {key}"
    return pattern.sub(f"{key} = {value}", ini)


@pytest.fixture
def bouncer_dir():
    """A folder the postgres user can reach (pytest's tmp_path is closed to it)."""
    path = Path(tempfile.mkdtemp(prefix="lk-docs-pgbouncer-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_the_documented_pgbouncer_ini_loads_and_carries_a_connection(bouncer_dir):
    tmp_path = bouncer_dir
    binary = find_pgbouncer()
    if binary is None:
        unavailable("pgbouncer missing (apt-get install pgbouncer)")
    ini = the_block("ini", "[pgbouncer]")
    for section in ("[databases]", "[pgbouncer]"):
        assert section in ini
    server = make_url(SERVER_URLS["postgresql"])
    port = free_port()
    # Only the values that name this machine change: where PostgreSQL is, the
    # port, the user list's path; and the files PgBouncer needs to run unprivileged.
    ini = re.sub(
        r"host=\S+ port=\d+ dbname=\S+",
        f"host={server.host} port={server.port} dbname={server.database}",
        ini,
    )
    ini = _set(ini, "listen_addr", "127.0.0.1")
    ini = _set(ini, "listen_port", str(port))
    ini = _set(ini, "auth_file", str(tmp_path / "userlist.txt"))
    ini += f"unix_socket_dir = {tmp_path}\nlogfile = {tmp_path / 'pgbouncer.log'}\n"
    user = server.username or "postgres"
    (tmp_path / "userlist.txt").write_text(f'"{user}" "docs-test-password"\n')
    config = tmp_path / "pgbouncer.ini"
    config.write_text(ini)
    command = [binary, str(config)]
    if os.geteuid() == 0:  # PgBouncer refuses to run as root
        for path in (tmp_path, *tmp_path.iterdir()):
            shutil.chown(path, "postgres")
        command = ["runuser", "-u", "postgres", "--", *command]
    bouncer = subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 15
        while True:
            assert bouncer.poll() is None, (
                bouncer.stderr.read().decode(),
                (tmp_path / "pgbouncer.log").read_text(),
            )
            try:
                with psycopg.connect(
                    host="127.0.0.1",
                    port=port,
                    dbname="lockkeeper",
                    user=user,
                    password="docs-test-password",
                    prepare_threshold=None,
                    connect_timeout=2,
                ) as conn:
                    assert conn.execute("SELECT 1").fetchone() == (1,)
                break
            except psycopg.OperationalError:
                assert time.monotonic() < deadline, (
                    tmp_path / "pgbouncer.log"
                ).read_text()
                time.sleep(0.1)
    finally:
        bouncer.terminate()
        bouncer.wait(timeout=10)
        bouncer.stderr.close()


def test_the_documented_systemd_unit_verifies(tmp_path):
    unit = the_block("ini", "[Service]")
    for section in ("[Unit]", "[Service]", "[Install]"):
        assert section in unit
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze missing: the inline-comment check covers it")
    # The unit names a checkout under /srv: point it at this one.
    gunicorn = Path(sys.executable).with_name("gunicorn")
    unit = unit.replace("/srv/lockkeeper/.venv/bin/gunicorn", str(gunicorn))
    unit = unit.replace("/srv/lockkeeper", str(PROJECT_ROOT))
    env_file = re.search(r"^EnvironmentFile=(\S+)$", unit, re.M)
    assert env_file, "EnvironmentFile= must hold a path alone"
    unit = unit.replace(env_file[1], str(tmp_path / "env"))
    (tmp_path / "env").write_text("LOCKKEEPER_DATABASE_URL=sqlite:////tmp/x\n")
    path = tmp_path / "lockkeeper.service"
    path.write_text(unit)
    result = subprocess.run(
        [analyze, "verify", str(path)], capture_output=True, text=True, timeout=60
    )
    problems = [
        line
        for line in (result.stdout + result.stderr).splitlines()
        if "lockkeeper.service" in line
        # No lockkeeper user on a test machine.
        and "User" not in line
        and "user" not in line
    ]
    assert not problems, result.stdout + result.stderr


def command_lines(program: str) -> list[list[str]]:
    """Every ``program …`` command of the docs' shell blocks, as its arguments
    (environment assignments, redirections and comments left off)."""
    found = []
    for block in blocks("sh"):
        for line in block.splitlines():
            try:
                words = shlex.split(line, comments=True)
            except ValueError:
                continue
            for part in _commands(words):
                while part and re.fullmatch(r"[A-Z_]+=.*", part[0]):
                    part = part[1:]
                if part and Path(part[0]).name == program:
                    found.append(part[1:])
    return found


def _commands(words: list[str]) -> list[list[str]]:
    parts, current = [], []
    for word in words:
        if word in ("&&", "||", "|", ";"):
            parts.append(current)
            current = []
        elif word in ("<", ">", "2>") or word.startswith(("<", ">")):
            current.append("\0")
        else:
            current.append(word)
    parts.append(current)
    return [p[: p.index("\0")] if "\0" in p else p for p in parts]


def test_every_documented_lockkeeper_command_and_flag_exists(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCKKEEPER_INSTANCE_PATH", str(tmp_path / "instance"))
    lines = command_lines("lockkeeper")
    assert len(lines) >= 10
    cli = build_cli()
    for args in lines:
        with click.Context(cli, info_name="lockkeeper") as ctx:
            command: click.Command = cli
            words = list(args)
            while words and isinstance(command, click.Group):
                word = words[0]
                if word.startswith("-"):
                    words = _check_option(command, words, args)
                    continue
                sub = command.get_command(ctx, word)
                assert sub is not None, (
                    f"no command {word!r} in `lockkeeper {shlex.join(args)}`"
                )
                command, words = sub, words[1:]
            while words:
                if words[0] == "--":
                    break
                if words[0].startswith("-"):
                    words = _check_option(command, words, args)
                else:
                    words = words[1:]


def _check_option(command: click.Command, words: list[str], args) -> list[str]:
    name = words[0].split("=", 1)[0]
    for param in command.params:
        if isinstance(param, click.Option) and name in (
            *param.opts,
            *param.secondary_opts,
        ):
            takes_value = not param.is_flag and "=" not in words[0]
            return words[2:] if takes_value else words[1:]
    raise AssertionError(
        f"`lockkeeper {shlex.join(args)}`: {command.name} has no option {name}"
    )


def test_every_documented_gunicorn_command_line_parses():
    from gunicorn.config import Config

    lines = command_lines("gunicorn")
    assert len(lines) >= 2
    for args in lines:
        parsed = Config().parser().parse_args(args)
        assert parsed.args == ["app:create_app()"], args


def test_the_changelog_lists_every_migration_and_setting():
    changelog = (PROJECT_ROOT / "CHANGELOG.md").read_text()
    assert changelog.splitlines()[0] == "# Changelog"
    headings = re.findall(r"^## (.+)$", changelog, re.M)
    assert headings[0] == "Unreleased"
    versions = PROJECT_ROOT / "app" / "migrations" / "versions"
    for script in versions.glob("[0-9]*.py"):
        assert f"`{script.stem}`" in changelog, f"{script.stem} not in CHANGELOG.md"
    readme = (PROJECT_ROOT / "README.md").read_text()
    section = readme.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    settings = set(re.findall(r"^\| `(LOCKKEEPER_[A-Z_]+)`", section, re.M))
    assert len(settings) > 20
    missing = sorted(s for s in settings if f"`{s}`" not in changelog)
    assert not missing, f"settings not in CHANGELOG.md: {missing}"
