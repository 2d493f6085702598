"""One harness run: a private PostgreSQL (or MariaDB) server, 3 app instances (one
clock-skewed), N worker processes, SIGKILL/restart of an instance every few
seconds, database restarts with the API probed during each outage, then the checker.

    python -m tests.faults                                  # bounded mode, as CI
    python -m tests.faults --duration 600 --database-restarts 4 --report r.json
    python -m tests.faults --database mariadb --duration 120
    python -m tests.faults --database patroni                 # failover, as CI
    python -m tests.faults --database patroni --duration 600 --failovers 10

``--database patroni``: three PostgreSQL servers under Patroni and etcd, the app
instances on a libpq multi-host URL; instead of restarts, the primary's PostgreSQL
is SIGKILLed (Patroni promotes the synchronous standby) and planned switchovers
alternate with those failovers, each with an app instance killed at the same time.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
from sqlalchemy import create_engine, select

from app.config import normalize_database_url
from app.locks.models import DistributedLock, LockEvent
from tests.faults.checker import FAILOVER_RECOVERY, Report, check, check_failovers
from tests.faults.cluster import MariaDBServer, PostgresCluster
from tests.faults.instances import AppInstance, base_env, lockkeeper_cli
from tests.faults.patroni import PatroniCluster
from tests.faults.worker import WorkerConfig, worker_main

HOT_RESOURCES = [f"hot:{n}" for n in range(4)]
# The holder workers' resources: a semaphore of 2 places, and one resource read
# (shared grants) and written (exclusive ones).
SEMAPHORES = {"sem:0": 2}
READ_WRITE = ("rw:0",)
CHECKED_RESOURCES = [*HOT_RESOURCES, *SEMAPHORES, *READ_WRITE]


def is_holder_worker(index: int) -> bool:
    """Three workers in eight take the holder resources (waiting ones among
    them: see ``waits``), the others the exclusive hot ones."""
    return index % 8 in (1, 3, 6)


@dataclass
class RunConfig:
    database: str = "postgresql"  # or "mariadb", "patroni"
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
        started, restarts = time.time(), self.config.database_restarts
        outages_due = [
            started + self.config.duration * (k + 0.4) / restarts
            for k in range(restarts)
        ]
        while not self._halt.is_set() and time.time() < self.stop_at - 1:
            if outages_due and time.time() >= outages_due[0]:
                outages_due.pop(0)
                self.restart_database()
                continue
            if self._halt.wait(self.rng.uniform(*self.config.kill_every)):
                return
            victim = self.rng.choice(self.instances)
            victim.kill()
            self.kills += 1
            self._halt.wait(self.rng.uniform(0.2, 1.0))
            victim.start()
            victim.wait_ready()

    def restart_database(self) -> None:
        for instance in self.instances:
            instance.wait_ready()
        restart = {"down_at": time.time()}
        self.outage.setdefault("restarts", []).append(restart)
        self.cluster.stop("immediate")
        down_until = time.monotonic() + self.config.outage
        headers = {"Authorization": f"Bearer {self.token}"}
        with httpx.Client(timeout=5) as http:
            while time.monotonic() < down_until:
                for instance in self.instances:
                    for method, path, body in (
                        ("GET", "/healthz", None),
                        (
                            "POST",
                            f"/api/v1/locks/probe:{instance.name}",
                            {"owner": "p"},
                        ),
                        ("GET", "/api/v1/locks", None),
                    ):
                        response = http.request(
                            method, instance.url + path, json=body, headers=headers
                        )
                        self.outage["probes"].append(
                            {
                                "url": instance.url + path,
                                "method": method,
                                "status": response.status_code,
                                "content_type": response.headers.get("content-type"),
                            }
                        )
                time.sleep(0.2)
            self.cluster.start()
            restart["up_at"] = time.time()
            self.database_restarts += 1
            back = time.monotonic()
            pending = {instance.name: instance for instance in self.instances}
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
        started, count = time.time(), self.config.failovers
        due = [started + self.config.duration * (k + 0.3) / count for k in range(count)]
        while not self._halt.is_set() and time.time() < self.stop_at - 1:
            if due and time.time() >= due[0]:
                due.pop(0)
                kind = "failover" if len(self.failovers) % 2 == 0 else "switchover"
                self.change_primary(kind)
                continue
            if self._halt.wait(self.rng.uniform(*self.config.kill_every)):
                return
            victim = self.rng.choice(self.instances)
            victim.kill()
            self.kills += 1
            self._halt.wait(self.rng.uniform(0.2, 1.0))
            victim.start()
            victim.wait_ready()

    def change_primary(self, kind: str) -> None:
        for instance in self.instances:
            instance.wait_ready()
        self.cluster.wait_healthy()
        victim = self.rng.choice(self.instances)
        entry: dict = {"kind": kind, "victim": victim.name, "probes": []}
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
        self.failovers.append(entry)

    def _switchover(self, entry: dict) -> None:
        try:
            self.cluster.switchover()
        except Exception as exc:  # noqa: BLE001 - the checker reports it
            entry["switchover_error"] = str(exc)

    def _probe(self, http, headers, entry) -> None:
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
    if config.database == "patroni":
        return PatroniCluster(
            synchronous=config.synchronous,
            # Asynchronous: let Patroni promote a standby however far behind,
            # which is what a large maximum_lag_on_failover allows.
            maximum_lag_on_failover=1048576 if config.synchronous else 1 << 30,
        )
    return PostgresCluster()


def run(config: RunConfig, log=print, *, before_kill=None) -> Report:
    workdir = Path(tempfile.mkdtemp(prefix="lk-faults-"))
    cluster = make_cluster(config)
    patroni = config.database == "patroni"
    instances: list[AppInstance] = []
    processes = []
    started = time.monotonic()
    try:
        cluster.start()
        env = base_env(cluster.url, workdir / "cli")
        lockkeeper_cli(env, "db", "upgrade")
        token = lockkeeper_cli(env, "tokens", "create", "faults").strip().splitlines()
        token = token[-1]
        for n in range(config.instances):
            skew = config.skew if n == config.instances - 1 else None
            instances.append(AppInstance(f"app{n}", cluster.url, workdir, skew=skew))
        for instance in instances:
            instance.start()
        for instance in instances:
            instance.wait_ready()
        log(f"setup took {time.monotonic() - started:.1f} s; workdir {workdir}")

        histories = workdir / "histories"
        histories.mkdir()
        start_at = time.time() + 3 + config.workers * 0.25
        deadline = start_at + config.duration
        context = multiprocessing.get_context("spawn")
        for index in range(config.workers):
            holder = is_holder_worker(index)
            worker = WorkerConfig(
                index=index,
                urls=[instance.url for instance in instances],
                token=token,
                resources=[*SEMAPHORES, *READ_WRITE] if holder else HOT_RESOURCES,
                limits=SEMAPHORES if holder else None,
                shared=READ_WRITE if holder else (),
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
        else:
            injector = FaultInjector(config, instances, cluster, token, deadline)
        injector.start()
        for process in processes:
            process.join(timeout=max(deadline - time.time(), 0) + 60)
        injector.halt()
        injector.join(timeout=60)
        if injector.failure is not None:
            raise RuntimeError("the fault injector failed") from injector.failure
        hung = [p.pid for p in processes if p.exitcode is None]
        if hung:
            raise RuntimeError(f"workers {hung} did not finish")

        records = read_histories(histories)
        events = [
            e for e in read_events(cluster.url) if e["resource"] in CHECKED_RESOURCES
        ]
        failovers = injector.failovers if patroni else []
        report = check(
            records,
            events,
            None if patroni else injector.outage,
            failovers=failovers,
            failover_recovery=config.failover_recovery,
            limits=SEMAPHORES,
        )
        if patroni:
            check_failovers(
                records,
                events,
                [
                    r
                    for r in read_final_locks(cluster.url)
                    if r["resource"] in HOT_RESOURCES
                ],
                failovers,
                report,
                max_recovery=config.failover_recovery,
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
                            "promotion_s",
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
        report.stats.update(
            database=config.database,
            duration_s=config.duration,
            workers=config.workers,
            instances=config.instances,
            skew=config.skew,
            instance_kills=injector.kills,
            database_restarts=injector.database_restarts,
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
        for process in processes:
            if process.is_alive():
                process.kill()
            process.join()
        for instance in instances:
            instance.stop()
        cluster.close()
        if not config.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        log(f"run took {time.monotonic() - started:.1f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults", description=__doc__)
    parser.add_argument(
        "--database",
        choices=["postgresql", "mariadb", "patroni"],
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
    parser.add_argument("--keep", action="store_true", help="keep logs, histories")
    parser.add_argument("--report", type=Path, help="write the report as JSON here")
    args = parser.parse_args(argv)
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
