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
import subprocess
import tempfile
from pathlib import Path

from bench.ports import free_port


class ClusterError(RuntimeError):
    pass


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
            # The server's user must be able to enter its working directory;
            # the caller's (a clone under /root, say) may be closed to it.
            cwd=self.root,
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
            cwd=self.root,
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


class MariaDBServer:
    """The same for MariaDB: ``mariadb-install-db`` into a temporary datadir,
    ``mariadbd`` on 127.0.0.1 and a free port as the ``mysql`` OS user. ``stop``
    is a SIGKILL (a crash: InnoDB recovers on start)."""

    def __init__(self, *, user: str = "mysql"):
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="lk-faults-mariadb-"))
        self.data = self.root / "data"
        self.socket = self.root / "mysqld.sock"
        self.log = self.root / "server.log"
        self.user = user
        if os.geteuid() == 0:
            entry = pwd.getpwnam(user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        install = shutil.which("mariadb-install-db") or "/usr/bin/mariadb-install-db"
        result = subprocess.run(
            [
                install,
                "--no-defaults",
                f"--user={user}",
                f"--datadir={self.data}",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
            cwd=self.root,
        )
        if result.returncode != 0:
            raise ClusterError(f"mariadb-install-db failed: {result.stderr[-2000:]}")
        self.process: subprocess.Popen | None = None
        self._log = None
        self.url = f"mariadb://root@127.0.0.1:{self.port}/lockkeeper"
        self._created = False

    def start(self) -> None:
        import time

        import pymysql

        self._log = open(self.log, "ab")  # noqa: SIM115
        self.process = subprocess.Popen(
            [
                shutil.which("mariadbd") or "/usr/sbin/mariadbd",
                "--no-defaults",
                f"--user={self.user}",
                f"--datadir={self.data}",
                f"--port={self.port}",
                "--bind-address=127.0.0.1",
                f"--socket={self.socket}",
                f"--pid-file={self.root / 'mysqld.pid'}",
                # Every login is root: a throwaway server on the loopback only.
                "--skip-grant-tables",
                "--skip-name-resolve",
                "--innodb-buffer-pool-size=64M",
                # Commits reach the OS at once: a killed server loses none of them.
                "--innodb-flush-log-at-trx-commit=2",
                "--max-connections=300",
                "--character-set-server=utf8mb4",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                conn = pymysql.connect(
                    host="127.0.0.1", port=self.port, user="root", connect_timeout=1
                )
                break
            except pymysql.err.OperationalError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise ClusterError(
                        f"mariadbd did not start: see {self.log}"
                    ) from None
                time.sleep(0.1)
        with conn:
            if not self._created:
                with conn.cursor() as cursor:
                    cursor.execute(
                        "CREATE DATABASE IF NOT EXISTS lockkeeper "
                        "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
                    )
                self._created = True

    def stop(self, mode: str = "immediate") -> None:
        import signal

        if self.process is None:
            return
        os.killpg(
            self.process.pid, signal.SIGKILL if mode == "immediate" else signal.SIGTERM
        )
        self.process.wait()
        self.process = None
        self._log.close()

    def close(self) -> None:
        try:
            self.stop("immediate")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> MariaDBServer:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
