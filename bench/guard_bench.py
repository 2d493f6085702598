"""What the guard costs a worker's write, and what it costs a take-over.

``guarded_write_vs_plain_<db>``: one connection of the worker's own driver
(psycopg, PyMySQL) writes one row per transaction, with ``guard(conn, lock)``
first (the client's helper: one more round trip, a row locked FOR SHARE) and
without, alternated in the same run. The detail also holds the trade-off: how
long a take-over of an expired grant waits for a guarded transaction that stays
open ``HOLD`` seconds after the grant expired (about ``HOLD``: the take-over
cannot commit before the guarded transaction does).
"""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path

from sqlalchemy.engine import make_url

from bench.measure import Comparison, Sample, alternate, compare

HOLD = 0.05  # seconds a guarded transaction stays open past the grant's expiry
TAKE_OVERS = 5


def _connect(url: str, backend: str):
    parsed = make_url(url)
    if backend == "postgresql":
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


def _app(url: str, instance: Path):
    from app import create_app

    return create_app(
        {
            "LOCKKEEPER_DATABASE_URL": url,
            "LOCKKEEPER_INSTANCE_PATH": str(instance),
            "LOCKKEEPER_BOOTSTRAP": False,
            "LOCKKEEPER_AUTO_MIGRATE": False,
            "SECRET_KEY": "bench",
        }
    )


def bench_guard(databases, workdir: Path, rounds: int, seconds: float, log):
    return [
        _bench_guard(backend, databases[backend].url, workdir, rounds, seconds, log)
        for backend in ("postgresql", "mariadb")
        if backend in databases
    ]


def _bench_guard(backend, url, workdir, rounds, seconds, log) -> Comparison:
    from lockkeeper_client import guard

    from app.extensions import lock_service

    app = _app(url, workdir / f"instance-{backend}")
    with app.app_context():
        service = lock_service()
        lock = service.acquire("bench:guarded", "bench", ttl=3600).lock
        conn = _connect(url, backend)
        with conn.cursor() as cursor:
            cursor.execute("DROP TABLE IF EXISTS bench_guarded_writes")
            cursor.execute("CREATE TABLE bench_guarded_writes (fence BIGINT)")
        conn.commit()
        log(f"guard: guarded and plain writes on {backend}")
        samples = alternate(
            {
                "guarded": lambda: _writes(conn, lock, guard, seconds),
                "plain": lambda: _writes(conn, lock, None, seconds),
            },
            rounds,
        )
        service.release("bench:guarded", "bench")
        waits = [_take_over_wait(app, service, conn, guard) for _ in range(TAKE_OVERS)]
        conn.close()
    return compare(
        f"guarded_write_vs_plain_{backend}",
        samples,
        "guarded",
        "plain",
        "writes/s",
        take_over_wait_ms=round(statistics.median(waits) * 1000, 1),
        guarded_transaction_held_ms=HOLD * 1000,
    )


def _writes(conn, lock, guard, seconds: float) -> Sample:
    """One row per transaction for ``seconds``; ``guard`` None: unguarded."""
    insert = "INSERT INTO bench_guarded_writes (fence) VALUES (%s)"
    done, started = 0, time.perf_counter()
    deadline = started + seconds
    while time.perf_counter() < deadline:
        if guard is not None:
            guard(conn, lock)
        with conn.cursor() as cursor:
            cursor.execute(insert, (lock.fence,))
        conn.commit()
        done += 1
    return Sample(done / (time.perf_counter() - started))


def _take_over_wait(app, service, conn, guard) -> float:
    """Seconds a take-over of an expired grant waits for a guarded transaction
    that commits ``HOLD`` seconds after the expiry."""
    lock = service.acquire("bench:taken", "holder", ttl=0.2).lock
    guard(conn, lock)
    while service.now() <= lock.expires_at:
        time.sleep(0.005)
    waited: list[float] = []

    def take_over():
        started = time.perf_counter()
        with app.app_context():
            service.acquire("bench:taken", "taker", ttl=30)
        waited.append(time.perf_counter() - started)

    taker = threading.Thread(target=take_over)
    taker.start()
    time.sleep(HOLD)
    conn.commit()
    taker.join()
    service.release("bench:taken", "taker")
    return waited[0]
