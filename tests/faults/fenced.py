"""The fenced-write workload: Jepsen's lock-set in database form.

Worker processes take locks on a few resources (short ttls) and, while they hold
one, append rows to a table of the lock database, each in a transaction of its
own that calls ``guard`` first. The resources hold every kind of grant: one is
exclusive, one is read and written (readers take it shared, writers
exclusive), one is a semaphore of 2 holders; a reader or a holder guards its
writes with its own fence as a writer does. A nemesis stops a random worker
with SIGSTOP for 1.5–3 ttls and resumes it, so paused holders wake up inside
and outside their guarded transactions after someone else took the lock over.

The checker reads what committed (the table) and the audit log, and proves that
every committed write was made by a valid holder at its commit: its fence's
tenure (from its grant to the event that ended it, by the database's clock)
contains the write's clock reading, taken by the transaction's last statement
before COMMIT, after its guard and its work; no write through a shared grant or
a holder falls in an exclusive holder's tenure of its resource; and per resource
the writes, in time order, never go below the fence of an exclusive write
before them, and an exclusive write never below any fence before it (readers
and holders write side by side, their fences in any order). ``--unguarded``
writes after a plain read of the fence instead (the check-then-write a store
without the guard would do): the checker must then find the writes that paused
holders committed after a take-over.

The one window the checker cannot see is between that last statement and the
COMMIT; a take-over there would have to get past the guard's row lock, which
tests/test_guard_races.py shows it waits for.

    python -m tests.faults.fenced --database postgresql --duration 60
    python -m tests.faults.fenced --database mariadb --duration 60 --unguarded
"""

from __future__ import annotations

import argparse
import json
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
from tests.forks import worker_context

# Events that start a grant's tenure; a re-acquire or renew keeps the fence.
GRANTS = {"acquired", "took_over", "claimed", "force_claimed"}
ENDS = {"released", "force_released"}
# Events that move a grant's expiry (a holder's tenure ends with its expiry).
MOVES = {"renewed", "reacquired"}
EXCLUSIVE, SHARED, SEMAPHORE = "exclusive", "shared", "semaphore"

# The resources: one exclusive; one read and written, taken shared by this
# share of its acquires; one a semaphore of ``LIMITS`` holders.
EXCLUSIVE_RESOURCE = "fenced:0"
READ_WRITE = "fenced:rw"
SEMAPHORE_RESOURCE = "fenced:sem"
RESOURCES = (EXCLUSIVE_RESOURCE, READ_WRITE, SEMAPHORE_RESOURCE)
LIMITS = {SEMAPHORE_RESOURCE: 2}
SHARED_SHARE = 0.7


@dataclass
class FencedConfig:
    database_url: str
    duration: float = 6.0
    workers: int = 6
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


