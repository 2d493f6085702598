"""The fenced-write workload: Jepsen's lock-set in database form.

Worker processes take locks on a few resources (short ttls) and, while they hold
one, append rows to a table of the lock database, each in a transaction of its
own that calls ``guard`` first. A nemesis stops a random worker with SIGSTOP for
1.5–3 ttls and resumes it, so paused holders wake up inside and outside their
guarded transactions after someone else took the lock over.

The checker reads what committed (the table) and the audit log, and proves that
every committed write was made by the valid holder at its commit: its fence's
tenure (from its grant to the event that ended it, by the database's clock)
contains the write's clock reading, taken by the transaction's last statement
before COMMIT, after its guard and its work; and per resource the writes, in
time order, carry fences that never decrease. ``--unguarded`` writes after a
plain read of the fence instead (the check-then-write a store without the guard
would do): the checker must then find the writes that paused holders committed
after a take-over.

The one window the checker cannot see is between that last statement and the
COMMIT; a take-over there would have to get past the guard's row lock, which
tests/test_guard_races.py shows it waits for.

    python -m tests.faults.fenced --database postgresql --duration 60
    python -m tests.faults.fenced --database mariadb --duration 60 --unguarded
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from app.config import normalize_database_url

# Events that start a grant's tenure; a re-acquire or renew keeps the fence.
GRANTS = {"acquired", "took_over", "claimed", "force_claimed"}
ENDS = {"released", "force_released"}


@dataclass
class FencedConfig:
    database_url: str
    duration: float = 6.0
    workers: int = 6
    resources: int = 2
    ttl: float = 0.3
    guarded: bool = True
    seed: int = 1


@dataclass
class FencedReport:
    stats: dict[str, Any]
    violations: list[str] = field(default_factory=list)


# -- the database ---------------------------------------------------------------------


def _kind(url: str) -> str:
    return (
        "postgresql" if make_url(url).get_backend_name() == "postgresql" else "mariadb"
    )


def _now_sql(kind: str) -> str:
    return "clock_timestamp()" if kind == "postgresql" else "UTC_TIMESTAMP(6)"


def prepare(url: str) -> None:
    """A fresh ``fenced_writes`` table."""
    kind = _kind(url)
    when = "timestamptz" if kind == "postgresql" else "DATETIME(6)"
    engine = create_engine(normalize_database_url(url))
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("DROP TABLE IF EXISTS fenced_writes")
            conn.exec_driver_sql(
                "CREATE TABLE fenced_writes (resource VARCHAR(64), fence BIGINT,"
                f" owner VARCHAR(64), written_at {when})"
            )
    finally:
        engine.dispose()


def _connect(url: str):
    parsed = make_url(url)
    if _kind(url) == "postgresql":
        import psycopg

        return psycopg.connect(
            host=parsed.host,
            port=parsed.port,
            user=parsed.username,
            password=parsed.password,
            dbname=parsed.database,
        )
    import pymysql

    return pymysql.connect(
        host=parsed.host,
        port=parsed.port or 3306,
        user=parsed.username,
        password=parsed.password or "",
        database=parsed.database,
    )


# -- a worker -------------------------------------------------------------------------


def worker_main(config: FencedConfig, index: int, ready, start, out: str) -> None:
    from app import create_app
    from app.locks.service import lock_service

    app = create_app(
        {
            "LOCKKEEPER_DATABASE_URL": config.database_url,
            "LOCKKEEPER_INSTANCE_PATH": tempfile.mkdtemp(prefix="fenced-"),
            "LOCKKEEPER_BOOTSTRAP": False,
            "LOCKKEEPER_AUTO_MIGRATE": False,
            "SECRET_KEY": "fenced",
        }
    )
    kind = _kind(config.database_url)
    conn = _connect(config.database_url)
    insert = (
        "INSERT INTO fenced_writes (resource, fence, owner, written_at)"
        f" VALUES (%s, %s, %s, {_now_sql(kind)})"
    )
    plain_check = (
        "SELECT fence FROM distributed_locks WHERE resource = %s"
        f" AND owner IS NOT NULL AND expires_at > {_now_sql(kind)}"
    )
    rng = random.Random(config.seed * 1000 + index)
    resources = [f"fenced:{n}" for n in range(config.resources)]
    history: list[dict] = []
    with app.app_context():
        service = lock_service()
        ready.set()
        start.wait()
        stop_at = time.monotonic() + config.duration
        grant = 0
        while time.monotonic() < stop_at:
            resource = rng.choice(resources)
            grant += 1
            owner = f"w{index}-{grant}"
            try:
                result = service.acquire(resource, owner, ttl=config.ttl)
            except Exception as exc:  # noqa: BLE001 - recorded; the run goes on
                history.append({"kind": "acquire_error", "error": repr(exc)})
                continue
            if not result.acquired:
                time.sleep(rng.uniform(0.002, 0.02))
                continue
            lock = result.lock
            history.append({"kind": "grant", "resource": resource, "fence": lock.fence})
            for _ in range(rng.randint(2, 6)):
                outcome = _write(conn, lock, owner, insert, plain_check, config, rng)
                outcome.update(resource=resource, fence=lock.fence)
                history.append(outcome)
                if outcome["kind"] != "committed":
                    break
            if rng.random() < 0.7:
                try:
                    service.release(resource, owner)
                except Exception:  # noqa: BLE001 - lost meanwhile: expected here
                    pass
    conn.close()
    Path(out).write_text("\n".join(json.dumps(h) for h in history) + "\n")


def _write(conn, lock, owner, insert, plain_check, config, rng) -> dict:
    from lockkeeper_client import GuardRefused, guard

    try:
        if config.guarded:
            guard(conn, lock)
        else:
            with conn.cursor() as cursor:
                cursor.execute(plain_check, (lock.resource,))
                found = cursor.fetchone()
            if found is None or found[0] != lock.fence:
                conn.rollback()
                return {"kind": "refused", "reason": "plain check"}
        # The work of the transaction: a pause here is a pause inside it.
        time.sleep(rng.uniform(0, config.ttl / 10))
        # The last statement before COMMIT: its clock reading is the write's.
        with conn.cursor() as cursor:
            cursor.execute(insert, (lock.resource, lock.fence, owner))
        conn.commit()
        return {"kind": "committed"}
    except GuardRefused as refused:
        conn.rollback()
        return {"kind": "refused", "reason": refused.reason}
    except Exception as exc:  # noqa: BLE001 - an unknown outcome, recorded
        try:
            conn.rollback()
        except Exception:  # noqa: BLE001
            pass
        return {"kind": "error", "error": repr(exc)}


# -- the run --------------------------------------------------------------------------


def run(config: FencedConfig, log=print) -> FencedReport:
    prepare(config.database_url)
    context = multiprocessing.get_context("spawn")
    ready = [context.Event() for _ in range(config.workers)]
    start = context.Event()
    with tempfile.TemporaryDirectory(prefix="fenced-run-") as work:
        outs = [os.path.join(work, f"w{n}.jsonl") for n in range(config.workers)]
        workers = [
            context.Process(
                target=worker_main,
                args=(config, n, ready[n], start, outs[n]),
                daemon=True,
            )
            for n in range(config.workers)
        ]
        for process in workers:
            process.start()
        for event in ready:
            if not event.wait(60):
                raise RuntimeError("a worker never started")
        start.set()
        pauses = _nemesis(config, workers)
        for process in workers:
            process.join(config.duration + 60)
            if process.exitcode != 0:
                raise RuntimeError(f"worker {process.name} ended {process.exitcode}")
        histories = [
            json.loads(line)
            for out in outs
            for line in Path(out).read_text().splitlines()
            if line
        ]
    writes, events = _read(config.database_url)
    report = check(writes, events)
    counts = Counter(h["kind"] for h in histories)
    refusals = Counter(h["reason"] for h in histories if h["kind"] == "refused")
    report.stats.update(
        database=_kind(config.database_url),
        guarded=config.guarded,
        duration=config.duration,
        workers=config.workers,
        ttl=config.ttl,
        pauses=pauses,
        grants=counts["grant"],
        writes_acknowledged=counts["committed"],
        writes_refused=dict(refusals),
        write_errors=counts["error"],
    )
    log(json.dumps(asdict(report), indent=2, default=str))
    return report


def _nemesis(config: FencedConfig, workers) -> int:
    """Stop a random worker for 1.5–3 ttls, resume it, again, until the end."""
    rng = random.Random(config.seed)
    stop_at = time.monotonic() + config.duration
    pauses = 0
    while time.monotonic() < stop_at - config.ttl * 3:
        victim = rng.choice(workers)
        os.kill(victim.pid, signal.SIGSTOP)
        try:
            time.sleep(rng.uniform(1.5, 3.0) * config.ttl)
        finally:
            os.kill(victim.pid, signal.SIGCONT)
        pauses += 1
        time.sleep(rng.uniform(0.02, 0.1))
    return pauses


def _read(url: str) -> tuple[list[dict], list[dict]]:
    engine = create_engine(normalize_database_url(url))
    try:
        with engine.connect() as conn:
            writes = [
                dict(row._mapping)
                for row in conn.execute(
                    text("SELECT resource, fence, owner, written_at FROM fenced_writes")
                )
            ]
            events = [
                dict(row._mapping)
                for row in conn.execute(
                    text(
                        "SELECT id, resource, action, fence, occurred_at"
                        " FROM lock_events WHERE resource LIKE 'fenced:%'"
                        " ORDER BY id"
                    )
                )
            ]
    finally:
        engine.dispose()
    return writes, events


# -- the checker ----------------------------------------------------------------------


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


def tenures(events: list[dict]) -> dict[tuple[str, int], tuple[datetime, Any]]:
    """(resource, fence) -> (start, end): from its grant to the next event of the
    resource that ends it (a release or force-release of it, or a grant of
    another fence), by the clock each event read under the row lock; end None:
    it still runs."""
    found: dict[tuple[str, int], tuple[datetime, Any]] = {}
    current: dict[str, int] = {}
    for event in sorted(events, key=lambda e: e["id"]):
        resource, fence = event["resource"], event["fence"]
        at = _utc(event["occurred_at"])
        running = current.get(resource)
        ends_running = (event["action"] in GRANTS and fence != running) or (
            event["action"] in ENDS and fence == running
        )
        if running is not None and ends_running:
            start, _ = found[resource, running]
            found[resource, running] = (start, at)
            del current[resource]
        if event["action"] in GRANTS and fence != running:
            found[resource, fence] = (at, None)
            current[resource] = fence
    return found


def check(writes: list[dict], events: list[dict]) -> FencedReport:
    spans = tenures(events)
    violations = []
    for write in writes:
        key = (write["resource"], write["fence"])
        at = _utc(write["written_at"])
        if key not in spans:
            violations.append(f"{key}: a write under a fence never granted there")
            continue
        start, end = spans[key]
        if at < start or (end is not None and at >= end):
            violations.append(
                f"{key}: written at {at.isoformat()} by {write['owner']}, outside"
                f" its tenure {start.isoformat()} .. "
                f"{end.isoformat() if end else 'now'}"
            )
    by_resource: dict[str, list[dict]] = defaultdict(list)
    for write in writes:
        by_resource[write["resource"]].append(write)
    for resource, made in by_resource.items():
        made.sort(key=lambda w: _utc(w["written_at"]))
        for before, after in zip(made, made[1:], strict=False):
            if after["fence"] < before["fence"]:
                violations.append(
                    f"{resource}: fence {after['fence']} wrote after fence "
                    f"{before['fence']}"
                )
    take_overs = sum(1 for e in events if e["action"] == "took_over")
    stats = {
        "writes_committed": len(writes),
        "take_overs": take_overs,
        "grants_logged": sum(1 for e in events if e["action"] in GRANTS),
        "violations": len(violations),
    }
    return FencedReport(stats, violations)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.fenced")
    parser.add_argument("--database", choices=("postgresql", "mariadb"))
    parser.add_argument(
        "--database-url", help="a migrated database (else a private one)"
    )
    parser.add_argument("--duration", type=float, default=FencedConfig.duration)
    parser.add_argument("--workers", type=int, default=FencedConfig.workers)
    parser.add_argument("--ttl", type=float, default=FencedConfig.ttl)
    parser.add_argument("--seed", type=int, default=FencedConfig.seed)
    parser.add_argument("--unguarded", action="store_true")
    args = parser.parse_args(argv)
    private = None
    url = args.database_url
    if url is None:
        from tests.databases import ServerDatabase

        private = ServerDatabase(
            args.database or "postgresql", Path(tempfile.mkdtemp(prefix="fenced-"))
        )
        url = private.url
    try:
        report = run(
            FencedConfig(
                database_url=url,
                duration=args.duration,
                workers=args.workers,
                ttl=args.ttl,
                guarded=not args.unguarded,
                seed=args.seed,
            )
        )
    finally:
        if private is not None:
            private.close()
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
