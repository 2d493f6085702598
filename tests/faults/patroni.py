"""A private highly available PostgreSQL for one harness run: etcd + 3 Patroni members.

Everything on loopback and free ports, in one temporary directory: one etcd
(``--data-dir`` in that directory), three Patroni members, each with its own data
directory, PostgreSQL port and REST port, run as the ``postgres`` OS user
(PostgreSQL refuses root). Debian's ``patroni`` and ``etcd-server`` packages.

``synchronous`` (the default) is the configuration a lock service needs:
``synchronous_mode`` with ``synchronous_mode_strict``, so a commit is acknowledged
only once a standby has it and Patroni promotes only that standby. Off, replication
is asynchronous: the configuration the checker must catch losing grants.

Clients reach the primary of the moment through a libpq multi-host URL with
``target_session_attrs=read-write`` (``url``).
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import psycopg

from bench.ports import free_port
from tests.faults.cluster import ClusterError, postgres_bin

SCOPE = "lockkeeper-faults"
# A line of PostgreSQL's server log with its default prefix (``%m [%p] ``):
# "2026-12-07 02:30:59.846 UTC [15813] LOG:  listening on ...". Patroni's own
# lines have a comma before their milliseconds and no process id.
SERVER_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ \S+ \[\d+\] ")
# A port is picked (``free_port``) seconds before the server binds it: PostgreSQL
# binds its port only after initdb (a clone's, after its base backup). A test
# process outside the suite's workers (``pytest -n 0`` beside a CI run) picks
# from the whole range and can take it meanwhile. PostgreSQL then logs
# 'could not bind IPv4 address "127.0.0.1": Address already in use', Patroni's
# REST server "[Errno 98] Address already in use", etcd "bind: address already
# in use"; the start tries again on new ports, this many times.
PORT_TAKEN = re.compile(r"address already in use", re.IGNORECASE)
PORT_RETRIES = 3


def patroni_prerequisites() -> str | None:
    """What is missing to run a Patroni cluster here, or None."""
    for tool in ("patroni", "etcd"):
        if shutil.which(tool) is None:
            return f"{tool} missing (apt-get install patroni etcd-server etcd-client)"
    try:
        postgres_bin()
    except ClusterError as exc:
        return str(exc)
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "runuser missing (needed to run PostgreSQL as postgres)"
    return None


class Member:
    def __init__(self, name: str, root: Path):
        self.name = name
        self.dir = root / name
        self.data = self.dir / "data"
        self.port = free_port()
        self.rest_port = free_port()
        self.config = self.dir / "patroni.yml"
        self.log = self.dir / "patroni.log"
        self.process: subprocess.Popen | None = None
        # The PostgreSQL ports of starts given up because another process took
        # a port of theirs first.
        self.ports_taken: list[int] = []

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def server_log_tail(self, lines: int = 30) -> str:
        """The last lines PostgreSQL itself wrote. Its server log is its stderr,
        which it shares with Patroni (``patroni.log``), where a failed start's
        cause (e.g. ``could not bind IPv4 address``) comes well before the
        traceback and retries that end Patroni's own log."""
        server = [
            line for line in self.log_text().splitlines() if SERVER_LINE.match(line)
        ]
        return "\n".join(server[-lines:])

    def logs(self) -> str:
        """What to show of a member that failed: PostgreSQL's server log, then
        Patroni's."""
        return (
            f"--- {self.name}: PostgreSQL's server log (tail) ---\n"
            f"{self.server_log_tail() or '(nothing yet)'}\n"
            f"--- {self.name}: Patroni's log (tail, {self.log}) ---\n"
            f"{self.log_tail()}"
        )

    def log_has_traceback(self) -> bool:
        return "Traceback (most recent call last)" in self.log_text()

    def port_taken(self) -> bool:
        """Its PostgreSQL or its REST server found its port taken."""
        return bool(PORT_TAKEN.search(self.log_text()))

    @property
    def rest(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    def postgres_pids(self) -> list[int]:
        """The postmaster and every process it started (backends, walsenders...).

        Only a process that runs in this data directory (PostgreSQL works in
        it): a ``postmaster.pid`` a crash left names a process long gone, and
        with the kernel's 32768 process ids its number may be anybody's now,
        such as another cluster's PostgreSQL that is just starting."""
        try:
            postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        except (FileNotFoundError, ValueError, IndexError):
            return []
        if not self._works_here(postmaster):
            return []
        pids = [postmaster]
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
            if int(fields[1]) == postmaster:  # the parent pid
                pids.append(int(entry.name))
        return pids

    def _works_here(self, pid: int) -> bool:
        try:
            return Path(os.readlink(f"/proc/{pid}/cwd")) == self.data.resolve()
        except OSError:  # gone, or not ours to look at
            return False


class PatroniCluster:
    """``start()``, ``url``, ``leader()``, ``kill_primary_postgres()``,
    ``switchover()``, ``wait_for_leader()``; ``close()`` removes everything."""

    def __init__(
        self,
        *,
        members: int = 3,
        synchronous: bool = True,
        user: str = "postgres",
        maximum_lag_on_failover: int = 1048576,
    ):
        self.bin = postgres_bin()
        self.synchronous = synchronous
        self.maximum_lag_on_failover = maximum_lag_on_failover
        self.root = Path(tempfile.mkdtemp(prefix="lk-faults-patroni-"))
        self.etcd_port = free_port()
        self.etcd_peer_port = free_port()
        self.etcd: subprocess.Popen | None = None
        self.members = [Member(f"pg{n}", self.root) for n in range(members)]
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            entry = pwd.getpwnam(user)
            self._as_user = ["runuser", "-u", user, "--"]
            self._owner = (entry.pw_uid, entry.pw_gid)
        else:
            self._owner = None
        for member in self.members:
            member.dir.mkdir()
            if self._owner:
                os.chown(member.dir, *self._owner)
            self._write_config(member)
        if self._owner:
            os.chown(self.root, *self._owner)

    @property
    def url(self) -> str:
        """Every member's port (a start may have moved one), read-write first."""
        hosts = "&".join(f"host=127.0.0.1:{m.port}" for m in self.members)
        # connect_timeout bounds a host that does not answer (a dead machine);
        # here a killed server refuses at once.
        return (
            f"postgresql://postgres@/postgres?{hosts}"
            "&target_session_attrs=read-write&connect_timeout=3"
        )

    # -- configuration ---------------------------------------------------------

    def _write_config(self, member: Member) -> None:
        member.config.write_text(json.dumps(self._member_config(member), indent=1))
        if self._owner:
            os.chown(member.config, *self._owner)

    def _member_config(self, member: Member) -> dict:
        # Patroni reads YAML; JSON is YAML.
        return {
            "scope": SCOPE,
            "name": member.name,
            "log": {"level": "INFO"},
            "restapi": {
                "listen": f"127.0.0.1:{member.rest_port}",
                "connect_address": f"127.0.0.1:{member.rest_port}",
            },
            "etcd3": {"hosts": [f"127.0.0.1:{self.etcd_port}"]},
            "bootstrap": {
                "dcs": {
                    # Short loops: a failover within seconds, not the 30 s default.
                    "ttl": 20,
                    "loop_wait": 1,
                    "retry_timeout": 5,
                    # A crashed primary is failed over at once, not restarted in
                    # place for up to 300 s.
                    "primary_start_timeout": 0,
                    "maximum_lag_on_failover": self.maximum_lag_on_failover,
                    "synchronous_mode": self.synchronous,
                    "synchronous_mode_strict": self.synchronous,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "use_slots": True,
                        "parameters": {
                            "synchronous_commit": "on",
                            "max_connections": 200,
                            "shared_buffers": "32MB",
                            "wal_log_hints": "on",
                            "wal_keep_size": "128MB",
                            # A killed server (not a crashed host) keeps what it
                            # wrote to the OS.
                            "fsync": "off",
                        },
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"locale": "C.UTF-8"}],
                "pg_hba": [
                    "local all all trust",
                    "host replication all 127.0.0.1/32 trust",
                    "host all all 127.0.0.1/32 trust",
                ],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{member.port}",
                "connect_address": f"127.0.0.1:{member.port}",
                "data_dir": str(member.data),
                "bin_dir": str(self.bin),
                "pgpass": str(member.dir / "pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres"},
                    "replication": {"username": "postgres"},
                    "rewind": {"username": "postgres"},
                },
                "parameters": {"unix_socket_directories": str(member.dir)},
                "remove_data_directory_on_rewind_failure": True,
                "remove_data_directory_on_diverged_timelines": True,
            },
            "tags": {
                "nofailover": False,
                "noloadbalance": False,
                "clonefrom": False,
                "nosync": False,
            },
        }

    # -- life cycle --------------------------------------------------------------

    def start(self, timeout: float = 180.0) -> None:
        self._start_etcd()
        # The first member bootstraps alone; the others clone it once it leads.
        # Until the cluster is healthy no member has any reason to log a
        # traceback, so one ends the start at once.
        self.start_member(self.members[0])
        self.wait_for_leader(timeout=timeout, bootstrapping=True)
        for member in self.members[1:]:
            self.start_member(member)
        self.wait_healthy(timeout=timeout, bootstrapping=True)

    def _start_etcd(self) -> None:
        etcd_dir = self.root / "etcd"
        log_path = self.root / "etcd.log"
        for attempt in range(PORT_RETRIES + 1):
            self._etcd_log = open(log_path, "ab")  # noqa: SIM115
            client = f"http://127.0.0.1:{self.etcd_port}"
            peer = f"http://127.0.0.1:{self.etcd_peer_port}"
            self.etcd = subprocess.Popen(
                [
                    shutil.which("etcd") or "etcd",
                    "--name",
                    "etcd0",
                    "--data-dir",
                    str(etcd_dir),
                    "--listen-client-urls",
                    client,
                    "--advertise-client-urls",
                    client,
                    "--listen-peer-urls",
                    peer,
                    "--initial-advertise-peer-urls",
                    peer,
                    "--initial-cluster",
                    f"etcd0={peer}",
                    "--listen-metrics-urls",
                    f"http://127.0.0.1:{free_port()}",
                ],
                stdout=self._etcd_log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            deadline = time.monotonic() + 30
            while True:
                try:
                    if httpx.get(client + "/health", timeout=1).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                if self.etcd.poll() is not None or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            if self.etcd.poll() is None:
                os.killpg(self.etcd.pid, signal.SIGKILL)
                self.etcd.wait()
            self._etcd_log.close()
            log = log_path.read_text(errors="replace")
            if not PORT_TAKEN.search(log) or attempt == PORT_RETRIES:
                tail = "\n".join(log.splitlines()[-20:])
                raise ClusterError(f"etcd did not start ({log_path}):\n{tail}")
            # Its ports were taken before it bound them: new ones, a new log.
            log_path.rename(self.root / f"etcd.{attempt}.log")
            shutil.rmtree(etcd_dir, ignore_errors=True)
            self.etcd_port, self.etcd_peer_port = free_port(), free_port()
            for member in self.members:
                self._write_config(member)

    def start_member(self, member: Member) -> None:
        log = open(member.log, "ab")  # noqa: SIM115
        member.process = subprocess.Popen(
            [*self._as_user, shutil.which("patroni") or "patroni", str(member.config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # Patroni's bootstrap spawns Python processes that chdir to the
            # working directory they inherit: it must be one the postgres user
            # may enter, wherever (and under whatever mode) the clone sits.
            cwd=member.dir,
        )
        log.close()

    def raise_if_broken(self, *, tracebacks: bool) -> None:
        """Raise at once, with the member's log tail, when a started member's
        Patroni has exited or (``tracebacks``) its log shows a Python traceback;
        waiting out a deadline would only hide why. While the cluster starts
        (``tracebacks``), a member whose port another process took first is
        started again on new ports instead, up to ``PORT_RETRIES`` times."""
        for member in self.members:
            if member.process is None:
                continue
            code = member.process.poll()
            # The member that bootstraps is left to give up by itself: Patroni
            # then removes the cluster's initialize key. Stopped mid-bootstrap,
            # it would leave the key, and started again it would wait for a
            # leader to clone from, forever.
            bootstrapping = member is self.members[0] and code is None
            if (
                tracebacks
                and not bootstrapping
                and len(member.ports_taken) < PORT_RETRIES
                and member.port_taken()
            ):
                self._restart_on_new_ports(member)
                continue
            if code is not None:
                raise ClusterError(
                    f"{member.name}: patroni exited with {code}:\n{member.logs()}"
                )
            if tracebacks and member.log_has_traceback():
                raise ClusterError(f"{member.name}: patroni failed:\n{member.logs()}")

    def _restart_on_new_ports(self, member: Member) -> None:
        """Stop ``member`` (its Patroni, and its PostgreSQL if one runs), keep
        its log beside, and start it afresh on new ports."""
        self._stop_member(member)
        member.ports_taken.append(member.port)
        member.log.rename(member.dir / f"patroni.{len(member.ports_taken)}.log")
        for data in (member.data, member.data.with_name("data.failed")):
            shutil.rmtree(data, ignore_errors=True)
        member.port, member.rest_port = free_port(), free_port()
        self._write_config(member)
        self.start_member(member)

    def _stop_member(self, member: Member) -> None:
        if member.process is None:
            return
        if member.process.poll() is None:
            # Patroni stops its PostgreSQL on SIGTERM.
            os.killpg(member.process.pid, signal.SIGTERM)
            try:
                member.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(member.process.pid, signal.SIGKILL)
                member.process.wait()
        for pid in member.postgres_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def cluster_state(self) -> dict:
        """Patroni's ``/cluster`` from the first member that answers."""
        for member in self.members:
            try:
                response = httpx.get(member.rest + "/cluster", timeout=2)
            except httpx.TransportError:
                continue
            if response.status_code == 200:
                return response.json()
        return {"members": []}

    def leader(self) -> Member | None:
        for entry in self.cluster_state()["members"]:
            if entry.get("role") == "leader" and entry.get("state") == "running":
                return self.member(entry["name"])
        return None

    def member(self, name: str) -> Member:
        return next(m for m in self.members if m.name == name)

    def writable(self) -> Member | None:
        """The member that accepts writes right now, asked of PostgreSQL itself."""
        for member in self.members:
            try:
                with psycopg.connect(
                    host="127.0.0.1",
                    port=member.port,
                    user="postgres",
                    dbname="postgres",
                    connect_timeout=1,
                    target_session_attrs="read-write",
                ):
                    return member
            except psycopg.Error:
                continue
        return None

    def wait_for_leader(
        self,
        *,
        other_than: Member | None = None,
        timeout: float = 60.0,
        bootstrapping: bool = False,
    ) -> tuple[Member, float]:
        """The new writable primary and the monotonic time it was first seen."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.raise_if_broken(tracebacks=bootstrapping)
            found = self.writable()
            if found is not None and found is not other_than:
                return found, time.monotonic()
            time.sleep(0.05)
        raise ClusterError(
            f"no writable primary after {timeout} s: {self.cluster_state()}\n"
            f"{self.logs()}"
        )

    def wait_healthy(self, timeout: float = 120.0, bootstrapping: bool = False) -> None:
        """A leader, every member streaming, and (synchronous) a sync standby."""
        deadline = time.monotonic() + timeout
        state: dict = {}
        while time.monotonic() < deadline:
            self.raise_if_broken(tracebacks=bootstrapping)
            state = self.cluster_state()
            members = state.get("members", [])
            roles = [m.get("role") for m in members]
            streaming = [
                m
                for m in members
                # Patroni 3.0 says "running" (later versions "streaming"); a
                # replica that replicates reports its lag.
                if m.get("role") != "leader"
                and m.get("state") in ("running", "streaming")
                and isinstance(m.get("lag"), int)
            ]
            ok = (
                len(members) == len(self.members)
                and "leader" in roles
                and len(streaming) == len(self.members) - 1
            )
            if ok and self.synchronous:
                ok = "sync_standby" in roles
            if ok and self.writable() is not None:
                return
            time.sleep(0.2)
        raise ClusterError(
            f"cluster not healthy after {timeout} s: {state}\n{self.logs()}"
        )

    def logs(self) -> str:
        """The log tails of every member that was started."""
        return "\n".join(m.logs() for m in self.members if m.process is not None)

    # -- faults ------------------------------------------------------------------

    def kill_primary_postgres(self) -> Member:
        """SIGKILL the leader's PostgreSQL (every process of it); Patroni stays."""
        leader = self.leader()
        if leader is None:
            raise ClusterError(f"no leader to kill: {self.cluster_state()}")
        pids = leader.postgres_pids()
        if not pids:
            raise ClusterError(f"{leader.name}: no postmaster.pid")
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return leader

    def stall_replication(self) -> list[int]:
        """SIGSTOP the WAL receiver of every standby: from now on they fall
        behind, as over a congested network. Returns their pids (SIGKILL them
        once the primary is dead, so WAL still in their sockets is never read)."""
        stopped = []
        for member in self.members:
            try:
                with psycopg.connect(
                    host="127.0.0.1",
                    port=member.port,
                    user="postgres",
                    dbname="postgres",
                    connect_timeout=2,
                ) as conn:
                    row = conn.execute(
                        "SELECT pid FROM pg_stat_wal_receiver"
                    ).fetchone()
            except psycopg.Error:
                continue
            if row and row[0]:
                os.kill(row[0], signal.SIGSTOP)
                stopped.append(row[0])
        return stopped

    def scalar(self, member: Member, sql: str):
        """``sql``'s first value as ``member`` answers it (a standby reads what it
        has replayed), or None when it does not answer."""
        try:
            with psycopg.connect(
                host="127.0.0.1",
                port=member.port,
                user="postgres",
                dbname="postgres",
                connect_timeout=2,
            ) as conn:
                row = conn.execute(sql).fetchone()
        except psycopg.Error:
            return None
        return row[0] if row else None

    def switchover(self) -> tuple[Member, Member]:
        """A planned switchover through Patroni's REST API: (old, new) leader."""
        state = self.cluster_state()
        leader = next(m for m in state["members"] if m.get("role") == "leader")
        candidates = [
            m["name"]
            for m in state["members"]
            if m.get("role") in ("sync_standby", "replica")
            and (not self.synchronous or m.get("role") == "sync_standby")
        ]
        if not candidates:
            raise ClusterError(f"no switchover candidate: {state}")
        old = self.member(leader["name"])
        response = httpx.post(
            old.rest + "/switchover",
            json={"leader": leader["name"], "candidate": candidates[0]},
            timeout=60,
        )
        if response.status_code != 200:
            raise ClusterError(
                f"switchover refused: {response.status_code} {response.text}"
            )
        return old, self.member(candidates[0])

    def close(self) -> None:
        try:
            for member in self.members:
                if member.process is not None and member.process.poll() is None:
                    # Patroni stops its PostgreSQL on SIGTERM.
                    os.killpg(member.process.pid, signal.SIGTERM)
            for member in self.members:
                if member.process is None:
                    continue
                try:
                    member.process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(member.process.pid, signal.SIGKILL)
                    member.process.wait()
                for pid in member.postgres_pids():
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            if self.etcd is not None and self.etcd.poll() is None:
                os.killpg(self.etcd.pid, signal.SIGKILL)
                self.etcd.wait()
                self._etcd_log.close()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    # The harness's generic database interface (used for the plain restart fault).
    def stop(self, mode: str = "immediate") -> None:
        self.kill_primary_postgres()

    def __enter__(self) -> PatroniCluster:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
