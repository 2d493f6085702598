"""One harness run: a private PostgreSQL (or MariaDB) server, 3 app instances (one
clock-skewed), N worker processes, SIGKILL/restart of an instance every few
seconds, database restarts with the API probed during each outage, then the checker.

    python -m tests.faults                                  # bounded mode, as CI
    python -m tests.faults --duration 600 --database-restarts 4 --report r.json
    python -m tests.faults --database mariadb --duration 120
    python -m tests.faults --database patroni                 # failover, as CI
    python -m tests.faults --database patroni --duration 600 --failovers 10

``--database galera``: three MariaDB Galera nodes, instance n on node n
(``--galera-writers``), or every instance through HAProxy to the first Synced
node (``--galera-proxy``); a node is SIGKILLed (or paused, ``--galera-faults
kill,pause``) and rejoins.

``--database patroni``: three PostgreSQL servers under Patroni and etcd, the app
instances on a libpq multi-host URL; instead of restarts, the primary's PostgreSQL
is SIGKILLed (Patroni promotes the synchronous standby) and planned switchovers
alternate with those failovers, each with an app instance killed at the same time.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
from lockkeeper_core.models import DistributedLock, LockEvent
from sqlalchemy import create_engine, select

from app.config import normalize_database_url
from tests.faults.checker import FAILOVER_RECOVERY, Report, check, check_failovers
from tests.faults.cluster import MariaDBServer, PostgresCluster
from tests.faults.galera import GaleraCluster
from tests.faults.galera_network import in_own_network_namespace
from tests.faults.galera_proxy import GaleraProxy
from tests.faults.instances import AppInstance, base_env, lockkeeper_cli
from tests.faults.patroni import PatroniCluster
from tests.faults.stall import StallCanary
from tests.faults.watcher import AuditWatcher
from tests.faults.worker import WorkerConfig, worker_main
from tests.forks import worker_context

HOT_RESOURCES = [f"hot:{n}" for n in range(4)]
# The holder workers' resources: a semaphore of 2 holders, and one resource read
# (shared grants) and written (exclusive ones).
SEMAPHORES = {"sem:0": 2}
READ_WRITE = ("rw:0",)
# A Galera run's database on the cluster (another may be the tests').
GALERA_DATABASE = "lk_faults"
CHECKED_RESOURCES = [*HOT_RESOURCES, *SEMAPHORES, *READ_WRITE]
# The share of a holder worker's jobs run in a session (its grants bound to it,
# kept by its heartbeat): holders, shared grants and exclusive ones of its own
# resources, and an exclusive grant of a hot resource the other workers take.
SESSION_SHARE = 0.3


def is_holder_worker(index: int) -> bool:
    """Three workers in eight take the holder resources (waiting ones among
    them: see ``waits``; sessions: ``SESSION_SHARE``), the others the exclusive
    hot ones."""
    return index % 8 in (1, 3, 6)


@dataclass
class RunConfig:
    database: str = "postgresql"  # or "mariadb", "patroni", "galera"
    duration: float = 45.0
    workers: int = 24
    instances: int = 3
    skew: str = "+5m"
    kill_every: tuple[float, float] = (2.0, 5.0)
    database_restarts: int = 1  # spread over the run, the first at 40 %
    outage: float = 3.0  # seconds the database stays down
    seed: int = 1
    # patroni: primary changes spread over the run, alternating a killed primary
    # (the first) and a planned switchover.
    failovers: int = 2
    synchronous: bool = True  # off: the misconfiguration the checker must catch
    # patroni: seconds from a promotion until every instance must serve again;
    # a waiter in line across a primary change is held to it, not to its wait.
    failover_recovery: float = FAILOVER_RECOVERY
    keep: bool = False  # keep the work directory (logs, histories)
    # galera: how many nodes take writes, instance n on node n % writers. 1:
    # every instance on node 0 (single writer), and node faults hit the others.
    galera_writers: int = 3
    # galera: the node faults in turn, "kill" (SIGKILL and restart),
    # "pause" (SIGSTOP for ``pause`` seconds, then SIGCONT), "partition"
    # (cut off from the other nodes for ``pause`` seconds, its clients still
    # reaching it: ``galera_network``) and "wipe" (SIGKILL, its data directory
    # emptied, a whole copy from a donor: SST, while the others serve). A
    # kill's outage is probed, and a partition's and a wipe's; a pause's is
    # not (requests to its node wait).
    galera_faults: str = "kill"
    pause: float = 10.0
    # galera: every instance through HAProxy, to the first Synced node
    # (``galera_proxy``); node faults hit the node it sends to, mostly.
    galera_proxy: bool = False
    # galera: two nodes and an arbitrator (garbd) instead of three nodes.
    galera_arbitrator: bool = False


# How long an outage probe waits for its 503. The instance answers at once
# (its database refuses the connection), but its request queue is shared with
# 24 workers retrying on 503, and on a CI machine whose CPUs are ~96 % busy one
# probe waited more than 5 s in that queue (the injector then crashed the run).
# A hang is still caught: a probe with no answer is a violation.
OUTAGE_PROBE_TIMEOUT = 30.0


class FaultInjector(threading.Thread):
    """Kills an instance with SIGKILL and restarts it every few seconds; restarts
    the database once, probing every instance while it is down."""

    def __init__(self, config: RunConfig, instances, cluster, token, stop_at):
        super().__init__(name="faults", daemon=True)
        self.config = config
        self.instances = instances
        self.cluster = cluster
        self.token = token
        self.stop_at = stop_at
        self.rng = random.Random(config.seed)
        self.outage: dict = {"probes": [], "recovery": {}}
        self.kills = 0
        self.database_restarts = 0
        # Seconds each scheduled fault (restart, primary change) began after
        # it was due.
        self.fault_delays: list[float] = []
        self.failure: BaseException | None = None
        self._halt = threading.Event()

    def halt(self) -> None:
        self._halt.set()

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # noqa: BLE001 - reported by the runner
            self.failure = exc

    def _loop(self) -> None:
        restarts = self.config.database_restarts
        self._schedule(
            [(k + 0.4) / restarts for k in range(restarts)], self.restart_database
        )

    def _schedule(self, fractions: list[float], fault) -> None:
        """Run ``fault()`` once at each of ``fractions`` of the run (the first
        due at ``fractions[0] * duration`` from now) and, between them, SIGKILL
        an instance every ``kill_every`` seconds and start it again.

        A fault is not held up by the kills: the wait for the next kill ends
        when a fault is due, and a kill whose instance could not be serving
        again by then (judged by the slowest start seen) is left for after the
        fault, when the fault needs every instance serving (``needs_instances``).
        One that does not (a Galera node kill with no instance on that node)
        does not wait for an instance's start at all. (Kill cycles used to end
        with the wait until the instance served, and the schedule was looked at
        only between them: on a loaded machine, where an instance took 3-10 s
        to serve, a cycle that began before a fault was due carried it past the
        next, and a 20 s Galera run ended with its one restart never made.)
        Each fault's delay is noted in ``fault_delays``."""
        started = time.time()
        due = [started + self.config.duration * fraction for fraction in fractions]
        starting: AppInstance | None = None  # killed last, maybe not serving yet
        while not self._halt.is_set() and time.time() < self.stop_at - 1:
            if due and time.time() >= due[0]:
                self.fault_delays.append(round(time.time() - due.pop(0), 3))
                fault()
                continue
            gap = self.rng.uniform(*self.config.kill_every)
            pause = self.rng.uniform(0.2, 1.0)
            if due and time.time() + gap + self._kill_takes(pause) > due[0]:
                # The fault's turn: the kill is drawn again after it.
                if self._halt.wait(due[0] - time.time()):
                    break
                continue
            if self._halt.wait(gap):
                break
            if starting is not None:  # one instance down at a time
                starting.wait_ready()
            victim = self.rng.choice(self.instances)
            victim.kill()
            self.kills += 1
            self._halt.wait(pause)
            victim.start()
            starting = victim
        if starting is not None:  # an instance that cannot start is a failure
            starting.wait_ready()

    # Whether a scheduled fault needs every instance serving when it begins
    # (it probes them, or kills one).
    needs_instances = True

    def _kill_takes(self, pause: float) -> float:
        """Seconds from a kill until its instance serves again, as far as a
        fault due after it is concerned."""
        if not self.needs_instances:
            return pause
        return pause + max(instance.slowest_start for instance in self.instances)

    def take_database_down(self, restart: dict) -> list[AppInstance]:
        """Stop the database; the instances that lose it."""
        self.cluster.stop("immediate")
        return self.instances

    def bring_database_up(self, restart: dict) -> None:
        self.cluster.start()

    def restart_database(self) -> None:
        if self.needs_instances:
            for instance in self.instances:
                instance.wait_ready()
        restart = {"down_at": time.time()}
        self.outage.setdefault("restarts", []).append(restart)
        affected = self.take_database_down(restart)
        down_until = time.monotonic() + self.config.outage
        headers = {"Authorization": f"Bearer {self.token}"}
        with httpx.Client(timeout=5) as http:
            while time.monotonic() < down_until:
                for instance in affected:
                    for method, path, body in (
                        ("GET", "/healthz", None),
                        (
                            "POST",
                            f"/api/v1/locks/probe:{instance.name}",
                            {"owner": "p"},
                        ),
                        ("GET", "/api/v1/locks", None),
                    ):
                        probe = {"url": instance.url + path, "method": method}
                        try:
                            response = http.request(
                                method,
                                instance.url + path,
                                json=body,
                                headers=headers,
                                timeout=OUTAGE_PROBE_TIMEOUT,
                            )
                        except httpx.TimeoutException:
                            # No answer at all: the checker's violation (a 503
                            # is due), not the injector's crash.
                            probe.update(status=None, content_type=None)
                            probe["error"] = f"no answer in {OUTAGE_PROBE_TIMEOUT} s"
                        else:
                            probe.update(
                                status=response.status_code,
                                content_type=response.headers.get("content-type"),
                            )
                        self.outage["probes"].append(probe)
                time.sleep(0.2)
            self.bring_database_up(restart)
            restart["up_at"] = time.time()
            self.database_restarts += 1
            back = time.monotonic()
            pending = {instance.name: instance for instance in affected}
            while pending and time.monotonic() - back < 30:
                for name, instance in list(pending.items()):
                    if self._serves(http, instance, headers):
                        self.outage["recovery"][f"{name}#{self.database_restarts}"] = (
                            round(time.monotonic() - back, 3)
                        )
                        del pending[name]
                time.sleep(0.05)
            for name in pending:
                self.outage["recovery"][f"{name}#{self.database_restarts}"] = None

    def _probe(self, http, headers, entry) -> None:
        """Ask every instance once, noting each answer in ``entry["probes"]``
        (a primary change's: ``checker.check_failovers`` judges them)."""
        for instance in self.instances:
            for method, path, body in (
                ("GET", "/healthz", None),
                (
                    "POST",
                    f"/api/v1/locks/probe:{instance.name}",
                    {"owner": "p", "ttl": 0.1},
                ),
                ("GET", "/api/v1/locks", None),
            ):
                try:
                    response = http.request(
                        method, instance.url + path, json=body, headers=headers
                    )
                except httpx.TransportError:
                    status, content_type = None, None  # killed, or restarting
                else:
                    status = response.status_code
                    content_type = response.headers.get("content-type")
                entry["probes"].append(
                    {
                        "url": instance.url + path,
                        "method": method,
                        "status": status,
                        "content_type": content_type,
                        "t": time.time(),
                    }
                )

    @staticmethod
    def _serves(http, instance, headers) -> bool:
        try:
            health = http.get(instance.url + "/healthz")
            acquire = http.post(
                instance.url + f"/api/v1/locks/probe:{instance.name}",
                json={"owner": "recovery-probe", "ttl": 0.1},
                headers=headers,
            )
        except httpx.TransportError:
            return False
        return health.status_code == 200 and acquire.status_code in (200, 409)


