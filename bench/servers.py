"""gunicorn servers on loopback, wrk runs against them, and worker RSS sampling."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.ports import free_port

LUA_SCRIPT = Path(__file__).parent / "cycle.lua"
PROJECT_ROOT = Path(__file__).resolve().parent.parent


class ToolMissing(RuntimeError):
    pass


def wrk_path() -> str:
    found = shutil.which("wrk")
    if found is None:
        raise ToolMissing(
            "wrk is not installed; the HTTP benchmarks need it as their load "
            "generator (a Python one would compete with the server for the CPUs): "
            "apt-get install -y wrk"
        )
    return found


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time process ``pid`` used so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ServerConfig:
    """One gunicorn configuration, used alike for Lockkeeper and the baselines."""

    name: str
    worker_class: str
    workers: int
    threads: int = 1

    def args(self) -> list[str]:
        args = ["-k", self.worker_class, "-w", str(self.workers)]
        if self.threads > 1:
            args += ["--threads", str(self.threads)]
        return args


def server_configs() -> list[ServerConfig]:
    workers = 2 * (os.cpu_count() or 1) + 1
    return [
        ServerConfig("sync", "sync", workers),
        ServerConfig("gthread", "gthread", workers, threads=4),
    ]


class Server:
    """A gunicorn master we started; ``stop()`` ends it and its workers."""

    def __init__(
        self,
        app_spec: str,
        config: ServerConfig,
        env: dict,
        log: Path,
        wait: bool = True,
    ):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._log = open(log, "ab")  # noqa: SIM115 - closed in stop()
        gunicorn = Path(sys.executable).with_name("gunicorn")
        self.process = subprocess.Popen(
            [
                str(gunicorn),
                app_spec,
                "-b",
                f"127.0.0.1:{self.port}",
                "--no-control-socket",
                "--timeout",
                "120",
                *config.args(),
            ],
            env={**os.environ, **env},
            cwd=PROJECT_ROOT,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.workers = config.workers
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout: float = 180) -> None:
        workers = self.workers
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"gunicorn exited with {self.process.returncode}; see "
                    f"{self._log.name}"
                )
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                conn.request("GET", "/")
                conn.getresponse().read()
                conn.close()
                if len(self.worker_pids()) >= workers:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"gunicorn on port {self.port} did not come up")

    def worker_pids(self) -> list[int]:
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        try:
            return [int(pid) for pid in children.read_text().split()]
        except OSError:
            return []

    def cpu_seconds(self) -> float:
        """User + system CPU time used so far by the workers alive now."""
        return sum(process_cpu_seconds(pid) for pid in self.worker_pids())

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


@dataclass
class RssSampler:
    """Samples the RSS of a server's workers in a thread while a run goes on."""

    server: Server
    interval: float = 0.5
    peak: dict[int, float] = field(default_factory=dict)
    series: list[tuple[float, float]] = field(default_factory=list)

    def __enter__(self) -> RssSampler:
        self._stop = threading.Event()
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        sizes = [
            (pid, size)
            for pid in self.server.worker_pids()
            if (size := rss_mb(pid)) is not None
        ]
        for pid, size in sizes:
            self.peak[pid] = max(self.peak.get(pid, 0.0), size)
        if sizes:
            mean = sum(size for _, size in sizes) / len(sizes)
            self.series.append((time.monotonic() - self._started, mean))

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def peak_per_worker(self) -> float:
        return max(self.peak.values(), default=0.0)


def run_wrk(
    base_url: str,
    prefix: str,
    mode: str,
    tag: str,
    seconds: float,
    token: str = "none",
    connections: int = 16,
) -> dict:
    """One wrk run of acquire+release cycles; returns the script's BENCH_JSON."""
    command = [
        wrk_path(),
        "-t",
        str(connections),
        "-c",
        str(connections),
        "-d",
        f"{max(1, round(seconds))}s",
        "--timeout",
        "10s",
        "-s",
        str(LUA_SCRIPT),
        base_url,
        "--",
        prefix,
        token,
        mode,
        tag,
    ]
    out = subprocess.run(
        command, capture_output=True, text=True, timeout=seconds + 60, check=False
    )
    for line in out.stdout.splitlines():
        if line.startswith("BENCH_JSON "):
            result = json.loads(line.removeprefix("BENCH_JSON "))
            result["cycles_per_s"] = (
                min(result["acquires"], result["releases"]) / result["duration_s"]
            )
            return result
    raise RuntimeError(f"wrk gave no result: {out.stdout} {out.stderr}")
