"""The docs (README.md, docs/*.md) run as written: their blocks are extracted and
checked where a machine can check them. The `pgbouncer.ini` loads in the installed
PgBouncer and carries connections; the systemd unit passes `systemd-analyze
verify`; no ini block has an inline comment; every `lockkeeper` and `gunicorn`
command line in a shell block names commands and flags that exist; the changelog
lists every migration and every setting."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import click
import httpx
import psycopg
import pytest
from lockkeeper_core.schema import MIGRATIONS_DIR
from sqlalchemy.engine import make_url

from app.cli.main import build_cli
from app.paths import PROJECT_ROOT
from bench.pgbouncer import find_pgbouncer
from bench.ports import free_port
from tests.databases import SERVER_URLS, unavailable
from tests.live_server import serve

# deploy.md first: the blocks of its own that the tests below look up.
DOCS = (
    PROJECT_ROOT / "docs" / "deploy.md",
    PROJECT_ROOT / "README.md",
    *sorted(
        path
        for path in (PROJECT_ROOT / "docs").glob("*.md")
        if path.name != "deploy.md"
    ),
)
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
    versions = MIGRATIONS_DIR / "versions"
    for script in versions.glob("[0-9]*.py"):
        assert f"`{script.stem}`" in changelog, f"{script.stem} not in CHANGELOG.md"
    section = (PROJECT_ROOT / "docs" / "configuration.md").read_text()
    settings = set(re.findall(r"^\| `(LOCKKEEPER_[A-Z_]+)`", section, re.M))
    assert len(settings) > 20
    missing = sorted(s for s in settings if f"`{s}`" not in changelog)
    assert not missing, f"settings not in CHANGELOG.md: {missing}"


def test_the_documented_haproxy_config_is_valid_and_checks_healthz(tmp_path):
    """HAProxy's own check of the config deploy.md gives (its certificate a
    throwaway one): it parses, and its health check asks /healthz."""
    (config,) = blocks("haproxy")
    assert "option httpchk" in config
    assert "uri /healthz" in config
    bundle = tmp_path / "bundle.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=locks.example.com",
            "-keyout",
            str(bundle),
            "-out",
            str(tmp_path / "cert.pem"),
        ],
        check=True,
        capture_output=True,
    )
    bundle.write_text(bundle.read_text() + (tmp_path / "cert.pem").read_text())
    path = tmp_path / "haproxy.cfg"
    path.write_text(
        config.replace("/etc/ssl/locks.example.com/bundle.pem", str(bundle))
    )
    result = subprocess.run(
        [shutil.which("haproxy") or "/usr/sbin/haproxy", "-c", "-f", str(path)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_changelog_has_a_section_per_release_naming_its_schema():
    """Releases newest first, each `## X.Y.Z (schema NNNN)`, versions unique; the
    newest is this code's version and its schema this code's head (or an
    `Unreleased` section above it holds the migrations since); the Upgrading
    steps are there."""
    from lockkeeper_core.schema import required_revisions

    from app.ops.version import RELEASE

    changelog = (PROJECT_ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## (.+)$", changelog, re.M)
    assert headings[0] == "Upgrading"
    for step in ("**Install**", "**Migrate**", "**Restart**", "**Verify**"):
        assert step in changelog.split("\n## ", 2)[1], step
    releases = [
        re.fullmatch(r"(\d+\.\d+\.\d+) \(schema (\d{4})\)", h) for h in headings[1:]
    ]
    if headings[1] == "Unreleased":
        releases = releases[1:]
    assert all(releases), headings
    versions = [m.group(1) for m in releases]
    assert len(set(versions)) == len(versions)
    assert versions[0] == RELEASE
    (head,) = required_revisions()
    if headings[1] != "Unreleased":
        assert releases[0].group(2) == head
    for text in changelog.split("\n## ")[2:]:
        assert "additive" in text.lower(), text.splitlines()[0]


def test_the_documented_prometheus_config_passes_promtool(tmp_path):
    """The scrape configuration deploy.md gives, with its `rule_files` pointing
    at the shipped alert rules, is one Prometheus loads (`promtool check config`
    reads the rule files too)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        unavailable("promtool missing (apt-get install prometheus)")
    config = the_block("yaml", "scrape_configs:")
    rules = re.search(r"^rule_files:\n\s+- (\S+)", config, re.M)
    assert rules, "the scrape configuration loads no alert rules"
    alerts = PROJECT_ROOT / "docs" / "monitoring" / "alerts.yml"
    path = tmp_path / "prometheus.yml"
    path.write_text(config.replace(rules[1], str(alerts)))
    result = subprocess.run(
        [promtool, "check", "config", str(path)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 7 rules found" in result.stdout, result.stdout


def _documented_haproxy(tmp_path: Path, servers: list[str]) -> tuple[str, Path]:
    """deploy.md's HAProxy configuration on this machine: a throwaway
    certificate, a free port, these servers, its admin socket under tmp_path."""
    (config,) = blocks("haproxy")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-subj", "/CN=locks.example.com"]
        + ["-keyout", str(tmp_path / "key.pem"), "-out", str(tmp_path / "cert.pem")],
        check=True,
        capture_output=True,
    )
    bundle = tmp_path / "bundle.pem"
    bundle.write_text(
        (tmp_path / "key.pem").read_text() + (tmp_path / "cert.pem").read_text()
    )
    socket = re.search(r"stats socket (\S+) .*level admin", config)
    assert socket, "the HAProxy configuration has no admin socket to drain with"
    port = free_port()
    config = config.replace(socket[1], str(tmp_path / "admin.sock"))
    config = config.replace(
        "bind :443 ssl crt /etc/ssl/locks.example.com/bundle.pem",
        f"bind 127.0.0.1:{port} ssl crt {bundle}",
    )
    for documented, here in zip(
        re.findall(r"server \w+ (\S+) check", config), servers, strict=True
    ):
        config = config.replace(documented, here)
    config = config.replace("acl internal src 10.0.0.0/8", "acl internal src 127.0.0.1")
    return config, Path(socket[1])


@dataclass
class Proxy:
    """deploy.md's HAProxy, running: its address, and its admin commands."""

    base: str
    documented_socket: str
    socket: str

    def run(self, line: str) -> str:
        """A command line of deploy.md's drain block, as written but for the
        socket's path."""
        line = line.replace(self.documented_socket, self.socket)
        return subprocess.run(
            line, shell=True, check=True, capture_output=True, text=True
        ).stdout

    def wait_until_up(self, *servers: str) -> None:
        """Until HAProxy's health checks hold ``servers`` up (`show servers
        state`: the 6th column, srv_op_state, 2 when running). A check of a
        loaded machine's /healthz can miss its 2 s and take one down a while."""
        deadline = time.monotonic() + 60
        while True:
            shown = self.run(
                f'echo "show servers state lockkeeper" | socat stdio {self.socket}'
            )
            states = {
                row.split()[3]: row.split()[5]
                for row in shown.splitlines()
                if len(row.split()) > 5 and row.split()[1] == "lockkeeper"
            }
            if all(states.get(server) == "2" for server in servers):
                return
            assert time.monotonic() < deadline, shown
            time.sleep(0.1)

    def in_use(self, server: str) -> int:
        """Requests in flight on ``server``'s connections (`show servers
        conn`: its 7th column, used_cur)."""
        shown = self.run(
            f'echo "show servers conn lockkeeper" | socat stdio {self.socket}'
        )
        (row,) = [
            r.split()
            for r in shown.splitlines()
            if r.startswith(f"lockkeeper/{server} ")
        ]
        return int(row[6])


DRAIN_BLOCK = "set server lockkeeper/a state drain"


def drain_commands() -> tuple[str, str, str]:
    """deploy.md's drain, show and ready command lines."""
    (block,) = [b for b in blocks("sh", DOCS[0]) if DRAIN_BLOCK in b]
    drain, show, ready = [
        line for line in block.splitlines() if line.startswith("echo")
    ]
    return drain, show, ready


@contextmanager
def documented_haproxy(tmp_path: Path, hosts: list[str]) -> Iterator[Proxy]:
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if not Path(haproxy).exists() or shutil.which("socat") is None:
        unavailable("haproxy or socat missing (apt-get install haproxy socat)")
    config, documented_socket = _documented_haproxy(tmp_path, hosts)
    (tmp_path / "haproxy.cfg").write_text(config)
    process = subprocess.Popen(
        [haproxy, "-db", "-f", str(tmp_path / "haproxy.cfg")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    proxy = Proxy(
        "https://127.0.0.1:" + re.search(r"bind 127.0.0.1:(\d+)", config)[1],
        str(documented_socket),
        str(tmp_path / "admin.sock"),
    )
    try:
        until_up = time.monotonic() + 15
        while True:
            assert process.poll() is None, process.stderr.read().decode()
            try:
                httpx.get(proxy.base + "/livez", verify=False, timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < until_up
                time.sleep(0.1)
        yield proxy
    finally:
        process.terminate()
        process.wait(timeout=10)
        process.stderr.close()


def test_the_documented_haproxy_drains_an_instance_with_the_documented_commands(
    make_app, tmp_path
):
    """HAProxy with deploy.md's configuration in front of two instances: a
    connection refused is tried on another instance (`retries`, `option
    redispatch`), and the drain commands of "Restarting an instance behind the
    proxy", run as written (only the socket's path changed), take instance a out
    of rotation while b serves every request, and put it back."""
    (config,) = blocks("haproxy")
    assert re.search(r"^\s+retries [1-9]", config, re.M), config
    assert re.search(r"^\s+option redispatch", config, re.M), config
    drain, show, ready = drain_commands()
    with serve(make_app(), token="-") as a, serve(make_app(), token="-") as b:
        hosts = [server.url.removeprefix("http://") for server in (a, b)]

        def livez_answered(server) -> float:
            """How many /livez requests ``server`` answered (HAProxy's own
            probes ask /healthz)."""
            found = re.search(
                r'^lockkeeper_http_requests_total\{method="GET",route="/livez",'
                r'status="200"\} (\S+)$',
                httpx.get(server.url + "/metrics").text,
                re.M,
            )
            return float(found[1]) if found else 0.0

        with documented_haproxy(tmp_path, hosts) as proxy:

            def through_the_proxy(times: int = 8) -> tuple[float, float]:
                """Send ``times`` requests through the proxy: how many each of
                a and b answered."""
                before = livez_answered(a), livez_answered(b)
                with httpx.Client(base_url=proxy.base, verify=False) as client:
                    for _ in range(times):
                        assert client.get("/livez").status_code == 200
                return livez_answered(a) - before[0], livez_answered(b) - before[1]

            proxy.wait_until_up("a", "b")
            proxy.run(drain)
            assert re.search(r"^lockkeeper/a ", proxy.run(show), re.M)
            assert through_the_proxy() == (0, 8)
            proxy.run(ready)
            proxy.wait_until_up("a", "b")
            to_a, to_b = through_the_proxy()
            assert to_a > 0
            assert to_b > 0


class Gunicorn:
    """One instance as the systemd unit runs it: the shipped gunicorn config,
    one worker, its own metrics folder."""

    def __init__(self, database_url: str, tmp_path: Path, name: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "LOCKKEEPER_DATABASE_URL": database_url,
            "LOCKKEEPER_INSTANCE_PATH": str(tmp_path / name),
            "LOCKKEEPER_SECRET_KEY": "rollout",
            "LOCKKEEPER_BOOTSTRAP": "false",
            "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / f"{name}-metrics"),
        }
        self.log = tmp_path / f"{name}.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", "python:app.ops.gunicorn_conf"]
            + ["-w", "1", "-b", f"127.0.0.1:{self.port}", "app:create_app()"],
            env=self.env,
            cwd=PROJECT_ROOT,
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("a"),
        )
        deadline = time.monotonic() + 60
        while True:
            assert self.process.poll() is None, self.log.read_text()[-2000:]
            try:
                # The master listens before its worker has loaded the app: a
                # request waits in the backlog until then, up to the deadline.
                left = max(deadline - time.monotonic(), 1)
                if httpx.get(self.url + "/healthz", timeout=left).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "gunicorn did not come up"
            time.sleep(0.2)

    def stop(self) -> None:
        """SIGTERM, as systemd sends it; gunicorn exits 0 once its requests in
        flight are answered."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            assert self.process.wait(timeout=60) == 0, self.log.read_text()[-2000:]
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()

    def locks_answered(self) -> float:
        """Lock requests this instance has answered since it started."""
        text = httpx.get(self.url + "/metrics").text
        return sum(
            float(v)
            for v in re.findall(
                r'^lockkeeper_http_requests_total\{[^}]*route="/api/v1/locks/'
                r'<resource>"[^}]*\} (\S+)$',
                text,
                re.M,
            )
        )


@pytest.mark.slow
@pytest.mark.backends("postgresql")
@pytest.mark.connections(24)
@pytest.mark.usefixtures("backend")
def test_a_rollout_drained_as_documented_loses_no_request(
    make_app, database_url, tmp_path
):
    """Two gunicorn instances behind deploy.md's HAProxy, lock traffic through
    it; instance a is drained with the documented commands, stopped with SIGTERM
    and started again, then put back: every request is answered as it would be
    with no restart (without the drain, each restart lost the requests HAProxy
    had just sent on its keep-alive connections to the stopping instance)."""
    from app.auth.service import create_token

    with make_app().app_context():
        token = create_token("rollout")
    drain, show, ready = drain_commands()
    a, b = Gunicorn(database_url, tmp_path, "a"), Gunicorn(database_url, tmp_path, "b")
    failures: list[str] = []
    answered = []
    stop = threading.Event()

    def traffic(n: int) -> None:
        """Acquire, renew and release one lock of its own, over and over."""
        path = f"/api/v1/locks/rollout:{n}"
        cycle = (
            ("POST", {"owner": f"w{n}", "ttl": 30}, 200),
            ("PATCH", {"owner": f"w{n}", "ttl": 30}, 200),
            ("DELETE", {"owner": f"w{n}"}, 204),
        )
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(
            base_url=proxy.base, headers=headers, verify=False, timeout=60
        ) as client:
            while not stop.is_set():
                for method, body, expected in cycle:
                    try:
                        reply = client.request(method, path, json=body)
                        if reply.status_code != expected:
                            failures.append(
                                f"{method}: {reply.status_code} {reply.text[:200]}"
                            )
                    except httpx.TransportError as exc:
                        failures.append(f"{method}: {type(exc).__name__}: {exc}")
                    answered.append(time.monotonic())

    def served_after(moment: float, count: int) -> bool:
        return sum(1 for t in list(answered) if t > moment) >= count

    def until(condition, what: str) -> None:
        deadline = time.monotonic() + 60
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.05)

    try:
        a.start()
        b.start()
        with documented_haproxy(tmp_path, [a.url[7:], b.url[7:]]) as proxy:
            threads = [threading.Thread(target=traffic, args=(n,)) for n in range(4)]
            for thread in threads:
                thread.start()
            try:
                until(lambda: a.locks_answered() > 0, "traffic to reach instance a")
                proxy.run(drain)
                until(lambda: proxy.in_use("a") == 0, "instance a to drain")
                a.stop()
                stopped = time.monotonic()
                until(lambda: served_after(stopped, 20), "b to serve while a is down")
                a.start()
                proxy.run(ready)
                until(lambda: a.locks_answered() > 0, "the restarted a to serve")
            finally:
                stop.set()
                for thread in threads:
                    thread.join(timeout=60)
    finally:
        a.stop()
        b.stop()
    assert failures == [], failures[:5]


def test_a_rollout_switches_the_units_code_and_environment_together():
    """The unit's gunicorn is the environment inside its working directory, and
    the changelog's Restart step switches that directory (a link) to the new
    release: gunicorn imports `app` from its working directory first, so a new
    environment started in the old checkout served the old code."""
    unit = the_block("ini", "[Service]")
    workdir = re.search(r"^WorkingDirectory=(\S+)$", unit, re.M)[1]
    gunicorn = re.search(r"^ExecStart=(\S+)", unit, re.M)[1]
    assert gunicorn == f"{workdir}/.venv/bin/gunicorn", (workdir, gunicorn)
    changelog = (PROJECT_ROOT / "CHANGELOG.md").read_text()
    upgrading = " ".join(
        changelog.split("## Upgrading", 1)[1].split("\n## ")[0].split()
    )
    switch = re.search(
        rf"ln -sfn ({re.escape(workdir)}-\S+) {re.escape(workdir)} &&", upgrading
    )
    assert switch, upgrading
    release = switch[1]
    assert f"cd {release} && python3 -m venv .venv" in upgrading
    assert (
        f"{release}/.venv/bin/lockkeeper -e /etc/lockkeeper/env db upgrade" in upgrading
    )


FENCE_JUMP_SECTIONS = {
    "postgresql": "PostgreSQL",
    "mariadb": "MariaDB",
    "sqlite": "SQLite",
}


def fence_jump(backend: str) -> list[str]:
    """The statements deploy.md gives for ``backend``'s fence jump after a
    restore (a section per database, each under its ``-- Name…:`` line)."""
    block = the_block("sql", "lock_fence_seq")
    parts = re.split(r"^-- (\w+)[^\n]*:\n", block, flags=re.M)
    sections = dict(zip(parts[1::2], parts[2::2], strict=True))
    assert set(sections) == set(FENCE_JUMP_SECTIONS.values()), sections
    statements = sections[FENCE_JUMP_SECTIONS[backend]].split(";\n")
    return [statement.strip() for statement in statements if statement.strip()]


@pytest.mark.usefixtures("backend")
def test_the_documented_fence_jump_runs_and_moves_the_next_fence_past_it(
    make_app, empty_url, backend
):
    """The restore section's jump, run as written on each database: the next
    grant's fence is at least 1 000 000 000 past the last one (MariaDB's SETVAL
    took no subquery: the documented statement was a syntax error)."""
    from sqlalchemy import create_engine

    from app.config import normalize_database_url
    from app.extensions import lock_service
    from app.ops.upgrade import upgrade

    app = make_app(LOCKKEEPER_DATABASE_URL=empty_url)
    upgrade(app)
    with app.app_context():
        before = lock_service().acquire("restore:1", "w", ttl=30).lock.fence
    engine = create_engine(normalize_database_url(empty_url))
    try:
        with engine.begin() as conn:
            for statement in fence_jump(backend):
                conn.exec_driver_sql(statement)
    finally:
        engine.dispose()
    with app.app_context():
        after = lock_service().acquire("restore:2", "w", ttl=30).lock.fence
    assert after >= before + 1_000_000_000