class GaleraInjector(FaultInjector):
    """For a Galera cluster, with instance n on node n: a "database restart" is
    a SIGKILL of one node (its instance's database goes; the others serve on),
    with several writing nodes also of an instance on another node, started
    again at once. The node rejoins once it has been down ``config.outage``
    seconds, receiving what it missed from a donor's cache (IST) or, failing
    that, a full state transfer (SST): which one is noted."""

    def __init__(self, config, instances, cluster, token, stop_at):
        super().__init__(config, instances, cluster, token, stop_at)
        # Transactions the killed nodes had aborted for another node's write
        # (their counters start again at 0 when they restart).
        self.aborts: Counter[str] = Counter()

    @property
    def needs_instances(self) -> bool:
        # A single writer's node is never killed: no instance loses its
        # database, none is probed.
        return self.config.galera_writers > 1

    def _fault(self, node, restart: dict) -> None:
        """The next of ``config.galera_faults`` in turn, on ``node``."""
        kinds = self.config.galera_faults.split(",")
        restart["node"] = node.name
        restart["fault"] = kinds[self.database_restarts % len(kinds)]
        if restart["fault"] == "pause":
            self.cluster.pause(node)
        elif restart["fault"] == "partition":
            self.cluster.partition(node)
        else:
            self.aborts.update(node.aborts())
            self.cluster.kill(node)
            if restart["fault"] == "wipe":
                self.cluster.wipe(node)

    def take_database_down(self, restart: dict) -> list[AppInstance]:
        nodes = self.cluster.nodes
        writers = min(self.config.galera_writers, len(nodes))
        # A single writer's node stays up (no proxy fails it over here).
        index = self.rng.randrange(0 if writers > 1 else 1, len(nodes))
        self._fault(nodes[index], restart)
        affected = [i for n, i in enumerate(self.instances) if n % writers == index]
        if restart["fault"] == "pause":
            # Its instance's requests wait on the stopped node (a pause is
            # shorter than the service's read timeout, 60 s): not probed for
            # a 503, timed once it is back instead.
            restart["paused_instances"] = [i.name for i in affected]
            affected = []
        if writers > 1:
            # An instance on another node crashes with it, as one does with a
            # Patroni primary: a short run's one node fault, whose rejoin
            # takes the rest of the run, left no time for a kill of its own
            # (a 20 s multi-writer run killed no instance).
            victim = self.rng.choice([i for i in self.instances if i not in affected])
            victim.kill()
            self.kills += 1
            self._halt.wait(self.rng.uniform(0.2, 1.0))
            victim.start()
            restart["instance_killed"] = victim.name
        return affected

    def bring_database_up(self, restart: dict) -> None:
        node = next(n for n in self.cluster.nodes if n.name == restart["node"])
        if restart["fault"] in ("pause", "partition"):
            self._halt.wait(restart["down_at"] + self.config.pause - time.time())
            started = time.monotonic()
            if restart["fault"] == "pause":
                self.cluster.resume(node)
            else:
                self.cluster.heal(node)
        elif restart["fault"] == "wipe":
            started = time.monotonic()
            self.cluster.rebuild(node)
        else:
            started = time.monotonic()
            self.cluster.restart_node(node)
        restart["rejoin_s"] = round(time.monotonic() - started, 3)
        restart["transfer"] = self.cluster.last_transfer(node)
        headers = {"Authorization": f"Bearer {self.token}"}
        with httpx.Client(timeout=30) as http:
            for instance in self.instances:
                if instance.name in restart.get("paused_instances", ()):
                    while not self._serves(http, instance, headers):
                        if time.monotonic() - started > 120:
                            raise RuntimeError(f"{instance.name} never served again")
                        time.sleep(0.05)
                    restart["instance_back_s"] = round(time.monotonic() - started, 3)
        if "instance_killed" in restart:  # one that cannot start is a failure
            next(
                i for i in self.instances if i.name == restart["instance_killed"]
            ).wait_ready()


