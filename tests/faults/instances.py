"""App instances: separate gunicorn processes on one database, as on separate hosts.

Each instance has its own instance folder, port and log. ``skew`` runs it under
libfaketime (Debian's ``faketime`` package) with its clock moved by that offset:
lock expiry is judged by the database's clock, so a host clock that is minutes
off must change nothing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from bench.ports import free_port

LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
VENV_BIN = Path(sys.executable).parent
FAKETIME_SHIM = Path(__file__).parent / "faketime_shim"


def lockkeeper_cli(env: dict[str, str], *args: str) -> str:
    """Run ``lockkeeper ARGS`` and return its stdout (raising on failure)."""
    result = subprocess.run(
        [str(VENV_BIN / "lockkeeper"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"lockkeeper {' '.join(args)}: {result.stderr[-2000:]}")
    return result.stdout


def base_env(database_url: str, instance: Path) -> dict[str, str]:
    instance.mkdir(parents=True, exist_ok=True)
    # No first-start admin: the harness makes its own token with the CLI.
    (instance / "config.py").write_text("LOCKKEEPER_BOOTSTRAP = False\n")
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("LOCKKEEPER_", "FAKETIME", "LD_PRELOAD"))
    }
    env.update(
        LOCKKEEPER_DATABASE_URL=database_url,
        LOCKKEEPER_INSTANCE_PATH=str(instance),
        LOCKKEEPER_SECRET_KEY="fault-harness-secret",
        PYTHONUNBUFFERED="1",
    )
    return env


class AppInstance:
    def __init__(
        self,
        name: str,
        database_url: str,
        workdir: Path,
        *,
        skew: str | None = None,
        threads: int = 8,
    ):
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.skew = skew
        self.threads = threads
        self.dir = workdir / name
        self.env = base_env(database_url, self.dir / "instance")
        self.env["PROMETHEUS_MULTIPROC_DIR"] = str(self.dir / "metrics")
        if skew:
            if not os.path.exists(LIBFAKETIME):
                raise RuntimeError(f"{LIBFAKETIME} missing: apt-get install faketime")
            self.env.update(
                LD_PRELOAD=LIBFAKETIME,
                FAKETIME=skew,
                # Monotonic time stays true (gunicorn's timeouts, Event.wait);
                # the shim routes time.sleep around libfaketime's EINVAL.
                FAKETIME_DONT_FAKE_MONOTONIC="1",
                PYTHONPATH=os.pathsep.join(
                    filter(None, [str(FAKETIME_SHIM), self.env.get("PYTHONPATH")])
                ),
            )
        self.process: subprocess.Popen | None = None
        self.starts = 0
        # The longest a start took until /healthz answered, as far as seen
        # (a wait that found it serving at once measured nothing).
        self.slowest_start = 0.0
        self._started_at = 0.0
        self.kills = 0
        self._log = None

    def start(self) -> None:
        (self.dir / "metrics").mkdir(parents=True, exist_ok=True)
        self._log = open(self.dir / "gunicorn.log", "ab")  # noqa: SIM115
        self.process = subprocess.Popen(
            [
                str(VENV_BIN / "gunicorn"),
                "-c",
                "python:app.ops.gunicorn_conf",
                "-w",
                "1",
                "--threads",
                str(self.threads),
                "-b",
                f"127.0.0.1:{self.port}",
                "--graceful-timeout",
                "2",
                "app:create_app()",
            ],
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: kill takes the workers
        )
        self.starts += 1
        self._started_at = time.monotonic()

    def wait_ready(self, timeout: float = 60.0) -> float:
        """Seconds until /healthz answered 200."""
        started = time.monotonic()
        deadline = started + timeout
        polls = 0
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited: see {self.dir}/gunicorn.log")
            polls += 1
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    if polls > 1 and self.process is not None:
                        took = time.monotonic() - self._started_at
                        self.slowest_start = max(self.slowest_start, took)
                    return time.monotonic() - started
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} not ready after {timeout} s")

    def kill(self) -> None:
        """SIGKILL the master and its workers: no graceful anything."""
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()
        self.process = None
        self._log.close()
        self.kills += 1

    def stop(self) -> None:
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=10)
        except ProcessLookupError:
            self.process.wait()
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None
        self._log.close()

    @property
    def running(self) -> bool:
        return self.process is not None
