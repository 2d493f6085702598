"""``lockkeeper exec`` as a worker host runs it: the console script in a subprocess,
talking HTTP to a real server, with Python children that report what they saw."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from lockkeeper_client import LockClient, LockMissing

from tests.live_server import LiveServer, serve

LOCKKEEPER = str(Path(sys.executable).with_name("lockkeeper"))
# The client distribution's own console script: the same command.
LOCKKEEPER_EXEC = str(Path(sys.executable).with_name("lockkeeper-exec"))


def child(code: str) -> list[str]:
    """A Python child command running ``code`` (dedented)."""
    return [sys.executable, "-c", textwrap.dedent(code)]


# Deadlines, not waits: each returns as soon as its event comes. A loaded CI
# machine took more than 10 s to start exec and its command once.
STARTED_WITHIN = 60.0


def wait_for(path: Path, timeout: float = STARTED_WITHIN) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            pytest.fail(f"{path.name} did not appear within {timeout} s")
        time.sleep(0.02)


def wait_until_catching(pid: int, signum: int, timeout: float = STARTED_WITHIN) -> None:
    """Wait until process ``pid`` has a handler for ``signum`` (Linux /proc)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = Path(f"/proc/{pid}/status").read_text()
        caught = int(status.split("SigCgt:")[1].split()[0], 16)
        if caught & (1 << (signum - 1)):
            return
        time.sleep(0.02)
    pytest.fail(f"process {pid} never installed a handler for signal {signum}")


@pytest.fixture
def untouched(tmp_path) -> Path:
    """An instance folder that ``exec`` must never create (it needs no database)."""
    return tmp_path / "exec-instance"


