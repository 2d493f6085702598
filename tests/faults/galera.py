"""A private MariaDB Galera cluster for one harness run: three nodes on loopback
(or each in a network namespace of its own; or two and an arbitrator).

Everything in one temporary directory and on free ports, beside the shared
MariaDB on 3306 (never touched): each node has its own data directory (made by
``mariadb-install-db``), SQL port and socket, Galera replication (gcomm) port,
IST port and SST port. The first node bootstraps the cluster
(``--wsrep-new-cluster``); the others join it and receive its state by SST over
rsync (``wsrep_sst_rsync``: rsync is a Debian package, ``mariabackup`` another).
As root the nodes run as the ``mysql`` OS user, as ``cluster.MariaDBServer`` does.

``GaleraCluster(isolated=True)`` puts each node in a network namespace of its
own, at an address of its own, which ``partition()`` cuts off from the others
(``galera_network``); ``GaleraCluster(nodes=2, arbitrator=True)`` adds a
Galera arbitrator (``garbd``) as the third member.

Galera's own defaults stay as a user would have them: ``wsrep_auto_increment_control``
gives each node its own auto-increment offset, ``wsrep_sync_wait`` is 0 (a read may
not have seen what another node committed). ``url(node)`` points a client at one node.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pymysql

from bench.ports import free_port
from tests.faults.cluster import ClusterError
from tests.faults.galera_network import HARNESS_ADDRESS, NodeNetworks

PROVIDER = Path("/usr/lib/galera/libgalera_smm.so")
DATABASE = "lockkeeper"
ABORT_COUNTERS = ("wsrep_local_cert_failures", "wsrep_local_bf_aborts")
CLUSTER_NAME = "lockkeeper-faults"
# Short timeouts: a killed node leaves the view within seconds.
TIMEOUTS = (
    "evs.suspect_timeout=PT3S",
    "evs.inactive_timeout=PT6S",
    "evs.install_timeout=PT6S",
)


def galera_prerequisites() -> str | None:
    """What is missing to run a Galera cluster here, or None."""
    if not PROVIDER.exists():
        return f"{PROVIDER} missing (apt-get install galera-4)"
    for tool in ("mariadbd", "mariadb-install-db", "rsync", "wsrep_sst_rsync"):
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            return f"{tool} missing (apt-get install mariadb-server galera-4 rsync)"
    return None


def _running_on(node: Node) -> list[str]:
    """The command lines of the processes that name ``node``'s directory."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(node.dir) in command:
            found.append(f"{proc.name}: {command[:200]}")
    return found


class Node:
    def __init__(self, name: str, root: Path, host: str = "127.0.0.1"):
        self.name = name
        self.host = host
        self.dir = root / name
        self.data = self.dir / "data"
        self.socket = self.dir / "mysqld.sock"
        self.log = self.dir / "mariadbd.log"
        self.port = free_port()
        self.gcomm_port = free_port()
        self.ist_port = free_port()
        self.sst_port = free_port()
        self.process: subprocess.Popen | None = None
        self.log_start = 0  # where the log of its latest start begins

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def connect(self, *, database: str | None = DATABASE, timeout: int = 2):
        return pymysql.connect(
            host=self.host,
            port=self.port,
            user="root",
            database=database,
            connect_timeout=timeout,
            autocommit=True,
        )

    def status(self, name: str) -> str | None:
        """A ``wsrep_*`` status variable as this node reports it, or None when
        the node does not answer."""
        try:
            with self.connect(database=None, timeout=1) as conn, conn.cursor() as cur:
                cur.execute("SHOW STATUS LIKE %s", (name,))
                row = cur.fetchone()
        except pymysql.err.MySQLError:
            return None
        return row[1] if row else None

    def url(self, database: str = DATABASE) -> str:
        return f"mariadb://root@{self.host}:{self.port}/{database}"

    def aborts(self) -> dict[str, int]:
        """Transactions this node aborted for another node's write since it
        started: its own at certification (``wsrep_local_cert_failures``),
        and local ones a replicated write broke into (``wsrep_local_bf_aborts``);
        zeros when it does not answer."""
        return {name: int(self.status(name) or 0) for name in ABORT_COUNTERS}


class Arbitrator:
    """``garbd``: a member of the group that votes in its views and keeps no
    data, on its own gcomm port on loopback."""

    def __init__(self, root: Path):
        self.gcomm_port = free_port()
        self.root = root
        self.log = root / "garbd.log"
        self.process: subprocess.Popen | None = None

    def start(self, address: str) -> None:
        options = ";".join(
            [f"gmcast.listen_addr=tcp://127.0.0.1:{self.gcomm_port}", *TIMEOUTS]
        )
        garbd = shutil.which("garbd") or "/usr/bin/garbd"
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [garbd, "--address", address, "--group", CLUSTER_NAME]
                + ["--name", "garbd", "--options", options],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                # It writes its view (gvwstate.dat) where it runs.
                cwd=self.root,
            )

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