class GaleraProxyInjector(GaleraInjector):
    """Every instance through HAProxy (``galera_proxy.GaleraProxy``), which
    sends every connection to galera0 while its check finds it Synced, else to
    the next node that is. Two node faults in three hit the node HAProxy sends
    to: the instances are probed until HAProxy sends to another node (a
    failover), and each one's recovery is timed from then; once the node is
    Synced again HAProxy sends to galera0 again (a failback), timed alike. The
    third hits another node: commits wait until the cluster has evicted it."""

    needs_instances = True

    def __init__(self, config, instances, cluster, token, stop_at, proxy):
        super().__init__(config, instances, cluster, token, stop_at)
        self.proxy = proxy
        # Changes of the node HAProxy sends to (``checker.check_failovers``),
        # and when the faults of other nodes could hold a commit.
        self.failovers: list[dict] = []
        self.held: list[dict] = []

    def take_database_down(self, restart: dict) -> list[AppInstance]:
        nodes = self.cluster.nodes
        serving = self.proxy.serving()
        if serving is not None and self.database_restarts % 3 != 2:
            node = next(node for node in nodes if node.name == serving)
        else:
            node = self.rng.choice([node for node in nodes if node.name != serving])
        self._fault(node, restart)
        # An instance crashes with it, as one does with a Patroni primary (a
        # short run's node faults leave no time for kills between them).
        victim = self.rng.choice(self.instances)
        victim.kill()
        self.kills += 1
        self._halt.wait(self.rng.uniform(0.2, 1.0))
        victim.start()
        restart["instance_killed"] = victim.name
        if node.name == serving:
            entry = self._switch(
                f"failover ({restart['fault']})", serving, restart["down_at"]
            )
            entry["switch_s"] = round(entry["promoted_at"] - entry["killed_at"], 3)
            self.failovers.append(entry)
        # Every instance loses its connections, and the switch above timed
        # their return: none is probed for the outage's 503s.
        return []

    def bring_database_up(self, restart: dict) -> None:
        super().bring_database_up(restart)
        preferred = self.cluster.nodes[0].name
        if restart["node"] != preferred:
            self.held.append(
                {"killed_at": restart["down_at"], "promoted_at": time.time()}
            )
            return
        away = self.failovers[-1] if self.failovers else None
        if away is not None and away["killed_at"] == restart["down_at"]:
            # HAProxy sends to galera0 again once its check passes twice,
            # which may be before the harness saw it Synced.
            entry = self._switch(
                "failback", away["new"], away["promoted_at"], to=preferred
            )
            self.failovers.append(entry)

    def _switch(self, kind: str, old: str | None, since: float, *, to=None) -> dict:
        """Wait until HAProxy has sent to another node than ``old`` (to
        ``to``, if given) since ``since``, probing the instances meanwhile;
        then time each one's recovery from that change. The window of held
        commits (``killed_at``) starts at ``since`` for a failover and at
        the change for a failback (galera0 is up and Synced before)."""
        entry: dict = {"kind": kind, "old": old, "killed_at": since, "probes": []}
        headers = {"Authorization": f"Bearer {self.token}"}
        deadline = time.monotonic() + 60
        with httpx.Client(timeout=5) as http:
            while (switched := self.proxy.switch(since, away_from=old, to=to)) is None:
                if time.monotonic() > deadline:
                    break
                self._probe(http, headers, entry)
                time.sleep(0.1)
            # No switch within the wait: the checker reports it.
            entry["new"], entry["promoted_at"] = switched or (None, time.time())
            if kind == "failback":
                entry["killed_at"] = entry["promoted_at"]
            entry["recovery"] = {}
            pending = {instance.name: instance for instance in self.instances}
            while pending and time.time() - entry["promoted_at"] < 60:
                for name, instance in list(pending.items()):
                    if self._serves(http, instance, headers):
                        entry["recovery"][name] = round(
                            time.time() - entry["promoted_at"], 3
                        )
                        del pending[name]
                time.sleep(0.05)
            for name in pending:
                entry["recovery"][name] = None
        return entry


