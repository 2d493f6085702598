"""Service layer (no HTTP) against the same statements sent through the driver.

Each worker is a process (no shared GIL) with its own resource, so the figure is
throughput, not contention: acquire then release, as many cycles as fit in the
window. Workers set up (app, pool, warm-up) before a barrier, so only the loop
is timed.

Beside the rate, each run records the CPU a cycle cost: the workers' own
(``client_cpu_ms_per_cycle``) and, on a PostgreSQL server on this machine, that
of the server processes serving this database's sessions
(``database_cpu_ms_per_cycle``: the backends, not the WAL writer, checkpointer
or autovacuum). On two cores shared with other work the rate moves with the
load; what a cycle costs in CPU moves far less, and says what limits the rate.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import threading
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path

from sqlalchemy.engine import make_url

from bench.measure import Comparison, Sample, alternate, compare, cpu_detail
from bench.servers import process_cpu_seconds

_CTX = multiprocessing.get_context("fork")
WARMUP_CYCLES = 20


def _service_cycle(url: str, instance: Path):
    from app import create_app
    from app.extensions import lock_service

    app = create_app(
        {
            "LOCKKEEPER_DATABASE_URL": url,
            "LOCKKEEPER_INSTANCE_PATH": str(instance),
            "LOCKKEEPER_BOOTSTRAP": False,
            "LOCKKEEPER_AUTO_MIGRATE": False,
            "SECRET_KEY": "bench",
        }
    )
    context = app.app_context()
    context.push()
    service = lock_service()

    def cycle(resource: str, owner: str) -> bool:
        granted = service.acquire(resource, owner, ttl=30).acquired
        service.release(resource, owner)
        return granted

    return cycle


def _token_cycle(url: str, instance: Path):
    """The service cycle as an API token with the default lock quota makes it,
    every worker on the same token: what checking the token where each grant
    commits, and counting its quota exactly, cost a token many workers share."""
    _service_cycle(url, instance)  # the app, its context pushed
    from flask import current_app

    from app.auth.service import AuthError, create_token
    from app.extensions import lock_service

    with contextlib.suppress(AuthError):  # another worker made it first
        create_token(BENCH_TOKEN)
    service = lock_service()
    quota = int(current_app.config["LOCKKEEPER_MAX_LOCKS_PER_TOKEN"]) or None

    def cycle(resource: str, owner: str) -> bool:
        mine = {"token": BENCH_TOKEN, "max_locks": quota}
        granted = service.acquire(resource, owner, ttl=30, **mine).acquired
        service.release(resource, owner, token=BENCH_TOKEN)
        return granted

    return cycle


BENCH_TOKEN = "bench-shared"
SEMAPHORE_LIMIT = 4


def _semaphore_cycle(url: str, instance: Path):
    """The service cycle on a semaphore of 4 (the holders path: a plain read,
    then one transaction; the release tries the exclusive statement first)."""
    _service_cycle(url, instance)
    from app.extensions import lock_service

    service = lock_service()

    def cycle(resource: str, owner: str) -> bool:
        granted = service.acquire(
            resource, owner, ttl=30, limit=SEMAPHORE_LIMIT
        ).acquired
        service.release(resource, owner)
        return granted

    return cycle


SET_SIZE = 3


def _set_cycle(url: str, instance: Path):
    """Three exclusive locks acquired as one set and released as one: one
    transaction each way (``lockkeeper_core.sets``)."""
    _service_cycle(url, instance)
    from lockkeeper_core.values import Member

    from app.extensions import lock_service

    service = lock_service()

    def cycle(resource: str, owner: str) -> bool:
        names = [f"{resource}:{n}" for n in range(SET_SIZE)]
        members = [Member(name) for name in names]
        granted = service.acquire_set(members, owner, ttl=30).acquired
        service.release_set(names, owner)
        return granted

    return cycle


def _singles_cycle(url: str, instance: Path):
    """What a set replaces: the same three locks acquired one after another,
    then released one after another."""
    _service_cycle(url, instance)
    from app.extensions import lock_service

    service = lock_service()

    def cycle(resource: str, owner: str) -> bool:
        names = [f"{resource}:{n}" for n in range(SET_SIZE)]
        granted = [service.acquire(name, owner, ttl=30).acquired for name in names]
        for name in names:
            service.release(name, owner)
        return all(granted)

    return cycle


def _embedded_cycle(url: str, instance: Path):
    """The worker client in the embedded mode: ``LockClient`` on the in-process
    transport (``lockkeeper_core.embedded``), acting as the shared API token, each
    worker process on its own engine: what a worker pays for a lock with no
    server (the client's request and answer built and read in process, the
    token check, the core)."""
    _service_cycle(url, instance)  # the app, to make the token
    from lockkeeper_client import LockClient
    from lockkeeper_core.embedded import EmbeddedTransport

    from app.auth.service import create_token
    from app.extensions import db

    secret = create_token(f"bench-embedded-{uuid.uuid4().hex[:8]}")
    database = db.engine.url.render_as_string(hide_password=False)
    client = LockClient(
        "http://embedded", secret, transport=EmbeddedTransport(database)
    )

    def cycle(resource: str, owner: str) -> bool:
        granted = client.acquire(resource, owner, ttl=30).acquired
        client.release(resource, owner)
        return granted

    return cycle


def _driver_cycle(url: str, _instance: Path):
    from bench.driver_sql import connect, driver_for

    driver, conn = driver_for(url), connect(url)

    def cycle(resource: str, owner: str) -> bool:
        granted = driver.service_acquire(conn, resource, owner, 30) is not None
        return driver.service_release(conn, resource, owner) and granted

    return cycle


_CYCLES = {
    "service": _service_cycle,
    "driver": _driver_cycle,
    "token": _token_cycle,
    "semaphore": _semaphore_cycle,
    "embedded": _embedded_cycle,
    "set": _set_cycle,
    "singles": _singles_cycle,
}


def _label(kind) -> str:
    return kind if isinstance(kind, str) else kind.__name__


def _worker(kind, url, instance, index, duration, barrier, results, finished) -> None:
    try:
        make = _CYCLES[kind] if isinstance(kind, str) else kind
        cycle = make(url, instance)
        resource, owner = f"bench:{_label(kind)}:{index}", f"worker-{index}"
        for _ in range(WARMUP_CYCLES):
            cycle(resource, owner)
    except BaseException as exc:
        # Tell the parent at once instead of leaving it at the barrier.
        results.put(f"{_label(kind)} worker {index}: {exc!r}")
        barrier.abort()
        raise
    barrier.wait()
    done = failed = 0
    cpu = time.process_time()
    deadline = time.perf_counter() + duration
    while time.perf_counter() < deadline:
        if cycle(resource, owner):
            done += 1
        else:
            failed += 1
    results.put((done, failed, time.process_time() - cpu))
    # The database sessions stay open until the parent has read their server
    # processes' CPU time (a process gone takes its count with it).
    finished.wait(timeout=60)


class DatabaseBackends:
    """The PostgreSQL server processes serving a database's sessions, when
    the server runs on this machine (their CPU time is read from /proc)."""

    def __init__(self, url: str):
        parsed = make_url(url)
        self._conn = None
        if parsed.get_backend_name() != "postgresql" or parsed.host not in (
            "127.0.0.1",
            "localhost",
            "::1",
        ):
            return
        from bench.driver_sql import connect

        self._conn = connect(url)

    def cpu(self) -> dict[int, float] | None:
        """CPU seconds so far of each of the database's other sessions'
        server processes; None when they cannot be read here."""
        if self._conn is None:
            return None
        pids = [
            row[0]
            for row in self._conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
            )
        ]
        return {pid: process_cpu_seconds(pid) for pid in pids if _is_postgres(pid)}

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


def _is_postgres(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "postgres"
    except OSError:
        return False


def _spent(before: dict[int, float] | None, after: dict[int, float] | None):
    """CPU seconds the processes alive at both looks spent between them."""
    if before is None or after is None:
        return None
    return sum(after[pid] - before[pid] for pid in before if after.get(pid))


def run_cycles(
    kind,
    url: str,
    instance: Path,
    workers: int,
    duration: float,
    server_cpu: Callable[[], float] | None = None,
):
    """Cycles per second of ``workers`` processes for ``duration`` seconds,
    with the CPU a cycle cost (the module's docstring). ``kind``: a name of
    ``_CYCLES``, or a function of ``(url, instance)`` that makes the cycle.
    ``server_cpu``: the CPU seconds so far of the server the cycles go to
    (read over the timed loop only, as the backends are)."""
    barrier = _CTX.Barrier(workers + 1)
    results = _CTX.Queue()
    finished = _CTX.Event()
    processes = [
        _CTX.Process(
            target=_worker,
            args=(kind, url, instance, i, duration, barrier, results, finished),
            daemon=True,
        )
        for i in range(workers)
    ]
    backends = DatabaseBackends(url)
    for process in processes:
        process.start()
    try:
        try:
            barrier.wait(timeout=120)
        except threading.BrokenBarrierError:
            raise RuntimeError(results.get(timeout=5)) from None
        before = backends.cpu()
        server_before = server_cpu() if server_cpu else None
        outcomes = [results.get(timeout=duration + 120) for _ in processes]
        server_spent = server_cpu() - server_before if server_cpu else None
        database_cpu = _spent(before, backends.cpu())
    finally:
        finished.set()
        backends.close()
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.terminate()
    done = sum(o[0] for o in outcomes)
    failed = sum(o[1] for o in outcomes)
    if failed:
        raise RuntimeError(
            f"{_label(kind)}: {failed} cycles were refused on a free resource"
        )
    per_cycle = 1000 / done if done else None
    return Sample(
        done / duration,
        {
            "client_cpu_ms_per_cycle": per_cycle
            and sum(o[2] for o in outcomes) * per_cycle,
            "database_cpu_ms_per_cycle": (
                None if database_cpu is None else per_cycle and database_cpu * per_cycle
            ),
            "server_cpu_ms_per_cycle": (
                None if server_spent is None else per_cycle and server_spent * per_cycle
            ),
        },
    )


def bench_service_layer(
    databases: dict, workdir: Path, worker_counts, rounds: int, duration: float, log
) -> list[Comparison]:
    comparisons = []
    for backend, database in databases.items():
        instance = workdir / f"instance-{backend}"
        for workers in worker_counts:
            # PostgreSQL also runs a semaphore's cycle beside the exclusive
            # one, and a set of three beside three single locks.
            kinds = ("service", "driver", "token", "embedded") + (
                ("semaphore", "set", "singles") if backend == "postgresql" else ()
            )
            sides = {
                kind: partial(
                    run_cycles, kind, database.url, instance, workers, duration
                )
                for kind in kinds
            }
            samples = alternate(sides, rounds)
            suffix = "" if workers == 1 else f"_{workers}w"
            token = compare(
                f"token_vs_service_{backend}{suffix}",
                samples,
                "token",
                "service",
                "cycles/s",
                workers=workers,
                backend=backend,
            )
            log(
                f"{token.name}: one shared API token {token.value:.0f} vs no token "
                f"{token.baseline:.0f} cycles/s -> {token.ratio:.2f}x"
            )
            comparisons.append(token)
            result = compare(
                f"service_vs_driver_{backend}{suffix}",
                samples,
                "service",
                "driver",
                "cycles/s",
                workers=workers,
                backend=backend,
            )
            log(
                f"{result.name}: service {result.value:.0f} vs driver "
                f"{result.baseline:.0f} cycles/s -> {result.ratio:.2f}x"
            )
            comparisons.append(result)
            embedded = compare(
                f"embedded_vs_driver_{backend}{suffix}",
                samples,
                "embedded",
                "driver",
                "cycles/s",
                workers=workers,
                backend=backend,
                **cpu_detail(samples, "embedded", "driver"),
            )
            log(
                f"{embedded.name}: the client in process {embedded.value:.0f} vs "
                f"driver {embedded.baseline:.0f} cycles/s -> {embedded.ratio:.2f}x"
            )
            comparisons.append(embedded)
            if "semaphore" in samples:
                holders = compare(
                    f"semaphore_vs_exclusive_{backend}{suffix}",
                    samples,
                    "semaphore",
                    "service",
                    "cycles/s",
                    workers=workers,
                    backend=backend,
                )
                log(
                    f"{holders.name}: semaphore of {SEMAPHORE_LIMIT} "
                    f"{holders.value:.0f} vs exclusive {holders.baseline:.0f} "
                    f"cycles/s -> {holders.ratio:.2f}x"
                )
                comparisons.append(holders)
            if "set" in samples:
                whole = compare(
                    f"set_of_3_vs_3_singles_{backend}{suffix}",
                    samples,
                    "set",
                    "singles",
                    "cycles/s",
                    workers=workers,
                    backend=backend,
                )
                log(
                    f"{whole.name}: a set of {SET_SIZE} {whole.value:.0f} vs "
                    f"{SET_SIZE} single locks {whole.baseline:.0f} cycles/s -> "
                    f"{whole.ratio:.2f}x"
                )
                comparisons.append(whole)
    return comparisons
