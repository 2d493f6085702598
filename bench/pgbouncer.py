"""A private PgBouncer in transaction pooling mode in front of a PostgreSQL server.

Used by the tests (``tests/test_pgbouncer.py``) and the benchmark
(``http_pgbouncer_vs_direct_postgresql``). It listens on a free loopback port,
trusts every user it is told about, and is stopped (and its folder removed) by
``close()``. PgBouncer refuses to run as root, so as root it runs as ``postgres``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from sqlalchemy.engine import URL, make_url

from bench.ports import free_port


def find_pgbouncer() -> str | None:
    return shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None
    )


class PgBouncer:
    def __init__(self, server_url: str, *, pool_size: int = 20) -> None:
        binary = find_pgbouncer()
        if binary is None:
            raise FileNotFoundError("pgbouncer missing (apt-get install pgbouncer)")
        server = make_url(server_url)
        self.root = Path(tempfile.mkdtemp(prefix="lk-pgbouncer-"))
        self.port = free_port()
        user = server.username or "postgres"
        (self.root / "users.txt").write_text(f'"{user}" ""\n')
        config = self.root / "pgbouncer.ini"
        config.write_text(
            "[databases]\n"
            f"* = host={server.host or '127.0.0.1'} port={server.port or 5432}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            f"unix_socket_dir = {self.root}\n"
            "auth_type = trust\n"
            f"auth_file = {self.root / 'users.txt'}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {pool_size}\n"
            "max_client_conn = 1000\n"
            # psycopg sends these at connect; transaction pooling cannot keep them.
            "ignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {self.root / 'pgbouncer.log'}\n"
        )
        self.command = [binary, str(config)]
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
            for path in self.root.iterdir():
                shutil.chown(path, "postgres")
            self.command = ["runuser", "-u", "postgres", "--", *self.command]
        self._start()

    def _start(self) -> None:
        self.process = subprocess.Popen(
            self.command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            # A folder the postgres user owns, not the caller's (maybe closed to it).
            cwd=self.root,
        )
        deadline = time.monotonic() + 15
        while True:
            if self.process.poll() is not None:
                error = self.process.stderr.read().decode(errors="replace")
                log = self._log()
                shutil.rmtree(self.root, ignore_errors=True)
                raise RuntimeError(f"pgbouncer exited: {error} {log}")
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError("pgbouncer did not listen within 15 s") from None
                time.sleep(0.05)

    def _log(self) -> str:
        try:
            return (self.root / "pgbouncer.log").read_text()[-2000:]
        except OSError:
            return ""

    def url_for(self, database_url: str) -> str:
        """``database_url`` (a database on the server behind) through PgBouncer."""
        url: URL = make_url(database_url).set(host="127.0.0.1", port=self.port)
        return url.render_as_string(hide_password=False)

    def restart(self) -> None:
        """Stop PgBouncer (every client connection drops) and start it again on
        the same port."""
        self._stop()
        self._start()

    def close(self) -> None:
        self._stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def _stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stderr is not None:
            self.process.stderr.close()
