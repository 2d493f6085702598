"""Lockkeeper on PostgreSQL against etcd, the lease-and-lock service a team would
pick instead, measured in the same run with the same load.

``http_vs_etcd_lock_postgresql``: acquire+release cycles per second through
Lockkeeper's JSON API (gunicorn, PostgreSQL) against cycles through etcd's own v3
lock API (``/v3/lock/lock`` then ``/v3/lock/unlock`` on its JSON gateway), every
lock on one lease, as etcd's lock recipe uses it. Both driven by wrk with the same
script shape (``cycle.lua``: one keep-alive connection per thread, each thread
cycling a name of its own), alternating round after round.

etcd here is one private member on loopback (Debian's ``etcd-server``, the one
the failover harness uses), with its defaults (it syncs its log to disk on every
write, as PostgreSQL does on every commit).

``embedded_vs_etcd_lock_postgresql``: acquire+release cycles per second of the
worker client in the embedded mode (``LockClient`` on ``EmbeddedTransport``, no
server: ``bench/service_layer.py``'s embedded cycle) in ``EMBEDDED_WORKERS``
worker processes, as a deployment runs several, each cycling a resource of its
own, against etcd's lock cycles from as many clients (wrk with
``EMBEDDED_WORKERS`` connections: the same number of cycles in flight on each
side), alternating in the same run. ``driver_vs_etcd_lock_postgresql``: the
raw driver's cycle (``bench/service_layer.py``'s driver cycle: the same
PostgreSQL statements on a bare psycopg connection, no Python around them) in
as many processes against the same etcd runs: the most the database's route
gives on this machine, whatever the Python around it. Both record the CPU a
cycle cost on each side (``bench.measure.cpu_detail``): the worker processes'
and the PostgreSQL backends' against wrk's and etcd's.

wrk is a C client: etcd's side pays next to nothing for its client (about 0.1
ms of CPU a cycle), where the embedded side's client is the worker's Python.
``embedded_vs_etcd_from_python_workers`` compares the embedded workers with as
many Python worker processes taking the same etcd locks through the same lock
API (``EtcdWorker``: its JSON gateway through the standard library's HTTP
client, one keep-alive connection each), both sides' CPU a cycle beside it.

``session_heartbeat_vs_etcd_keepalive``: heartbeats per second of Lockkeeper
sessions (``PATCH /api/v1/sessions/{id}``: the session and every grant bound to
it renewed in one statement) against keep-alives of etcd leases
(``/v3/lease/keepalive``), with what a worker holds on each: one session (one
lease) per wrk connection, each with ``BOUND_LOCKS`` locks bound to it.
"""

from __future__ import annotations

import base64
import http.client
import json
import shutil
import signal
import subprocess
import time
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from bench.http_api import (
    API_PREFIX,
    LOCKKEEPER_APP,
    create_api_token,
    lockkeeper_env,
    wrk_sample,
)
from bench.measure import Comparison, Sample, alternate, compare, cpu_detail
from bench.ports import free_port
from bench.servers import (
    Server,
    ToolMissing,
    process_cpu_seconds,
    server_configs,
)
from bench.service_layer import run_cycles

BOUND_LOCKS = 100
START_ATTEMPTS = 3
# Generous: etcd syncs its first log entries to a disk that the test suite's
# databases keep busy.
START_SECONDS = 90
SESSIONS = 4
# The embedded side's worker processes (the service section's larger count).
EMBEDDED_WORKERS = 8


