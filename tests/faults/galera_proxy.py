"""HAProxy in front of a ``GaleraCluster``: every connection to one node, the
first that is Synced, failing over to the next (the single-writer topology).

The health check is an HTTP one, answered for each node by ``SyncedCheck``
(what Percona's ``clustercheck`` does behind xinetd): 200 when the node's
``wsrep_local_state`` is 4 (Synced), ``wsrep_ready`` is ON and its component is
the primary one, else 503. HAProxy's own ``option mysql-check`` only logs in: a
node that left the primary component (a partition), or one that is still a
joiner or a donor, accepts the login and then refuses every statement (1047)
or serves stale reads, and the check would keep sending connections to it.

``balance first`` with galera1 and galera2 as backups: galera0 takes every
connection while its check passes; then the first backup that passes. Sessions
on a server marked down are cut (``on-marked-down shutdown-sessions``: a paused
node's connections hang otherwise), and when galera0 is back the backups'
sessions are cut (``on-marked-up shutdown-backup-sessions``), so that the
instances write through one node again.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pymysql

from bench.ports import free_port
from tests.faults.cluster import ClusterError

PROJECT_ROOT = Path(__file__).resolve().parents[2]
# Every second; two failed checks mark a server down, two passed up. A check
# that has no answer in 3 s failed: on this loaded machine checks took more
# than 1 s, and HAProxy marked Synced nodes down (13 of 17 times galera0 went
# down in a 10-minute run).
CHECK_INTERVAL_MS = 1000
CHECK_TIMEOUT_MS = 3000


def haproxy_missing() -> str | None:
    if shutil.which("haproxy") is None and not Path("/usr/sbin/haproxy").exists():
        return "haproxy missing (apt-get install haproxy)"
    return None


def node_synced(host: str, port: int) -> tuple[bool, str]:
    """Whether the node at ``host:port`` can serve the service, and what it
    said."""
    try:
        conn = pymysql.connect(
            host=host,
            port=port,
            user="root",
            connect_timeout=1,
            read_timeout=1,
            write_timeout=1,
        )
    except pymysql.err.MySQLError as exc:
        return False, f"no connection: {exc}"
    try:
        with conn.cursor() as cursor:
            cursor.execute(
                "SHOW GLOBAL STATUS WHERE Variable_name IN"
                " ('wsrep_local_state', 'wsrep_ready', 'wsrep_cluster_status')"
            )
            status = dict(cursor.fetchall())
    except pymysql.err.MySQLError as exc:
        return False, f"no answer: {exc}"
    finally:
        conn.close()
    synced = (
        status.get("wsrep_local_state") == "4"
        and status.get("wsrep_ready") == "ON"
        and status.get("wsrep_cluster_status") == "Primary"
    )
    return synced, repr(status)


class SyncedCheck:
    """HAProxy's check of one node: an HTTP server on a free port in a process
    of its own (``python -m tests.faults.galera_proxy PORT HOST PORT``), as a
    check daemon runs beside each node: in the harness's process it shared
    the interpreter with the injector's threads, and on a loaded machine
    checks ran past HAProxy's timeout."""

    def __init__(self, node, log: Path):
        self.port = free_port()
        with open(log, "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.faults.galera_proxy"]
                + [str(self.port), node.host, str(node.port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=PROJECT_ROOT,
            )

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def serve_check(port: int, node_host: str, node_port: int) -> None:
    """Answer HAProxy's checks of the node at ``node_host:node_port`` on
    ``port``."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            synced, said = node_synced(node_host, node_port)
            body = said.encode()
            try:
                self.send_response(200 if synced else 503)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except ConnectionError:
                pass  # HAProxy had its answer from the status line

        def log_message(self, *args) -> None:
            pass  # a check a second

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    server.serve_forever()


class GaleraProxy:
    """``start()``, ``url(database)``, ``serving()``; ``close()`` stops it."""

    def __init__(self, cluster, directory: Path):
        self.cluster = cluster
        self.directory = directory
        self.port = free_port()
        self.socket = directory / "haproxy.sock"
        self.checks = [
            SyncedCheck(node, directory / f"check-{node.name}.log")
            for node in cluster.nodes
        ]
        self.process: subprocess.Popen | None = None
        # (wall clock, the node HAProxy sends to from then on), each change,
        # as ``_watch`` saw it (every 100 ms).
        self.changes: list[tuple[float, str | None]] = []
        self._closing = threading.Event()
        self._watcher = threading.Thread(target=self._watch, daemon=True)

    def config(self) -> str:
        servers = []
        for n, (node, check) in enumerate(
            zip(self.cluster.nodes, self.checks, strict=True)
        ):
            role = "on-marked-up shutdown-backup-sessions" if n == 0 else "backup"
            servers.append(
                f"    server {node.name} {node.host}:{node.port}"
                # The check runs on the harness's side (a check daemon on the
                # node's host, in a deployment), not at the node's address.
                f" check addr 127.0.0.1 port {check.port} {role}"
            )
        return "\n".join(
            [
                "global",
                f"    stats socket {self.socket} mode 600 level admin",
                "    maxconn 4000",
                "defaults",
                "    mode tcp",
                "    timeout connect 1s",
                # Longer than any statement and than the pool's recycle (3600 s):
                # the service's own timeouts end a statement, not the proxy.
                "    timeout client 2h",
                "    timeout server 2h",
                f"    timeout check {CHECK_TIMEOUT_MS}ms",
                "listen galera",
                f"    bind 127.0.0.1:{self.port}",
                "    balance first",
                "    option httpchk GET /",
                "    http-check expect status 200",
                f"    default-server inter {CHECK_INTERVAL_MS}ms fall 2 rise 2"
                " on-marked-down shutdown-sessions",
                *servers,
                "",
            ]
        )

    def url(self, database: str) -> str:
        return f"mariadb://root@127.0.0.1:{self.port}/{database}"

    def start(self, timeout: float = 30.0) -> None:
        """Start HAProxy; return once it sends to galera0."""
        path = self.directory / "haproxy.cfg"
        path.write_text(self.config())
        log = open(self.directory / "haproxy.log", "ab")  # noqa: SIM115
        self.process = subprocess.Popen(
            [shutil.which("haproxy") or "/usr/sbin/haproxy", "-db", "-f", str(path)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while self.serving() != self.cluster.nodes[0].name:
            if self.process.poll() is not None:
                raise ClusterError(f"haproxy exited:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"haproxy sends to no Synced node after {timeout} s:"
                    f" {self.states()}"
                )
            time.sleep(0.1)
        self._watcher.start()

    def _watch(self) -> None:
        last = self.serving()
        self.changes.append((time.time(), last))
        while not self._closing.wait(0.1):
            now = self.serving()
            if now != last:
                self.changes.append((time.time(), now))
                last = now

    def switch(
        self, since: float, *, away_from: str | None, to: str | None = None
    ) -> tuple[str, float] | None:
        """The first change after ``since`` to a node other than
        ``away_from`` (``to``, if given): (that node, when), or None yet."""
        for at, node in list(self.changes):
            if at >= since and node not in (away_from, None) and to in (None, node):
                return node, at
        return None

    def log_tail(self) -> str:
        try:
            return (self.directory / "haproxy.log").read_text(errors="replace")[-3000:]
        except FileNotFoundError:
            return ""

    def _command(self, line: str) -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as admin:
            admin.settimeout(5)
            admin.connect(str(self.socket))
            admin.sendall(line.encode() + b"\n")
            chunks = []
            while chunk := admin.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def states(self) -> dict[str, str]:
        """Each server's state as HAProxy's checks have it, in the config's
        order: UP, DOWN, or on its way ("UP 1/2" going down, "DOWN 1/2" up)."""
        try:
            stat = self._command("show stat")
        except OSError:
            return {}
        header, *rows = stat.strip().splitlines()
        columns = header.lstrip("# ").split(",")
        found = {}
        for row in rows:
            fields = dict(zip(columns, row.split(","), strict=False))
            if fields["pxname"] == "galera" and fields["svname"] not in (
                "FRONTEND",
                "BACKEND",
            ):
                found[fields["svname"]] = fields["status"]
        return found

    def serving(self) -> str | None:
        """The node new connections go to: the first server whose state is UP
        (one "UP 1/2" is on its way down and still takes them), galera0
        first; None when no server is up."""
        for name, state in self.states().items():
            if state.startswith("UP"):
                return name
        return None

    def close(self) -> None:
        self._closing.set()
        if self._watcher.is_alive():
            self._watcher.join()
        try:
            if self.process is not None and self.process.poll() is None:
                self.process.terminate()
                try:
                    self.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()
        finally:
            for check in self.checks:
                check.close()


if __name__ == "__main__":
    serve_check(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]))