def exec_environment(server: LiveServer, untouched: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKKEEPER_")}
    env.pop("FLASK_APP", None)
    env["LOCKKEEPER_INSTANCE_PATH"] = str(untouched)
    env["LOCKKEEPER_URL"] = server.url
    env["LOCKKEEPER_TOKEN"] = server.token
    return env


@pytest.fixture
def exec_env(live_server, untouched) -> dict[str, str]:
    return exec_environment(live_server, untouched)


@pytest.fixture
def run_exec(exec_env, tmp_path):
    def run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(
            [LOCKKEEPER, "exec", *args],
            env=exec_env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return run


@pytest.fixture
def start_exec(exec_env, tmp_path):
    started: list[subprocess.Popen] = []

    def start(*args: str) -> subprocess.Popen:
        process = subprocess.Popen(
            [LOCKKEEPER, "exec", *args],
            env=exec_env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.communicate()


@pytest.fixture
def lock_client(live_server):
    with LockClient(live_server.url, live_server.token) as client:
        yield client


def test_command_runs_holding_the_lock_with_fence_in_env_and_exits_0(
    run_exec, lock_client, live_server, tmp_path, untouched
):
    # The child asks the server who holds the lock while it runs.
    result = run_exec(
        "report:nightly",
        "--",
        *child("""
            import os, pathlib, sys
            from lockkeeper_client import LockClient
            client = LockClient(os.environ["LOCKKEEPER_URL"], sys.argv[1])
            lock = client.get(os.environ["LOCKKEEPER_RESOURCE"])
            assert lock.owner == os.environ["LOCKKEEPER_OWNER"], lock
            assert lock.fence == int(os.environ["LOCKKEEPER_FENCE"]), lock
            pathlib.Path("seen").write_text(f"{lock.resource} {lock.fence}")
        """),
        live_server.token,
    )
    assert result.returncode == 0, result.stderr
    resource, fence = (tmp_path / "seen").read_text().split()
    assert resource == "report:nightly"
    assert int(fence) >= 1
    with pytest.raises(LockMissing):
        lock_client.get("report:nightly")
    assert not untouched.exists(), "exec created an instance folder or database"


def test_command_exit_code_is_passed_through_and_lock_released(run_exec, lock_client):
    result = run_exec("job:42", "--", *child("raise SystemExit(3)"))
    assert result.returncode == 3, result.stderr
    with pytest.raises(LockMissing):
        lock_client.get("job:42")


def test_held_lock_past_wait_exits_75_without_running_the_command(
    run_exec, lock_client, tmp_path
):
    lock_client.acquire("job:42", "someone-else", ttl=30)
    # No wall-clock bound (starting Python on a busy machine takes what it takes):
    # exec says how long it waited, and a wait past --wait would run into the
    # default of 60 s, beyond this run's timeout.
    result = run_exec(
        "job:42",
        "--wait",
        "0.5",
        "--",
        *child("import pathlib; pathlib.Path('ran').touch()"),
        timeout=45,
    )
    assert result.returncode == 75
    assert "for 0.5 s" in result.stderr
    assert "job:42" in result.stderr
    assert "someone-else" in result.stderr
    assert not (tmp_path / "ran").exists()
    assert lock_client.get("job:42").owner == "someone-else"


def test_waits_for_a_held_lock_and_runs_once_it_is_released(
    start_exec, lock_client, tmp_path
):
    lock_client.acquire("job:42", "finishing-worker", ttl=30)
    process = start_exec(
        "job:42",
        "--wait",
        "10",
        "--",
        *child("import pathlib; pathlib.Path('ran').touch()"),
    )
    deadline = time.monotonic() + 10
    while lock_client.get("job:42").waiters < 1:  # exec is in line
        assert time.monotonic() < deadline, "exec never joined the line"
        time.sleep(0.02)
    assert not (tmp_path / "ran").exists()
    lock_client.release("job:42", "finishing-worker")
    assert process.wait(timeout=STARTED_WITHIN) == 0
    assert (tmp_path / "ran").exists()


def test_lock_is_renewed_while_a_command_outlives_its_ttl(
    make_app, clock, untouched, tmp_path
):
    """The server's clock moves half a ttl at a time, each step only once exec has
    renewed: a busy machine slows the test down but cannot expire the lock on
    the server. The client's own view of it runs on the real clock (renewed
    every ttl/3, lost past the ttl since the last answer): at a ttl of 1 s a
    renewal answered in 474 ms under CI's load was the last, so 3 s."""
    ttl = 3.0
    with serve(make_app(LOCKKEEPER_CLOCK=clock)) as server:
        process = subprocess.Popen(
            [LOCKKEEPER, "exec", "job:42", "--ttl", str(ttl), "--"]
            + child("""
                import pathlib, time
                pathlib.Path("started").touch()
                while not pathlib.Path("go").exists():
                    time.sleep(0.02)
            """),
            env=exec_environment(server, untouched),
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_for(tmp_path / "started", timeout=30)
            with LockClient(server.url, server.token) as observer:
                for _ in range(6):  # three ttls of server time
                    renewed_to = clock.advance(ttl / 2) + timedelta(seconds=ttl)
                    deadline = time.monotonic() + 10
                    while observer.get("job:42").expires_at != renewed_to:
                        if time.monotonic() > deadline:
                            pytest.fail(f"exec did not renew to {renewed_to}")
                        time.sleep(0.02)
            (tmp_path / "go").touch()
            _, stderr = process.communicate(timeout=STARTED_WITHIN)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert process.returncode == 0, stderr


TRAP_TERM = """
    import pathlib, signal, sys, time
    def stop(signum, frame):
        pathlib.Path("got-signal").write_text(signal.Signals(signum).name)
        sys.exit(7)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    pathlib.Path("started").touch()
    time.sleep(30)
    pathlib.Path("finished").touch()
"""


def test_lost_lock_terminates_the_command_and_exits_76(
    start_exec, live_server, lock_client, tmp_path
):
    process = start_exec("job:42", "--ttl", "1", "--", *child(TRAP_TERM))
    wait_for(tmp_path / "started")
    live_server.force_release("job:42", reason="stuck")
    _, stderr = process.communicate(timeout=STARTED_WITHIN)
    assert process.returncode == 76, stderr
    assert (tmp_path / "got-signal").read_text() == "SIGTERM"
    assert "job:42" in stderr
    assert "lost" in stderr
    with pytest.raises(LockMissing):
        lock_client.get("job:42")


def test_child_ignoring_sigterm_is_killed_after_the_grace_period(
    start_exec, live_server, tmp_path
):
    stubborn = """
        import pathlib, signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        pathlib.Path("started").touch()
        time.sleep(30)
    """
    process = start_exec(
        "job:42", "--ttl", "1", "--grace", "0.5", "--", *child(stubborn)
    )
    wait_for(tmp_path / "started")
    lost_at = time.monotonic()
    live_server.force_release("job:42")
    _, stderr = process.communicate(timeout=STARTED_WITHIN)
    assert process.returncode == 76, stderr
    assert time.monotonic() - lost_at < 5


def test_on_lost_warn_keeps_the_command_running(start_exec, live_server, tmp_path):
    survivor = """
        import pathlib, time
        pathlib.Path("started").touch()
        time.sleep(2)
        pathlib.Path("finished").touch()
    """
    process = start_exec(
        "job:42", "--ttl", "1", "--on-lost", "warn", "--", *child(survivor)
    )
    wait_for(tmp_path / "started")
    live_server.force_release("job:42")
    _, stderr = process.communicate(timeout=STARTED_WITHIN)
    assert process.returncode == 0, stderr
    assert (tmp_path / "finished").exists()
    assert "WARNING" in stderr
    assert "job:42" in stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_exec_is_forwarded_to_the_command(
    start_exec, lock_client, tmp_path, signum
):
    process = start_exec("job:42", "--", *child(TRAP_TERM))
    wait_for(tmp_path / "started")
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=STARTED_WITHIN)
    assert process.returncode == 7, stderr
    assert (tmp_path / "got-signal").read_text() == signum.name
    assert not (tmp_path / "finished").exists()
    with pytest.raises(LockMissing):
        lock_client.get("job:42")


def test_signal_while_waiting_for_the_lock_exits_without_running_the_command(
    start_exec, lock_client, tmp_path
):
    lock_client.acquire("job:42", "slow-worker", ttl=30)
    process = start_exec(
        "job:42",
        "--wait",
        "20",
        "--",
        *child("import pathlib; pathlib.Path('ran').touch()"),
    )
    wait_until_catching(process.pid, signal.SIGTERM)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=STARTED_WITHIN)
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert "job:42" in stderr
    assert not (tmp_path / "ran").exists()
    assert lock_client.get("job:42").owner == "slow-worker"


def test_command_killed_by_a_signal_exits_128_plus_the_signal(run_exec):
    result = run_exec(
        "job:42", "--", *child("import os, signal; os.kill(os.getpid(), 9)")
    )
    assert result.returncode == 128 + signal.SIGKILL


def test_refused_token_exits_77(run_exec, tmp_path):
    result = run_exec("--token", "lk_wrong", "job:42", "--", "true")
    assert result.returncode == 77
    assert "job:42" in result.stderr


def test_token_outside_its_scope_exits_77_without_running(
    run_exec, live_server, tmp_path
):
    from app.auth.service import create_token

    with live_server.app.app_context():
        reports_only = create_token("reports-only", prefixes=["report:"])
    result = run_exec(
        "--token", reports_only, "job:42", "--", *child("open('ran', 'w')")
    )
    assert result.returncode == 77, result.stderr
    assert "scope" in result.stderr
    assert not (tmp_path / "ran").exists()


def test_unknown_command_exits_127_without_taking_the_lock(run_exec, lock_client):
    result = run_exec("job:42", "--", "no-such-command-lk")
    assert result.returncode == 127
    assert "no-such-command-lk" in result.stderr
    with pytest.raises(LockMissing):
        lock_client.get("job:42")


def test_missing_url_is_a_usage_error(run_exec, exec_env):
    del exec_env["LOCKKEEPER_URL"]
    result = run_exec("job:42", "--", "true")
    assert result.returncode == 2
    assert "LOCKKEEPER_URL" in result.stderr


def test_unreachable_server_exits_75(run_exec, exec_env, untouched):
    exec_env["LOCKKEEPER_URL"] = "http://127.0.0.1:9"
    result = run_exec("job:42", "--wait", "0", "--", "true")
    assert result.returncode == 75
    assert "job:42" in result.stderr
    assert not untouched.exists()


def test_the_cron_docs_example_runs_as_written(exec_env, tmp_path):
    cron = (Path(__file__).parents[1] / "docs" / "cron.md").read_text()
    section = cron.split("# Using Lockkeeper from cron\n", 1)[1]
    script = section.split("```sh\n", 1)[1].split("```", 1)[0]
    exec_env["PATH"] = f"{Path(LOCKKEEPER).parent}{os.pathsep}{exec_env['PATH']}"
    result = subprocess.run(
        ["sh", "-c", script],
        env=exec_env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "exit status 0"
    assert re.fullmatch(r"fence [1-9][0-9]*", result.stdout.splitlines()[0])


def test_ctrl_c_at_a_terminal_reaches_the_command_once(exec_env, tmp_path):
    """The terminal signals exec and the command alike; exec must not add a second.

    A duplicate that lands before the command's first SIGINT was delivered merges
    with it in the kernel, so a regression shows in about half of the runs.
    """
    import pty

    counting = """
        import pathlib, signal, sys, time
        seen = []
        def count(signum, frame):
            seen.append(signum)
            time.sleep(0.3)  # a forwarded SIGINT would land while we are here
        signal.signal(signal.SIGINT, count)
        pathlib.Path("started").touch()
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # a second, forwarded SIGINT would arrive in this time
        pathlib.Path("sigints").write_text(str(len(seen)))
    """
    with warnings.catch_warnings():
        # Python 3.12+ warns about forking a threaded process (the live server's);
        # the child only calls execve.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid, terminal = pty.fork()
    if pid == 0:  # the child: `lockkeeper exec` in the foreground of a terminal
        os.chdir(tmp_path)
        os.execve(
            LOCKKEEPER, [LOCKKEEPER, "exec", "job:42", "--", *child(counting)], exec_env
        )
    try:
        wait_for(tmp_path / "started")
        os.write(terminal, b"\x03")  # Ctrl-C
        wait_for(tmp_path / "sigints")
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(terminal)
    assert (tmp_path / "sigints").read_text() == "1"
    assert os.waitstatus_to_exitcode(status) == 0


def test_the_command_never_gets_the_api_token(run_exec, exec_env):
    """With the token and LOCKKEEPER_OWNER a command could act as the holder, or
    use the token for anything else it may do."""
    assert exec_env["LOCKKEEPER_TOKEN"]
    result = run_exec(
        "job:secret",
        "--",
        *child("""
            import os, sys
            leaked = [k for k, v in os.environ.items()
                      if k == "LOCKKEEPER_TOKEN" or v == sys.argv[1]]
            sys.exit(3 if leaked else 0)
        """),
        exec_env["LOCKKEEPER_TOKEN"],
    )
    assert result.returncode == 0, result.stderr


def test_token_file_gives_the_token_without_the_command_line(
    run_exec, exec_env, tmp_path
):
    token_file = tmp_path / "token"
    token_file.write_text(exec_env.pop("LOCKKEEPER_TOKEN") + "\n")
    token_file.chmod(0o600)
    result = run_exec("--token-file", str(token_file), "job:42", "--", "true")
    assert result.returncode == 0, result.stderr
    assert "WARNING" not in result.stderr


def test_token_on_the_command_line_works_with_a_warning_about_ps(run_exec, exec_env):
    token = exec_env.pop("LOCKKEEPER_TOKEN")
    result = run_exec("--token", token, "job:42", "--", "true")
    assert result.returncode == 0, result.stderr
    assert "process list" in result.stderr


def test_no_token_at_all_is_a_usage_error_naming_the_safe_ways(run_exec, exec_env):
    del exec_env["LOCKKEEPER_TOKEN"]
    result = run_exec("job:42", "--", "true")
    assert result.returncode == 2
    assert "LOCKKEEPER_TOKEN" in result.stderr
    assert "--token-file" in result.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("job:42", "--", "sh", "-c", "exit 9"), 9),
        (("job:42", "--", "no-such-command-here"), 127),
        (("--token", "lk_wrong", "job:42", "--", "true"), 77),
    ],
)
def test_lockkeeper_exec_of_the_client_distribution_is_the_same_command(
    exec_env, tmp_path, lock_client, args, expected
):
    """A cron host installs only the client: its console script takes the same
    options and answers the same exit codes as ``lockkeeper exec``."""
    results = [
        subprocess.run(
            [*prefix, *args],
            env=exec_env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=30,
        )
        for prefix in ([LOCKKEEPER, "exec"], [LOCKKEEPER_EXEC])
    ]
    assert [result.returncode for result in results] == [expected, expected], [
        result.stderr for result in results
    ]
    with pytest.raises(LockMissing):
        lock_client.get("job:42")