class Etcd:
    """One private etcd member; ``base_url`` is its client (and JSON gateway) URL.
    ``cpu_seconds`` makes it a side of ``wrk_sample`` like a gunicorn server."""

    def __init__(self, root: Path):
        executable = shutil.which("etcd")
        if executable is None:
            raise ToolMissing("etcd is not installed: apt-get install -y etcd-server")
        root.mkdir(parents=True, exist_ok=True)
        self._log_path = root / "etcd.log"
        # A port picked free can still be taken by another harness before etcd
        # binds it; etcd then exits at once, and a start on fresh ports is all
        # it takes: each in a data directory of its own, as a member that
        # exited may have written its old peer URL into the first one.
        for attempt in range(START_ATTEMPTS):
            if self._start(executable, root / f"data-{attempt}"):
                return
        raise RuntimeError(
            f"etcd did not start in {START_ATTEMPTS} attempts; the end of "
            f"{self._log_path}:\n{self._log_tail()}"
        )

    def _start(self, executable: str, data_dir: Path) -> bool:
        """Start etcd on fresh ports; ``False`` when it exited before it served."""
        self.port, peer_port = free_port(), free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        peer = f"http://127.0.0.1:{peer_port}"
        self._log = open(self._log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [
                executable,
                "--name",
                "bench",
                "--data-dir",
                str(data_dir),
                "--listen-client-urls",
                self.base_url,
                "--advertise-client-urls",
                self.base_url,
                "--listen-peer-urls",
                peer,
                "--initial-advertise-peer-urls",
                peer,
                "--initial-cluster",
                f"bench={peer}",
                "--listen-metrics-urls",
                f"http://127.0.0.1:{free_port()}",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + START_SECONDS
        while True:
            try:
                if httpx.get(self.base_url + "/health", timeout=1).status_code == 200:
                    return True
            except httpx.TransportError:
                pass
            if self.process.poll() is not None:
                self.stop()
                return False
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"etcd did not answer /health in {START_SECONDS} s; the end of "
                    f"{self._log_path}:\n{self._log_tail()}"
                )
            time.sleep(0.1)

    def _log_tail(self, lines: int = 15) -> str:
        return "\n".join(
            self._log_path.read_text(errors="replace").splitlines()[-lines:]
        )

    def grant_lease(self, ttl: int = 600) -> str:
        response = httpx.post(
            self.base_url + "/v3/lease/grant", json={"TTL": ttl}, timeout=10
        )
        response.raise_for_status()
        return str(response.json()["ID"])

    def lock(self, name: str, lease: str) -> None:
        response = httpx.post(
            self.base_url + "/v3/lock/lock",
            json={"name": base64.b64encode(name.encode()).decode(), "lease": lease},
            timeout=10,
        )
        response.raise_for_status()

    def cpu_seconds(self) -> float:
        return process_cpu_seconds(self.process.pid)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


class EtcdWorker:
    """The cycle of a Python worker process on etcd's lock API (for
    ``run_cycles``): lock its resource's name on the lease, unlock the key
    the lock answered, on one keep-alive connection to the JSON gateway.
    The standard library's ``http.client``, the least CPU a Python worker
    can spend on a request (httpx or requests, what a worker would use, cost
    more): etcd's side is not made slower by its client than it must be."""

    __name__ = "etcd_python"

    def __init__(self, lease: str):
        self.lease = lease

    def __call__(self, base_url: str, _instance: Path):
        address = urlsplit(base_url)
        connection = http.client.HTTPConnection(address.hostname, address.port)
        headers = {"Content-Type": "application/json"}
        lease = self.lease

        def post(path: str, body: dict) -> dict | None:
            connection.request("POST", path, json.dumps(body), headers)
            answer = connection.getresponse()
            content = answer.read()
            return json.loads(content) if answer.status == 200 else None

        def cycle(resource: str, _owner: str) -> bool:
            name = base64.b64encode(resource.encode()).decode()
            locked = post("/v3/lock/lock", {"name": name, "lease": lease})
            if locked is None:
                return False
            return post("/v3/lock/unlock", {"key": locked["key"]}) is not None

        return cycle


def _python_workers_on_etcd(etcd: Etcd, lease: str, seconds: float) -> Sample:
    """``EMBEDDED_WORKERS`` Python worker processes cycling etcd locks, with
    etcd's own CPU a cycle beside the workers'."""
    return run_cycles(
        EtcdWorker(lease),
        etcd.base_url,
        Path(),
        EMBEDDED_WORKERS,
        seconds,
        server_cpu=etcd.cpu_seconds,
    )


def bench_etcd(databases, workdir: Path, plan, log) -> list[Comparison]:
    if "postgresql" not in databases:
        return []
    database = databases["postgresql"]
    config = server_configs()[0]
    token = create_api_token(database.url, workdir / "instance-postgresql")
    etcd = Etcd(workdir / "etcd")
    server = None
    try:
        server = Server(
            LOCKKEEPER_APP,
            config,
            lockkeeper_env(database.url, workdir / "instance-postgresql"),
            workdir / "gunicorn-lockkeeper-etcd-comparison.log",
        )
        lease = etcd.grant_lease()
        sessions, leases = _bound_sessions(server, token), _bound_leases(etcd)
        runs = {
            "lockkeeper": partial(
                wrk_sample, server, API_PREFIX, "locks", "lk.etcd", token=token
            ),
            "etcd": partial(wrk_sample, etcd, "/", "etcd", "etcd", token=lease),
            "heartbeat": partial(
                wrk_sample, server, ",".join(sessions), "heartbeat", "hb", token=token
            ),
            "keepalive": partial(
                wrk_sample, etcd, "/", "etcd-keepalive", "ka", token=",".join(leases)
            ),
            "embedded": lambda seconds, kind="embedded": run_cycles(
                kind,
                database.url,
                workdir / "instance-postgresql",
                EMBEDDED_WORKERS,
                seconds,
            ),
            "etcd_workers": partial(
                wrk_sample,
                etcd,
                "/",
                "etcd",
                "etcdw",
                token=lease,
                connections=EMBEDDED_WORKERS,
            ),
            "etcd_python": partial(_python_workers_on_etcd, etcd, lease),
            "driver": lambda seconds, kind="driver": run_cycles(
                kind,
                database.url,
                workdir / "instance-postgresql",
                EMBEDDED_WORKERS,
                seconds,
            ),
        }
        for run in runs.values():
            try:
                run(seconds=1)  # warm-up, as the HTTP section does
            except RuntimeError:
                pass
        samples = alternate(
            {
                name: partial(run, seconds=plan.http_seconds)
                for name, run in runs.items()
            },
            plan.http_rounds,
        )
    finally:
        if server is not None:
            server.stop()
        etcd.stop()
    server_name = f"{config.worker_class} -w {config.workers}; etcd one member"
    heartbeats = compare(
        "session_heartbeat_vs_etcd_keepalive",
        samples,
        "heartbeat",
        "keepalive",
        "heartbeats/s",
        server=server_name,
        bound_locks=BOUND_LOCKS,
        sessions=SESSIONS,
    )
    log(
        f"{heartbeats.name}: {heartbeats.value:.0f} vs etcd "
        f"{heartbeats.baseline:.0f} heartbeats/s -> {heartbeats.ratio:.2f}x"
    )
    result = compare(
        "http_vs_etcd_lock_postgresql",
        samples,
        "lockkeeper",
        "etcd",
        "cycles/s",
        server=server_name,
    )
    log(
        f"{result.name}: {result.value:.0f} vs etcd {result.baseline:.0f} "
        f"cycles/s -> {result.ratio:.2f}x"
    )
    in_process = []
    for side, what in (
        ("embedded", "embedded worker processes"),
        ("driver", "processes of the raw driver"),
    ):
        found = compare(
            f"{side}_vs_etcd_lock_postgresql",
            samples,
            side,
            "etcd_workers",
            "cycles/s",
            workers=EMBEDDED_WORKERS,
            server="none (in process); etcd one member",
            **cpu_detail(samples, side, "etcd_workers"),
        )
        log(
            f"{found.name}: {EMBEDDED_WORKERS} {what} {found.value:.0f} vs etcd "
            f"from {EMBEDDED_WORKERS} connections {found.baseline:.0f} cycles/s "
            f"-> {found.ratio:.2f}x (CPU a cycle: "
            f"{found.detail.get(side + '_cpu_ms_per_cycle')} vs "
            f"{found.detail.get('etcd_workers_cpu_ms_per_cycle')} ms)"
        )
        in_process.append(found)
    from_python = compare(
        "embedded_vs_etcd_from_python_workers",
        samples,
        "embedded",
        "etcd_python",
        "cycles/s",
        workers=EMBEDDED_WORKERS,
        server="none (in process); etcd one member",
        **cpu_detail(samples, "embedded", "etcd_python"),
    )
    log(
        f"{from_python.name}: {EMBEDDED_WORKERS} embedded worker processes "
        f"{from_python.value:.0f} vs {EMBEDDED_WORKERS} Python workers on etcd "
        f"{from_python.baseline:.0f} cycles/s -> {from_python.ratio:.2f}x (CPU a "
        f"cycle: {from_python.detail.get('embedded_cpu_ms_per_cycle')} vs "
        f"{from_python.detail.get('etcd_python_cpu_ms_per_cycle')} ms)"
    )
    return [result, heartbeats, *in_process, from_python]


def _bound_sessions(server: Server, token: str) -> list[str]:
    """``SESSIONS`` sessions, each with ``BOUND_LOCKS`` locks bound to
    it; their URLs."""
    paths = []
    with httpx.Client(
        base_url=server.base_url,
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    ) as http:
        for number in range(SESSIONS):
            created = http.post(
                "/api/v1/sessions", json={"owner": f"hb-{number}", "ttl": 600}
            )
            created.raise_for_status()
            session = created.json()["id"]
            for index in range(BOUND_LOCKS):
                granted = http.post(
                    f"{API_PREFIX}bench.hb.{number}.{index}",
                    json={"owner": f"hb-{number}", "session": session},
                )
                granted.raise_for_status()
            paths.append(f"/api/v1/sessions/{session}")
    return paths


def _bound_leases(etcd: Etcd) -> list[str]:
    """``SESSIONS`` leases, each with ``BOUND_LOCKS`` etcd locks on it."""
    leases = []
    for number in range(SESSIONS):
        lease = etcd.grant_lease()
        for index in range(BOUND_LOCKS):
            etcd.lock(f"bench.ka.{number}.{index}", lease)
        leases.append(lease)
    return leases