class FailoverInjector(FaultInjector):
    """For a Patroni cluster: the primary changes ``config.failovers`` times, a
    SIGKILL of its PostgreSQL and a switchover in turn, with an app instance
    SIGKILLed at the same moment; the instances are probed until a new primary is
    writable, and each instance's recovery is timed from that promotion. Between
    primary changes, instances are killed and restarted as in the plain mode."""

    def __init__(self, config, instances, cluster, token, stop_at, *, before_kill=None):
        super().__init__(config, instances, cluster, token, stop_at)
        self.failovers: list[dict] = []
        # A hook run just before a primary is killed; what it returns (if not
        # None) is called right after (the misconfiguration test stalls
        # replication there).
        self.before_kill = before_kill

    def _loop(self) -> None:
        count = self.config.failovers
        self._schedule([(k + 0.3) / count for k in range(count)], self._next_change)

    def _next_change(self) -> None:
        self.change_primary(
            "failover" if len(self.failovers) % 2 == 0 else "switchover"
        )

    def change_primary(self, kind: str) -> None:
        began = time.monotonic()
        for instance in self.instances:
            instance.wait_ready()
        self.cluster.wait_healthy()
        victim = self.rng.choice(self.instances)
        entry: dict = {"kind": kind, "victim": victim.name, "probes": []}
        entry["healthy_s"] = round(time.monotonic() - began, 3)
        after_kill = None
        if kind == "failover" and self.before_kill is not None:
            after_kill = self.before_kill(self.cluster)
        victim.kill()
        self.kills += 1
        entry["killed_at"] = time.time()
        killed = time.monotonic()
        if kind == "failover":
            old = self.cluster.kill_primary_postgres()
            if after_kill is not None:
                after_kill()
            switch = None
        else:
            old = self.cluster.leader()
            switch = threading.Thread(target=self._switchover, args=(entry,))
            switch.start()
        entry["old"] = old.name if old else None
        found: dict = {}
        waiter = threading.Thread(
            target=lambda: found.update(
                zip(
                    ("new", "at"),
                    self.cluster.wait_for_leader(other_than=old),
                    strict=True,
                )
            ),
            daemon=True,
        )
        waiter.start()
        headers = {"Authorization": f"Bearer {self.token}"}
        with httpx.Client(timeout=5) as http:
            while waiter.is_alive():
                self._probe(http, headers, entry)
                time.sleep(0.1)
            if switch is not None:
                switch.join(timeout=60)
            # No promotion within the wait: the checker reports it.
            new, promoted = found.get("new"), found.get("at", time.monotonic())
            entry["new"] = new.name if new else None
            entry["promoted_at"] = time.time() - (time.monotonic() - promoted)
            entry["promotion_s"] = round(promoted - killed, 3)
            victim.start()
            entry["recovery"] = {}
            pending = {instance.name: instance for instance in self.instances}
            while pending and time.monotonic() - promoted < 60:
                for name, instance in list(pending.items()):
                    if self._serves(http, instance, headers):
                        entry["recovery"][name] = round(time.monotonic() - promoted, 3)
                        del pending[name]
                time.sleep(0.05)
            for name in pending:
                entry["recovery"][name] = None
        entry["took_s"] = round(time.monotonic() - began, 3)
        self.failovers.append(entry)

    def _switchover(self, entry: dict) -> None:
        try:
            self.cluster.switchover()
        except Exception as exc:  # noqa: BLE001 - the checker reports it
            entry["switchover_error"] = str(exc)