def test_lockkeeper_exec_with_a_held_lock_past_wait_exits_75(
    exec_env, tmp_path, lock_client
):
    lock_client.acquire("job:42", "someone-else", ttl=30)
    result = subprocess.run(
        [LOCKKEEPER_EXEC, "job:42", "--wait", "0", "--", "true"],
        env=exec_env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 75, result.stderr


def test_hold_at_least_keeps_a_quick_runs_lock_until_then_by_the_database_clock(
    run_exec, lock_client
):
    """ShedLock's lockAtLeastFor: the run ends at once, the lock stays until a
    minute after its grant (judged by the server's clock), so another host's run
    of the same window is refused. (The minute is never waited out: it only has
    to outlast starting a second ``exec`` on a loaded machine.)"""
    started = time.monotonic()
    result = run_exec("report:window", "--hold-at-least", "60s", "--", "true")
    took = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    lock = lock_client.get("report:window")  # exec is gone, the lock is not
    held_for = (lock.expires_at - lock.acquired_at).total_seconds()
    # At least the minute; more by at most the time between exec's read of the
    # server's clock and its renew, both within its run.
    assert 59.9 <= held_for <= 60 + took, (held_for, took)
    refused = run_exec("report:window", "--wait", "0", "--", "true")
    assert refused.returncode == 75, refused.stderr


def test_hold_at_least_shorter_than_the_run_releases_at_the_end(run_exec, lock_client):
    result = run_exec(
        "report:long",
        "--hold-at-least",
        "0.2",
        "--",
        *child("import time; time.sleep(0.6)"),
    )
    assert result.returncode == 0, result.stderr
    with pytest.raises(LockMissing):
        lock_client.get("report:long")


def test_hold_at_least_takes_durations_and_refuses_other_text(run_exec):
    result = run_exec("report:x", "--hold-at-least", "soon", "--", "true")
    assert result.returncode == 2
    assert "duration" in result.stderr


# -- --leader -------------------------------------------------------------------

LEAD = """
    import os, pathlib, sys, time
    name = sys.argv[1]
    pathlib.Path(name + ".leading").write_text(os.environ["LOCKKEEPER_FENCE"])
    deadline = time.monotonic() + 30
    while not pathlib.Path(name + ".go").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
"""


def test_leader_runs_one_command_at_a_time_and_hands_over_when_it_exits(
    start_exec, lock_client, tmp_path
):
    first = start_exec(
        "--leader", "scheduler:main", "--ttl", "3", "--", *child(LEAD), "a"
    )
    wait_for(tmp_path / "a.leading")
    second = start_exec(
        "--leader", "scheduler:main", "--ttl", "3", "--", *child(LEAD), "b"
    )
    leader = lock_client.leader("scheduler:main")
    assert leader is not None
    # The second waits in line while the first leads (its command never starts).
    with pytest.raises(subprocess.TimeoutExpired):
        second.wait(timeout=0.5)
    assert not (tmp_path / "b.leading").exists()
    (tmp_path / "a.go").touch()
    assert first.wait(timeout=STARTED_WITHIN) == 0
    wait_for(tmp_path / "b.leading")
    assert int((tmp_path / "b.leading").read_text()) > int(
        (tmp_path / "a.leading").read_text()
    )
    assert lock_client.leader("scheduler:main") not in (None, leader)
    (tmp_path / "b.go").touch()
    assert second.wait(timeout=STARTED_WITHIN) == 0
    assert lock_client.leader("scheduler:main") is None


def test_leader_whose_session_ends_terminates_the_command_and_exits_76(
    start_exec, live_server, lock_client, tmp_path
):
    # A ttl long enough that only the operator ends the session: at 1 s a
    # loaded machine's late heartbeat let it expire before the test read it.
    process = start_exec("--leader", "job:lead", "--ttl", "10", "--", *child(TRAP_TERM))
    wait_for(tmp_path / "started")
    with live_server.service() as locks:
        held = locks.get("job:lead")
        (session,) = [s.id for s in _sessions_of(live_server) if s.owner == held.owner]
        locks.sessions.end(session, token=None, actor="operator:test", reason="drain")
    _, stderr = process.communicate(timeout=STARTED_WITHIN)
    assert process.returncode == 76, stderr
    assert (tmp_path / "got-signal").read_text() == "SIGTERM"
    assert lock_client.leader("job:lead") is None


def _sessions_of(live_server):
    from lockkeeper_core.models import LockSession
    from sqlalchemy import select

    from app.extensions import db

    with live_server.app.app_context(), db.engine.connect() as conn:
        return conn.execute(select(LockSession.id, LockSession.owner)).all()


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (gone, or a zombie nobody reaped yet)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return status.split("State:")[1].split()[0] in ("Z", "X")


def _wait_gone(pid: int, within: float) -> float:
    """Seconds until ``pid`` ended; fails past ``within``."""
    started = time.monotonic()
    while not _gone(pid):
        if time.monotonic() - started > within:
            pytest.fail(f"process {pid} still runs {within} s later")
        time.sleep(0.01)
    return time.monotonic() - started


TICKING = """
    import os, pathlib, sys, time
    name = sys.argv[1]
    pathlib.Path(name + ".pid").write_text(str(os.getpid()))
    with open(name + ".ticks", "a") as ticks:
        for _ in range(600):
            ticks.write(f"{time.time()}\\n")
            ticks.flush()
            time.sleep(0.02)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG")
def test_kill_9_of_exec_ends_the_command_within_a_second_and_no_run_overlaps(
    start_exec, live_server, tmp_path
):
    """flock(1) cannot fail this way: its lock dies with it. exec's lock outlives
    a kill -9 by its ttl, so the command must not outlive exec."""
    first = start_exec("job:cron", "--ttl", "1", "--", *child(TICKING), "a")
    wait_for(tmp_path / "a.pid")
    command = int((tmp_path / "a.pid").read_text())
    first.kill()
    assert _wait_gone(command, within=1.0) < 1.0
    # The next run waits out the dead run's ttl; its command starts after the
    # last tick of the first, by the commands' own clocks.
    second = start_exec("job:cron", "--ttl", "1", "--wait", "10", "--", "true")
    assert second.wait(timeout=STARTED_WITHIN) == 0
    third = start_exec("job:cron", "--ttl", "1", "--", *child(TICKING), "b")
    wait_for(tmp_path / "b.ticks")
    third.kill()
    _wait_gone(int((tmp_path / "b.pid").read_text()), within=1.0)
    last_of_first = float((tmp_path / "a.ticks").read_text().split()[-1])
    first_of_third = float((tmp_path / "b.ticks").read_text().split()[0])
    assert first_of_third > last_of_first
    history = httpx.get(
        f"{live_server.url}/api/v1/locks/job:cron/events",
        headers=live_server.auth_headers,
    ).json()["events"]
    # Three grants, one after another: the second took the dead run's lock over.
    actions = [event["action"] for event in reversed(history)]
    assert actions == ["acquired", "took_over", "released", "acquired"], actions


SPAWNS_A_GRANDCHILD = """
    import pathlib, subprocess, sys, time
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    pathlib.Path("grandchild").write_text(str(grandchild.pid))
    pathlib.Path("started").touch()
    time.sleep(60)
"""


def test_a_lost_lock_ends_the_commands_whole_process_group(
    start_exec, live_server, tmp_path
):
    """The command runs in a process group of its own: what it started dies with
    it when the lock is lost, as a terminal's Ctrl-C would end it."""
    process = start_exec("job:42", "--ttl", "1", "--", *child(SPAWNS_A_GRANDCHILD))
    wait_for(tmp_path / "started")
    grandchild = int((tmp_path / "grandchild").read_text())
    assert os.getpgid(grandchild) != os.getpgrp()
    live_server.force_release("job:42")
    _, stderr = process.communicate(timeout=STARTED_WITHIN)
    assert process.returncode == 76, stderr
    _wait_gone(grandchild, within=5.0)


def test_the_command_gets_neither_the_token_nor_the_token_file_variable(
    run_exec, exec_env, tmp_path
):
    token_file = tmp_path / "token"
    token_file.write_text(exec_env["LOCKKEEPER_TOKEN"])
    exec_env["LOCKKEEPER_TOKEN_FILE"] = str(token_file)
    result = run_exec(
        "job:secret",
        "--",
        *child("""
            import os, sys
            leaked = {"LOCKKEEPER_TOKEN", "LOCKKEEPER_TOKEN_FILE"} & set(os.environ)
            sys.exit(3 if leaked else 0)
        """),
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl")
def test_exec_drops_its_own_token_variables_and_is_not_dumpable():
    """exec's /proc/<pid>/environ keeps the variables it started with whatever it
    unsets; a non-dumpable process's is readable by root alone, so a command of
    the same (ordinary) user cannot read the token there. (Checked by hand as
    uid 65534: 'Permission denied'. The suite runs as root, which reads it
    anyway, so this asks the process itself.)"""
    probe = textwrap.dedent("""
        import ctypes, os
        from lockkeeper_client.exec import _forget_the_token
        _forget_the_token()
        libc = ctypes.CDLL(None)
        PR_GET_DUMPABLE = 3
        print(libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0))
        print(sorted(k for k in os.environ if k.startswith("LOCKKEEPER_TOKEN")))
    """)
    env = {**os.environ, "LOCKKEEPER_TOKEN": "lk_x", "LOCKKEEPER_TOKEN_FILE": "/t"}
    result = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["0", "[]"]


@pytest.mark.parametrize("kind", ["not executable", "a directory"])
def test_a_command_that_cannot_be_executed_exits_126_without_taking_the_lock(
    run_exec, lock_client, tmp_path, kind
):
    target = tmp_path / "job.sh"
    if kind == "a directory":
        target.mkdir()
    else:
        target.write_text("#!/bin/sh\necho ran\n")
        target.chmod(0o644)
    result = run_exec("job:42", "--", str(target))
    assert result.returncode == 126, result.stderr
    assert str(target) in result.stderr
    with pytest.raises(LockMissing):
        lock_client.get("job:42")


def test_by_default_a_run_finding_the_lock_held_exits_75_at_once(
    run_exec, lock_client, tmp_path
):
    """cron's case: the previous run still holds the lock; this one must not queue
    behind it (flock -n), so the default --wait is 0."""
    lock_client.acquire("job:42", "previous-run", ttl=30)
    result = run_exec("job:42", "--", *child("open('ran', 'w')"), timeout=20)
    assert result.returncode == 75, result.stderr
    assert not (tmp_path / "ran").exists()


def test_also_runs_the_command_holding_every_resource_as_one_set(
    run_exec, lock_client, live_server, tmp_path
):
    result = run_exec(
        "acct:1",
        "--also",
        "acct:2",
        "--",
        *child("""
            import os, pathlib, sys
            from lockkeeper_client import LockClient
            client = LockClient(os.environ["LOCKKEEPER_URL"], sys.argv[1])
            fences = dict(
                pair.split("=") for pair in os.environ["LOCKKEEPER_FENCES"].split(",")
            )
            for resource in os.environ["LOCKKEEPER_RESOURCES"].split(","):
                lock = client.get(resource)
                assert lock.owner == os.environ["LOCKKEEPER_OWNER"], lock
                assert lock.fence == int(fences[resource]), lock
            pathlib.Path("seen").write_text(os.environ["LOCKKEEPER_RESOURCES"])
        """),
        live_server.token,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "seen").read_text() == "acct:1,acct:2"
    for resource in ("acct:1", "acct:2"):
        with pytest.raises(LockMissing):
            lock_client.get(resource)


def test_also_with_one_member_held_exits_75_holding_nothing(
    run_exec, lock_client, tmp_path
):
    lock_client.acquire("acct:2", "someone-else", ttl=30)
    result = run_exec(
        "acct:1",
        "--also",
        "acct:2",
        "--wait",
        "0.3",
        "--",
        *child("import pathlib; pathlib.Path('ran').touch()"),
        timeout=45,
    )
    assert result.returncode == 75, result.stderr
    assert "'acct:2' stayed held by 'someone-else'" in result.stderr
    assert not (tmp_path / "ran").exists()
    with pytest.raises(LockMissing):
        lock_client.get("acct:1")