def drop(url: str) -> None:
    """Remove the ``fenced_writes`` table: the database is shared with the tests
    that follow on this worker, which compare its tables with the schema's."""
    engine = create_engine(normalize_database_url(url))
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("DROP TABLE IF EXISTS fenced_writes")
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
    from app.extensions import lock_service

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
    # What a store without the guard would check: the grant's row live.
    plain_check = (
        "SELECT fence FROM distributed_locks WHERE resource = %s AND fence = %s"
        f" AND owner IS NOT NULL AND expires_at > {_now_sql(kind)}"
        " UNION ALL SELECT fence FROM lock_holders WHERE resource = %s"
        f" AND fence = %s AND expires_at > {_now_sql(kind)}"
    )
    rng = random.Random(config.seed * 1000 + index)
    history: list[dict] = []
    with app.app_context():
        service = lock_service()
        ready.set()
        start.wait()
        stop_at = time.monotonic() + config.duration
        grant = 0
        while time.monotonic() < stop_at:
            resource = rng.choice(RESOURCES)
            limit = LIMITS.get(resource, 1)
            shared = resource == READ_WRITE and rng.random() < SHARED_SHARE
            kind = SHARED if shared else SEMAPHORE if limit > 1 else EXCLUSIVE
            grant += 1
            owner = f"w{index}-{grant}"
            try:
                result = service.acquire(
                    resource,
                    owner,
                    ttl=config.ttl,
                    limit=limit,
                    mode=SHARED if shared else EXCLUSIVE,
                )
            except Exception as exc:  # noqa: BLE001 - recorded; the run goes on
                history.append({"kind": "acquire_error", "error": repr(exc)})
                continue
            if not result.acquired:
                time.sleep(rng.uniform(0.002, 0.02))
                continue
            lock = result.lock
            history.append(
                {
                    "kind": "grant",
                    "resource": resource,
                    "fence": lock.fence,
                    "grant": kind,
                }
            )
            for _ in range(rng.randint(2, 6)):
                outcome = _write(conn, lock, owner, insert, plain_check, config, rng)
                outcome.update(resource=resource, fence=lock.fence, grant=kind)
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
                cursor.execute(
                    plain_check, (lock.resource, lock.fence, lock.resource, lock.fence)
                )
                found = cursor.fetchone()
            if found is None:
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
    context = worker_context()
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
    report = check(writes, events, LIMITS)
    counts = Counter(h["kind"] for h in histories)
    refusals = Counter(h["reason"] for h in histories if h["kind"] == "refused")
    by_kind = {
        kind: Counter(h["grant"] for h in histories if h["kind"] == kind)
        for kind in ("grant", "committed")
    }
    report.stats.update(
        database=_kind(config.database_url),
        guarded=config.guarded,
        duration=config.duration,
        workers=config.workers,
        ttl=config.ttl,
        pauses=pauses,
        grants=counts["grant"],
        grants_by_kind=dict(by_kind["grant"]),
        writes_acknowledged=counts["committed"],
        writes_acknowledged_by_kind=dict(by_kind["committed"]),
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
                        "SELECT id, resource, action, fence, mode, expires_at,"
                        " occurred_at FROM lock_events"
                        " WHERE resource LIKE 'fenced:%'"
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


@dataclass
class Tenure:
    """A fence's time as a grant of its resource, by the database's clock:
    from its grant to the event that ended it (``end`` None: it still runs);
    ``kind`` exclusive, shared or holder; ``expires_at``: the last expiry its
    events gave it."""

    kind: str
    start: datetime
    expires_at: datetime | None
    end: datetime | None = None

    def holds(self, at: datetime) -> bool:
        return self.start <= at and (self.end is None or at < self.end)

    def span(self) -> str:
        end = self.end.isoformat() if self.end else "now"
        return f"{self.start.isoformat()} .. {end}"


def _grant_kind(event: dict, limits: dict[str, int]) -> str:
    if limits.get(event["resource"], 1) > 1:
        return SEMAPHORE
    return SHARED if event.get("mode") == SHARED else EXCLUSIVE


def tenures(
    events: list[dict], limits: dict[str, int] | None = None
) -> dict[tuple[str, int], Tenure]:
    """(resource, fence) -> its ``Tenure``. An exclusive grant's ends with the
    next event of the resource that ends it: its release or force-release, or
    a grant of another fence (a take-over, after it expired). A shared grant
    or a holder (``limits``: the semaphores' limits by resource) ends with its
    release or force-release, with an exclusive grant (which comes only once
    every other grant is gone), or with the first grant after its expiry (an
    expired holder is cleared by the next grant, and until that commits no
    other grant can have its row: a guarded write made after the expiry,
    under a guard passed before it, is still in its tenure). Each end is the
    clock its event read under the resource's row lock."""
    limits = limits or {}
    found: dict[tuple[str, int], Tenure] = {}
    running: dict[str, set[int]] = defaultdict(set)
    for event in sorted(events, key=lambda e: e["id"]):
        resource, fence, action = event["resource"], event["fence"], event["action"]
        at = _utc(event["occurred_at"])
        expires_at = event.get("expires_at")
        expires_at = _utc(expires_at) if expires_at is not None else None
        live = running[resource]
        if action in GRANTS and fence not in live:
            kind = _grant_kind(event, limits)
            for other in list(live):
                tenure = found[resource, other]
                if (
                    kind == EXCLUSIVE
                    or tenure.kind == EXCLUSIVE
                    or (tenure.expires_at is not None and tenure.expires_at <= at)
                ):
                    tenure.end = at
                    live.discard(other)
            found[resource, fence] = Tenure(kind, at, expires_at)
            live.add(fence)
        elif action in ENDS and fence in live:
            found[resource, fence].end = at
            live.discard(fence)
        elif action in MOVES and fence in live and expires_at is not None:
            found[resource, fence].expires_at = expires_at
    return found


def check(
    writes: list[dict], events: list[dict], limits: dict[str, int] | None = None
) -> FencedReport:
    spans = tenures(events, limits)
    violations = []
    exclusive: dict[str, list[tuple[int, Tenure]]] = defaultdict(list)
    for (resource, fence), tenure in spans.items():
        if tenure.kind == EXCLUSIVE:
            exclusive[resource].append((fence, tenure))
    kinds: dict[str, int] = defaultdict(int)
    for write in writes:
        key = (write["resource"], write["fence"])
        at = _utc(write["written_at"])
        tenure = spans.get(key)
        if tenure is None:
            violations.append(f"{key}: a write under a fence never granted there")
            continue
        kinds[tenure.kind] += 1
        if not tenure.holds(at):
            violations.append(
                f"{key}: written at {at.isoformat()} by {write['owner']}, outside"
                f" its tenure {tenure.span()}"
            )
        if tenure.kind == EXCLUSIVE:
            continue
        for fence, holder in exclusive[write["resource"]]:
            if holder.holds(at):
                violations.append(
                    f"{key}: written through a {tenure.kind} grant at "
                    f"{at.isoformat()} by {write['owner']}, while exclusive fence "
                    f"{fence} held {write['resource']} ({holder.span()})"
                )
    violations += _fence_order_violations(writes, spans)
    take_overs = sum(1 for e in events if e["action"] == "took_over")
    stats = {
        "writes_committed": len(writes),
        "writes_committed_by_kind": dict(kinds),
        "take_overs": take_overs,
        "grants_logged": sum(1 for e in events if e["action"] in GRANTS),
        "violations": len(violations),
    }
    return FencedReport(stats, violations)


def _fence_order_violations(writes, spans) -> list[str]:
    """Per resource, in time order: a write never carries a fence below an
    exclusive write's before it, and an exclusive write none below any write's
    before it. Readers and holders write side by side in any fence order."""
    violations = []
    by_resource: dict[str, list[dict]] = defaultdict(list)
    for write in writes:
        if (write["resource"], write["fence"]) in spans:
            by_resource[write["resource"]].append(write)
    for resource, made in by_resource.items():
        made.sort(key=lambda w: _utc(w["written_at"]))
        highest = highest_exclusive = None
        for write in made:
            fence = write["fence"]
            is_exclusive = spans[resource, fence].kind == EXCLUSIVE
            floor = highest if is_exclusive else highest_exclusive
            if floor is not None and fence < floor:
                violations.append(
                    f"{resource}: fence {fence} wrote after fence {floor}"
                )
            highest = fence if highest is None else max(highest, fence)
            if is_exclusive:
                highest_exclusive = max(highest_exclusive or fence, fence)
    return violations


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
