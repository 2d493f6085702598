"""One harness run: a private PostgreSQL (or MariaDB) server, 3 app instances (one
clock-skewed), N worker processes, SIGKILL/restart of an instance every few
seconds, database restarts with the API probed during each outage, then the checker.

    python -m tests.faults                                  # bounded mode, as CI
    python -m tests.faults --duration 600 --database-restarts 4 --report r.json
    python -m tests.faults --database mariadb --duration 120
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
from app.locks.models import LockEvent
from tests.faults.checker import Report, check
from tests.faults.cluster import MariaDBServer, PostgresCluster
from tests.faults.instances import AppInstance, base_env, lockkeeper_cli
from tests.faults.worker import WorkerConfig, worker_main

HOT_RESOURCES = [f"hot:{n}" for n in range(4)]


@dataclass
class RunConfig:
    database: str = "postgresql"  # or "mariadb"
    duration: float = 45.0
    workers: int = 24
    instances: int = 3
    skew: str = "+5m"
    kill_every: tuple[float, float] = (2.0, 5.0)
    database_restarts: int = 1  # spread over the run, the first at 40 %
    outage: float = 3.0  # seconds the database stays down
    seed: int = 1
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


def run(config: RunConfig, log=print) -> Report:
    workdir = Path(tempfile.mkdtemp(prefix="lk-faults-"))
    cluster = MariaDBServer() if config.database == "mariadb" else PostgresCluster()
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
            worker = WorkerConfig(
                index=index,
                urls=[instance.url for instance in instances],
                token=token,
                resources=HOT_RESOURCES,
                start_at=start_at,
                deadline=deadline,
                history=str(histories / f"worker-{index:02d}.jsonl"),
                seed=config.seed * 1000 + index,
            )
            process = context.Process(target=worker_main, args=(worker,))
            process.start()
            processes.append(process)
        time.sleep(max(0.0, start_at - time.time()))
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
        events = [e for e in read_events(cluster.url) if e["resource"] in HOT_RESOURCES]
        report = check(records, events, injector.outage)
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
        if injector.database_restarts != config.database_restarts:
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
        "--database", choices=["postgresql", "mariadb"], default=RunConfig.database
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