def read_final_locks(database_url: str) -> list[dict]:
    engine = create_engine(normalize_database_url(database_url))
    try:
        with engine.connect() as conn:
            rows = conn.execute(select(DistributedLock.__table__)).all()
    finally:
        engine.dispose()
    return [dict(row._mapping) for row in rows]


def read_events(database_url: str) -> list[dict]:
    engine = create_engine(normalize_database_url(database_url))
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                select(LockEvent.__table__).order_by(LockEvent.id)
            ).all()
    finally:
        engine.dispose()
    return [dict(row._mapping) for row in rows]


def read_histories(directory: Path) -> list[dict]:
    records = []
    for path in sorted(directory.glob("worker-*.jsonl")):
        with open(path, encoding="utf-8") as handle:
            records.extend(json.loads(line) for line in handle if line.strip())
    return records


def make_cluster(config: RunConfig):
    if config.database == "mariadb":
        return MariaDBServer()
    if config.database == "galera":
        return GaleraCluster(
            nodes=2 if config.galera_arbitrator else 3,
            isolated="partition" in config.galera_faults,
            arbitrator=config.galera_arbitrator,
        )
    if config.database == "patroni":
        return PatroniCluster(
            synchronous=config.synchronous,
            # Asynchronous: let Patroni promote a standby however far behind,
            # which is what a large maximum_lag_on_failover allows.
            maximum_lag_on_failover=1048576 if config.synchronous else 1 << 30,
        )
    return PostgresCluster()