class GaleraCluster:
    """``start()``, ``nodes``, ``url(node)``; ``close()`` removes everything."""

    def __init__(
        self,
        *,
        nodes: int = 3,
        user: str = "mysql",
        isolated: bool = False,
        arbitrator: bool = False,
    ):
        """``isolated``: each node in a network namespace of its own, which
        ``partition()`` can cut off (``galera_network``). ``arbitrator``: a
        Galera arbitrator (``garbd``, Debian's galera-arbitrator-4) joins the
        nodes as a member that votes and stores nothing: two nodes and it keep
        a primary component when one node goes."""
        if arbitrator and isolated:
            raise ClusterError("an arbitrator beside isolated nodes is not built")
        self.networks = NodeNetworks(nodes) if isolated else None
        self.root = Path(tempfile.mkdtemp(prefix="lk-faults-galera-"))
        self.nodes = [
            Node(
                f"galera{n}",
                self.root,
                self.networks.address(n) if self.networks else "127.0.0.1",
            )
            for n in range(nodes)
        ]
        self.user = user
        owner = None
        if os.geteuid() == 0:
            entry = pwd.getpwnam(user)
            owner = (entry.pw_uid, entry.pw_gid)
            os.chown(self.root, *owner)
        self._as_user = [f"--user={user}"] if owner else []
        for node in self.nodes:
            node.dir.mkdir()
            if owner:
                os.chown(node.dir, *owner)
        # Only the first node needs system tables: the others receive the
        # whole data directory by SST.
        self._install(self.nodes[0])
        for node in self.nodes[1:]:
            node.data.mkdir()
            if owner:
                os.chown(node.data, *owner)
        self.arbitrator = Arbitrator(self.root) if arbitrator else None
        members = [f"{node.host}:{node.gcomm_port}" for node in self.nodes]
        if self.arbitrator is not None:
            members.append(f"127.0.0.1:{self.arbitrator.gcomm_port}")
        self.address = "gcomm://" + ",".join(members)

    @property
    def size(self) -> int:
        """Members of the whole cluster: the nodes and the arbitrator."""
        return len(self.nodes) + (self.arbitrator is not None)

    def url(self, node: Node | int = 0, *, database: str = DATABASE) -> str:
        if isinstance(node, int):
            node = self.nodes[node]
        return node.url(database)

    def _install(self, node: Node) -> None:
        install = shutil.which("mariadb-install-db") or "/usr/bin/mariadb-install-db"
        result = subprocess.run(
            [
                install,
                "--no-defaults",
                *self._as_user,
                f"--datadir={node.data}",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
            cwd=node.dir,
        )
        if result.returncode != 0:
            raise ClusterError(
                f"{node.name}: mariadb-install-db failed: {result.stderr[-2000:]}"
            )

    def _arguments(self, node: Node, *, bootstrap: bool) -> list[str]:
        provider_options = ";".join(
            [
                f"gmcast.listen_addr=tcp://{node.host}:{node.gcomm_port}",
                f"ist.recv_addr={node.host}:{node.ist_port}",
                *TIMEOUTS,
                "gcache.size=64M",
            ]
        )
        command = [
            shutil.which("mariadbd") or "/usr/sbin/mariadbd",
            "--no-defaults",
            *self._as_user,
            f"--datadir={node.data}",
            f"--port={node.port}",
            f"--bind-address={node.host}",
            f"--socket={node.socket}",
            f"--pid-file={node.dir / 'mysqld.pid'}",
            "--skip-name-resolve",
            "--innodb-buffer-pool-size=32M",
            "--innodb-log-file-size=16M",
            "--max-connections=300",
            "--character-set-server=utf8mb4",
            # What Galera requires.
            "--binlog-format=ROW",
            "--innodb-autoinc-lock-mode=2",
            "--default-storage-engine=InnoDB",
            "--wsrep-on=ON",
            f"--wsrep-provider={PROVIDER}",
            f"--wsrep-cluster-name={CLUSTER_NAME}",
            f"--wsrep-cluster-address={self.address}",
            f"--wsrep-node-name={node.name}",
            f"--wsrep-node-address={node.host}:{node.gcomm_port}",
            f"--wsrep-node-incoming-address={node.host}:{node.port}",
            f"--wsrep-provider-options={provider_options}",
            "--wsrep-sst-method=rsync",
            f"--wsrep-sst-receive-address={node.host}:{node.sst_port}",
            "--wsrep-slave-threads=2",
            *(["--wsrep-new-cluster"] if bootstrap else []),
        ]
        if self.networks is None:
            return command
        return self.networks.command(self.nodes.index(node), command)

    # -- life cycle --------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> None:
        """Bootstrap the first node, then join the others one by one (a donor
        serves one SST at a time); return once every node is Synced in one
        primary component of all nodes, with the database created."""
        self.start_node(self.nodes[0], bootstrap=True)
        if self.networks is not None:
            self._let_harness_in(self.nodes[0], timeout)
        self.wait_synced(self.nodes[0], size=1, timeout=timeout)
        with self.nodes[0].connect(database=None) as conn, conn.cursor() as cur:
            cur.execute(
                f"CREATE DATABASE IF NOT EXISTS {DATABASE} "
                "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
            )
        count = 1
        if self.arbitrator is not None:
            self.arbitrator.start(self.address)
            count += 1
            self.wait_synced(self.nodes[0], size=count, timeout=timeout)
        for node in self.nodes[1:]:
            count += 1
            self.start_node(node)
            self.wait_synced(node, size=count, timeout=timeout)

    def _let_harness_in(self, node: Node, timeout: float) -> None:
        """Give the harness's address (its clients' source) the root account
        that ``mariadb-install-db`` gives loopback, over the node's socket;
        the joiners receive it by SST."""
        deadline = time.monotonic() + timeout
        while True:
            self.raise_if_broken()
            try:
                conn = pymysql.connect(
                    unix_socket=str(node.socket), user="root", connect_timeout=2
                )
            except pymysql.err.MySQLError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
                continue
            with conn, conn.cursor() as cursor:
                account = f"'root'@'{HARNESS_ADDRESS}'"
                cursor.execute(f"CREATE USER IF NOT EXISTS {account}")
                cursor.execute(f"GRANT ALL ON *.* TO {account} WITH GRANT OPTION")
            return

    def recovered_position(self, node: Node) -> str | None:
        """The position (``uuid:seqno``) of the last transaction ``node``
        committed, read from its storage (``mariadbd --wsrep-recover``, what
        ``galera_recovery`` does before systemd starts a node): after a crash its
        ``grastate.dat`` says -1, and a node started without its position asks
        for a whole copy (SST) instead of the writesets it missed (IST)."""
        recover_log = node.dir / "recover.log"
        recover_log.unlink(missing_ok=True)
        recovering = subprocess.Popen(
            [
                *self._arguments(node, bootstrap=False),
                "--wsrep-recover",
                # No clients: it opens the node's port otherwise, where the
                # node's app instance keeps trying to connect.
                "--skip-networking",
                f"--log-error={recover_log}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=node.dir,
        )
        # The position is all it is run for: once it is logged the process
        # is stopped. Twice in multi-writer runs it logged the position and
        # was still running 120 s later (its port open: "Server socket
        # created"), and the node's restart failed.
        deadline = time.monotonic() + 120
        found = None
        try:
            while found is None and time.monotonic() < deadline:
                try:
                    text = recover_log.read_text(errors="replace")
                except FileNotFoundError:
                    text = ""
                # The whole line: a seqno read while it is written is cut.
                found = re.search(r"WSREP: Recovered position: (\S+:-?\d+)\n", text)
                if found is None and recovering.poll() is not None:
                    return None  # it ended without one: a start asks for SST
                time.sleep(0.05)
            if found is None:
                raise ClusterError(
                    f"{node.name}: mariadbd --wsrep-recover logged no position"
                    f" in 120 s; processes on its data: {_running_on(node)};"
                    f" its log:\n{text[-3000:]}"
                )
        finally:
            if recovering.poll() is None:
                recovering.kill()
            recovering.wait()
        if found[1].endswith(":-1"):
            return None
        return found[1]

    def restart_node(self, node: Node, timeout: float = 120.0) -> None:
        """Start a node that was killed from its recovered position, so that it
        rejoins by IST when a donor's cache still holds what it missed; return
        once it is Synced with every node."""
        position = self.recovered_position(node)
        self.start_node(node, position=position)
        self.wait_synced(node, size=self.size, timeout=timeout)

    def start_node(
        self, node: Node, *, bootstrap: bool = False, position: str | None = None
    ) -> None:
        log = open(node.log, "ab")  # noqa: SIM115
        node.log_start = log.tell()
        start = [f"--wsrep-start-position={position}"] if position else []
        node.process = subprocess.Popen(
            [*self._arguments(node, bootstrap=bootstrap), *start],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # The SST script runs in the server's working directory as mysql.
            cwd=node.dir,
        )
        log.close()

    def raise_if_broken(self) -> None:
        """Raise at once, with its log tail, when a started node has exited."""
        garbd = self.arbitrator.process if self.arbitrator else None
        if garbd is not None and garbd.poll() is not None:
            raise ClusterError(
                f"garbd exited with {garbd.returncode}:\n"
                + self.arbitrator.log.read_text(errors="replace")[-3000:]
            )
        for node in self.nodes:
            if node.process is None:
                continue
            code = node.process.poll()
            if code is not None:
                raise ClusterError(
                    f"{node.name}: mariadbd exited with {code}:\n{node.log_tail()}"
                )

    def wait_synced(self, node: Node, *, size: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        state = size_seen = None
        while time.monotonic() < deadline:
            self.raise_if_broken()
            state = node.status("wsrep_local_state_comment")
            size_seen = node.status("wsrep_cluster_size")
            if (
                state == "Synced"
                and size_seen == str(size)
                and node.status("wsrep_cluster_status") == "Primary"
                and node.status("wsrep_ready") == "ON"
            ):
                return
            time.sleep(0.1)
        raise ClusterError(
            f"{node.name}: not synced after {timeout} s (state {state}, cluster "
            f"size {size_seen}):\n{node.log_tail()}"
        )

    def last_transfer(self, node: Node) -> str:
        """How ``node`` received the state at its latest start: "IST" (the
        writesets it missed, from a donor's cache), "SST" (a whole copy of the
        data directory) or "none"."""
        with open(node.log, "rb") as log:
            log.seek(node.log_start)
            text = log.read().decode(errors="replace")
        # A node that starts runs the rsync script, which says which it was;
        # one that was evicted and stayed up (a pause, a partition) receives
        # the writesets it missed by the provider alone ("IST received").
        if "SST completed on joiner" in text:
            return "SST"
        if "IST completed on joiner" in text or "IST received:" in text:
            return "IST"
        return "none"

    def kill(self, node: Node) -> None:
        """SIGKILL a node (a crash)."""
        if node.process is None:
            return
        try:
            os.killpg(node.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # it had exited (a failed start)
        node.process.wait()
        node.process = None

    def wipe(self, node: Node) -> None:
        """Empty a killed node's data directory (a lost disk, a node rebuilt):
        started again, it asks a donor for a whole copy (SST)."""
        if node.process is not None:
            raise ClusterError(f"{node.name} is running: kill it first")
        kept = node.data.stat()
        shutil.rmtree(node.data)
        node.data.mkdir(mode=kept.st_mode & 0o7777)
        os.chown(node.data, kept.st_uid, kept.st_gid)

    def rebuild(self, node: Node, timeout: float = 300.0) -> None:
        """Start a wiped node; return once it is Synced with every node."""
        self.start_node(node)
        self.wait_synced(node, size=self.size, timeout=timeout)

    def pause(self, node: Node) -> None:
        """SIGSTOP a node (a frozen process or VM): its sockets stay open and
        answer nothing. What it logs from here on is its next start's."""
        node.log_start = node.log.stat().st_size
        os.killpg(node.process.pid, signal.SIGSTOP)

    def resume(self, node: Node, timeout: float = 120.0) -> None:
        """SIGCONT a paused node; return once it is Synced with every node in
        their view (evicted while it was stopped, it rejoins by IST)."""
        os.killpg(node.process.pid, signal.SIGCONT)
        self.wait_rejoined(node, timeout)

    def partition(self, node: Node) -> None:
        """Cut ``node`` off from the others (not from its clients): packets
        between them are dropped both ways (``galera_network``). What it logs
        from here on is its rejoin's."""
        if self.networks is None:
            raise ClusterError("a partition needs GaleraCluster(isolated=True)")
        node.log_start = node.log.stat().st_size
        self.networks.cut(self.nodes.index(node))

    def heal(self, node: Node, timeout: float = 120.0) -> None:
        """End ``node``'s partition; return once it has rejoined, Synced."""
        self.networks.heal(self.nodes.index(node))
        self.wait_rejoined(node, timeout)

    def wait_rejoined(self, node: Node, timeout: float = 120.0) -> None:
        """Wait until ``node`` is Synced with every node, in their view. A node
        that was paused or cut off still reports the view it was in, Synced
        among all the nodes, until it learns it was evicted."""
        other = next(n for n in self.nodes if n is not node and n.process)
        deadline = time.monotonic() + timeout
        while True:
            self.wait_synced(node, size=self.size, timeout=timeout)
            view = other.status("wsrep_cluster_conf_id")
            if view is not None and node.status("wsrep_cluster_conf_id") == view:
                return
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"{node.name}: in view {node.status('wsrep_cluster_conf_id')}"
                    f" after {timeout} s, {other.name} in {view}"
                )
            time.sleep(0.1)

    def close(self) -> None:
        try:
            for node in self.nodes:
                self.kill(node)
            if self.arbitrator is not None:
                self.arbitrator.stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
            if self.networks is not None:
                self.networks.close()

    def __enter__(self) -> GaleraCluster:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
