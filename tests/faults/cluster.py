"""A private PostgreSQL server for one harness run.

The shared servers on 5432/3306 serve everybody's tests and must never restart,
so the harness makes its own cluster in a temporary directory: ``initdb`` as the
``postgres`` OS user (PostgreSQL refuses to run as root), trust authentication,
127.0.0.1 on a free port, stopped and started with ``pg_ctl``, removed at the end.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


class ClusterError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def postgres_bin() -> Path:
    """The newest installed server's bin directory (Debian layout)."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parent.parent.name),
    )
    if not found:
        raise ClusterError("no PostgreSQL server binaries under /usr/lib/postgresql")
    return Path(found[-1]).parent


class PostgresCluster:
    """``start()``, ``stop()``, ``url``; ``close()`` removes everything."""

    def __init__(self, *, user: str = "postgres"):
        self.bin = postgres_bin()
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="lk-faults-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            # initdb and postgres refuse root; run them as the postgres user.
            entry = pwd.getpwnam(user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
            self._as_user = ["runuser", "-u", user, "--"]
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C.UTF-8",
        )
        options = " ".join(
            [
                f"-p {self.port}",
                "-c listen_addresses=127.0.0.1",
                f"-c unix_socket_directories={self.root}",
                # A killed server (not a crashed host) keeps what it wrote to the
                # OS, so fsync can go. synchronous_commit must stay on: off, a
                # crash forgets commits it already acknowledged, and the checker
                # then (rightly) finds grants without events and two holders.
                "-c fsync=off",
                "-c max_connections=200",
                "-c shared_buffers=32MB",
            ]
        )
        self._options = options
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> str:
        result = subprocess.run(
            [*self._as_user, str(self.bin / tool), *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if result.returncode != 0:
            raise ClusterError(
                f"{tool} failed ({result.returncode}): {result.stderr.strip()[-2000:]}"
            )
        return result.stdout

    def start(self) -> None:
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-o",
            self._options,
            "-l",
            str(self.log),
            "-w",
            "-t",
            "60",
            "start",
        )

    def stop(self, mode: str = "immediate") -> None:
        """``immediate`` is a crash: connections drop, recovery runs on start."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def is_running(self) -> bool:
        result = subprocess.run(
            [*self._as_user, str(self.bin / "pg_ctl"), "-D", str(self.data), "status"],
            capture_output=True,
            check=False,
        )
        return result.returncode == 0

    def close(self) -> None:
        try:
            if self.data.exists() and self.is_running():
                self.stop("immediate")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PostgresCluster:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