def run(config: RunConfig, log=print, *, before_kill=None, galera=None) -> Report:
    """``galera``: a started ``GaleraCluster`` to run on (in a database of its
    own, ``lk_faults``), left running; else a Galera run starts its own."""
    workdir = Path(tempfile.mkdtemp(prefix="lk-faults-"))
    given = galera is not None
    cluster = galera if given else make_cluster(config)
    patroni = config.database == "patroni"
    on_galera = config.database == "galera"
    instances: list[AppInstance] = []
    processes = []
    proxy: GaleraProxy | None = None
    watcher: AuditWatcher | None = None
    # The machine's own scheduling delay while the workers run, credited to the
    # liveness bounds by the checker (see ``stall``).
    canary = StallCanary(workdir / "stalls.txt")
    started = time.monotonic()
    try:
        if on_galera:
            if not given:
                cluster.start()
            with cluster.nodes[0].connect(database=None) as conn, conn.cursor() as cur:
                cur.execute(
                    f"CREATE DATABASE {GALERA_DATABASE}"
                    " CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
                )
            urls = [
                cluster.url(
                    n % min(config.galera_writers, len(cluster.nodes)),
                    database=GALERA_DATABASE,
                )
                for n in range(config.instances)
            ]
            if config.galera_proxy:
                (workdir / "haproxy").mkdir()
                proxy = GaleraProxy(cluster, workdir / "haproxy")
                proxy.start()
                urls = [proxy.url(GALERA_DATABASE)] * config.instances
        else:
            cluster.start()
            urls = [cluster.url] * config.instances
        database_url = urls[0]
        env = base_env(database_url, workdir / "cli")
        lockkeeper_cli(env, "db", "upgrade")
        token = lockkeeper_cli(env, "tokens", "create", "faults").strip().splitlines()
        token = token[-1]
        for n in range(config.instances):
            skew = config.skew if n == config.instances - 1 else None
            # A thread for every worker: when the others are down, one instance
            # serves them all, and a waiter queued in front of the server for a
            # free thread would be charged with the time it was never in line.
            instances.append(
                AppInstance(
                    f"app{n}", urls[n], workdir, skew=skew, threads=config.workers
                )
            )
        for instance in instances:
            instance.start()
        for instance in instances:
            instance.wait_ready()
        log(f"setup took {time.monotonic() - started:.1f} s; workdir {workdir}")
        # Across failovers: a default watch() of the whole log, on an instance
        # that is killed and restarted like the others.
        if patroni:
            watcher = AuditWatcher(instances[0].url, token)
            watcher.start()

        histories = workdir / "histories"
        histories.mkdir()
        canary.start()
        # Forked from a server with the worker's code imported: they start in
        # milliseconds, not a third of a second of CPU each.
        context = worker_context()
        start_at = time.time() + 3 + config.workers * 0.1
        deadline = start_at + config.duration
        for index in range(config.workers):
            holder = is_holder_worker(index)
            worker = WorkerConfig(
                index=index,
                urls=[instance.url for instance in instances],
                token=token,
                resources=[*SEMAPHORES, *READ_WRITE] if holder else HOT_RESOURCES,
                limits=SEMAPHORES if holder else None,
                shared=READ_WRITE if holder else (),
                session_share=SESSION_SHARE if holder else 0.0,
                session_resources=(
                    (HOT_RESOURCES[index % len(HOT_RESOURCES)],) if holder else ()
                ),
                start_at=start_at,
                deadline=deadline,
                history=str(histories / f"worker-{index:02d}.jsonl"),
                seed=config.seed * 1000 + index,
                waits=index % 3 == 0,
            )
            process = context.Process(target=worker_main, args=(worker,))
            process.start()
            processes.append(process)
        time.sleep(max(0.0, start_at - time.time()))
        if patroni:
            injector = FailoverInjector(
                config, instances, cluster, token, deadline, before_kill=before_kill
            )
        elif proxy is not None:
            injector = GaleraProxyInjector(
                config, instances, cluster, token, deadline, proxy
            )
        elif on_galera:
            injector = GaleraInjector(config, instances, cluster, token, deadline)
        else:
            injector = FaultInjector(config, instances, cluster, token, deadline)
        if on_galera:
            # Counted from here: the cluster may have served other tests.
            for node in cluster.nodes:
                injector.aborts.subtract(node.aborts())
        injector.start()
        for process in processes:
            process.join(timeout=max(deadline - time.time(), 0) + 60)
        injector.halt()
        # A fault under way runs to its end: a Galera node's rejoin waits up to
        # 120 s for it to be Synced (and says why not), and 30 s for the
        # instances to serve after it.
        injector.join(timeout=180)
        stalls = canary.stop()
        if injector.failure is not None:
            raise RuntimeError("the fault injector failed") from injector.failure
        if injector.is_alive():
            raise RuntimeError("the fault injector did not end within 180 s")
        hung = [p.pid for p in processes if p.exitcode is None]
        if hung:
            raise RuntimeError(f"workers {hung} did not finish")

        records = read_histories(histories)
        every_event = read_events(database_url)
        events = [e for e in every_event if e["resource"] in CHECKED_RESOURCES]
        if config.keep:  # the audit log beside the histories: the database goes
            with open(workdir / "events.jsonl", "w", encoding="utf-8") as out:
                out.writelines(json.dumps(e, default=str) + "\n" for e in events)
        failovers = injector.failovers if patroni else []
        outage = None if patroni else injector.outage
        recovery = config.failover_recovery
        if proxy is not None:
            # Windows of held commits: the switches of the node HAProxy sends
            # to, and the faults of the others, each until the bound after it.
            failovers = injector.failovers + injector.held
            outage, recovery = None, config.failover_recovery
        elif on_galera and config.galera_writers == 1:
            # No instance loses its node: nothing to probe, but a node's crash
            # holds every commit until the others evict it.
            failovers = [
                {"killed_at": r["down_at"], "promoted_at": r["up_at"]}
                for r in injector.outage.get("restarts", [])
                if "up_at" in r
            ]
            outage, recovery = None, 5.0
        report = check(
            records,
            events,
            outage,
            failovers=failovers,
            failover_recovery=recovery,
            limits=SEMAPHORES,
            stalls=stalls,
        )
        if watcher is not None:
            ids = [e["id"] for e in every_event]
            watcher.finish(ids[-1] if ids else 0, report)
            watcher.check(ids, report)
        if patroni:
            check_failovers(
                records,
                events,
                [
                    r
                    for r in read_final_locks(database_url)
                    if r["resource"] in HOT_RESOURCES
                ],
                failovers,
                report,
                max_recovery=config.failover_recovery,
                stalls=stalls,
            )
            report.stats.update(
                failovers=sum(1 for f in failovers if f["kind"] == "failover"),
                switchovers=sum(1 for f in failovers if f["kind"] == "switchover"),
                primary_changes=[
                    {
                        key: f.get(key)
                        for key in (
                            "kind",
                            "old",
                            "new",
                            "victim",
                            "healthy_s",
                            "promotion_s",
                            "took_s",
                            "recovery",
                        )
                    }
                    for f in failovers
                ],
                failover_probes=sum(len(f["probes"]) for f in failovers),
                failover_503s=sum(
                    1 for f in failovers for p in f["probes"] if p["status"] == 503
                ),
                worst_promotion_s=max(
                    (f["promotion_s"] for f in failovers), default=None
                ),
                worst_recovery_from_promotion_s=max(
                    (
                        s
                        for f in failovers
                        for s in f["recovery"].values()
                        if s is not None
                    ),
                    default=None,
                ),
            )
            for failover in failovers:
                if "switchover_error" in failover:
                    report.violation(
                        f"switchover failed: {failover['switchover_error']}"
                    )
        if proxy is not None:
            check_failovers(
                records,
                events,
                [
                    r
                    for r in read_final_locks(database_url)
                    if r["resource"] in HOT_RESOURCES
                ],
                injector.failovers,
                report,
                max_recovery=config.failover_recovery,
                stalls=stalls,
            )
            switches = injector.failovers
            report.stats.update(
                switches=[
                    {
                        k: s.get(k)
                        for k in ("kind", "old", "new", "switch_s", "recovery")
                    }
                    for s in switches
                ],
                switch_probes=sum(len(s["probes"]) for s in switches),
                switch_503s=sum(
                    1 for s in switches for p in s["probes"] if p["status"] == 503
                ),
                # Every change of the node HAProxy sent to, flaps included.
                proxy_changes=len(proxy.changes) - 1,
                worst_switch_s=max(
                    (s["switch_s"] for s in switches if "switch_s" in s), default=None
                ),
                worst_recovery_from_switch_s=max(
                    (
                        v
                        for s in switches
                        for v in s["recovery"].values()
                        if v is not None
                    ),
                    default=None,
                ),
            )
        if on_galera:
            aborts = Counter(injector.aborts)
            for node in cluster.nodes:
                aborts.update(node.aborts())
            restarts = injector.outage.get("restarts", [])
            report.stats.update(
                aborts=dict(aborts),
                node_kills=[
                    {
                        k: r.get(k)
                        for k in (
                            "node",
                            "fault",
                            "rejoin_s",
                            "transfer",
                            "instance_back_s",
                        )
                        if k in r
                    }
                    for r in restarts
                ],
                worst_rejoin_s=max(
                    (r.get("rejoin_s", 0) for r in restarts), default=None
                ),
            )
        report.stats.update(
            database=config.database,
            duration_s=config.duration,
            workers=config.workers,
            instances=config.instances,
            skew=config.skew,
            instance_kills=injector.kills,
            database_restarts=injector.database_restarts,
            fault_delays_s=injector.fault_delays,
            outage_probes=len(injector.outage["probes"]),
            recovery_s=injector.outage["recovery"],
            crashed_workers=sum(1 for p in processes if p.exitcode != 0),
            violations=len(report.violations),
        )
        if patroni and len(injector.failovers) != config.failovers:
            report.violation(
                f"the primary changed {len(injector.failovers)} times, "
                f"not {config.failovers}"
            )
        if not patroni and injector.database_restarts != config.database_restarts:
            report.violation(
                f"the database was restarted {injector.database_restarts} times, "
                f"not {config.database_restarts}"
            )
        if injector.kills == 0:
            report.violation("no instance was ever killed")
        if report.stats["crashed_workers"]:
            report.violation(f"{report.stats['crashed_workers']} workers crashed")
        return report
    finally:
        canary.stop()
        if watcher is not None:
            watcher.close()
        if proxy is not None:
            proxy.close()
        for process in processes:
            if process.is_alive():
                process.kill()
            process.join()
        for instance in instances:
            instance.stop()
        if not given:
            cluster.close()
        elif on_galera:
            with cluster.nodes[0].connect(database=None) as conn, conn.cursor() as cur:
                cur.execute(f"DROP DATABASE IF EXISTS {GALERA_DATABASE}")
        if not config.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        log(f"run took {time.monotonic() - started:.1f} s")


GALERA_FAULTS = ("kill", "pause", "partition", "wipe")


def galera_faults(raw: str) -> str:
    kinds = raw.split(",")
    if not kinds or kinds[0] != "kill" or not set(kinds) <= set(GALERA_FAULTS):
        raise argparse.ArgumentTypeError(
            f"kill, then any of {', '.join(GALERA_FAULTS[1:])}, comma-separated"
        )
    return raw


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults", description=__doc__)
    parser.add_argument(
        "--database",
        choices=["postgresql", "mariadb", "patroni", "galera"],
        default=RunConfig.database,
    )
    parser.add_argument(
        "--failovers",
        type=int,
        default=RunConfig.failovers,
        help="patroni: primary changes (killed primary and switchover in turn)",
    )
    parser.add_argument(
        "--asynchronous",
        action="store_true",
        help="patroni: asynchronous replication (unsafe; for showing the checker)",
    )
    parser.add_argument("--duration", type=float, default=RunConfig.duration)
    parser.add_argument("--workers", type=int, default=RunConfig.workers)
    parser.add_argument("--skew", default=RunConfig.skew, help="FAKETIME offset")
    parser.add_argument("--seed", type=int, default=RunConfig.seed)
    parser.add_argument(
        "--database-restarts", type=int, default=RunConfig.database_restarts
    )
    parser.add_argument(
        "--galera-writers",
        type=int,
        default=RunConfig.galera_writers,
        help="galera: nodes that take writes (1: every instance on node 0)",
    )
    parser.add_argument(
        "--galera-faults",
        type=galera_faults,
        default=RunConfig.galera_faults,
        help="galera: the node faults in turn, comma-separated: kill, pause,"
        " partition (the harness then runs in a network namespace of its own),"
        " wipe (SST); kill first",
    )
    parser.add_argument(
        "--galera-proxy",
        action="store_true",
        help="galera: every instance through HAProxy to the first Synced node",
    )
    parser.add_argument(
        "--galera-arbitrator",
        action="store_true",
        help="galera: two nodes and an arbitrator (garbd) instead of three nodes",
    )
    parser.add_argument("--keep", action="store_true", help="keep logs, histories")
    parser.add_argument("--report", type=Path, help="write the report as JSON here")
    args = parser.parse_args(argv)
    if "partition" in args.galera_faults and not in_own_network_namespace():
        # Each node gets a namespace, joined by a bridge in the harness's:
        # that one must not be the machine's (galera_network).
        given = sys.argv[1:] if argv is None else argv
        command = [sys.executable, "-m", "tests.faults", *given]
        os.execvp("unshare", ["unshare", "--net", "--", *command])
    config = RunConfig(
        database=args.database,
        duration=args.duration,
        workers=args.workers,
        skew=args.skew,
        seed=args.seed,
        database_restarts=args.database_restarts,
        failovers=args.failovers,
        synchronous=not args.asynchronous,
        keep=args.keep,
        galera_writers=args.galera_writers,
        galera_faults=args.galera_faults,
        galera_proxy=args.galera_proxy,
        galera_arbitrator=args.galera_arbitrator,
    )
    report = run(config)
    result = {
        "config": asdict(config),
        "stats": report.stats,
        "violations": report.violations,
    }
    text = json.dumps(result, indent=2, default=str)
    print(text)
    if args.report:
        args.report.write_text(text + "\n")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
