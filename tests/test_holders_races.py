"""Semaphores and shared grants raced by real threads and processes on each
real database.

The clock is the real one (the database server's on PostgreSQL and MariaDB).
What the database decided is read back from the audit log: every grant's
interval runs from its ``acquired_at`` to its release (the event's
``occurred_at``) or, never released, its last ``expires_at``; at no instant do
more intervals overlap than the rules allow.

The issue asks for 32 clients on a semaphore of 4 for 20 s: that is the run
under CI (``CI=true``, ``RUN_SECONDS``). A local run takes 4 s per database to
keep the suite fast, which is still hundreds of grants; readers and writers
race half as long under CI (``READ_WRITE_SECONDS``). Half of the clients are
threads of this process, half threads of child processes (``PROCESSES``), each
with its own app, engine and pool.
"""

from __future__ import annotations

import os
import random
import threading
import time

import pytest
from lockkeeper_core.errors import LockNotFound, ServiceBusy
from lockkeeper_core.models import LockEvent
from sqlalchemy import select

from app import create_app
from app.extensions import db, lock_service
from tests.forks import worker_context

# This process's pool (16 + 4), the two children's (8 + 4 each), and the
# waiting line's listener of each of the three apps.
CONNECTIONS = 48
pytestmark = [
    pytest.mark.usefixtures("backend"),
    pytest.mark.connections(CONNECTIONS),
    pytest.mark.slow,
]

RUN_SECONDS = 20.0 if os.environ.get("CI") == "true" else 4.0
# Readers and writers: half as long (the suite runs sequentially under CI).
READ_WRITE_SECONDS = max(RUN_SECONDS / 2, 4.0)
TARGET_GRANTS = 40
HARD_DEADLINE = RUN_SECONDS + 60.0
LIMIT = 4
CONTENDERS = 32
PROCESSES = 2  # x CONTENDERS / 4 threads each: half the clients
READERS, WRITERS = 10, 4
GRANTS = ("acquired", "took_over", "reacquired")
# A connection for each of the (at most 16) threads of this process and a few
# more, so nobody queues on the pool (a release behind 31 spinning contenders
# waited seconds for a connection), yet no more: the children have pools of
# their own (``_race_app``) on the same server. Room in line for everyone.
RACE_CONFIG = {
    "SQLALCHEMY_ENGINE_OPTIONS": {"pool_size": 16, "max_overflow": 4},
    "LOCKKEEPER_MAX_WAITERS": 64,
    "LOCKKEEPER_MAX_WAITERS_PER_TOKEN": 64,
}


def _events(app, resource: str) -> list[LockEvent]:
    with app.app_context():
        found = list(
            db.session.scalars(
                select(LockEvent)
                .where(LockEvent.resource == resource)
                .order_by(LockEvent.id)
            )
        )
        db.session.expunge_all()
        return found


def _intervals(events: list[LockEvent]) -> list[tuple]:
    """(start, end, fence, mode) per grant, by the database's clock."""
    grants: dict[int, dict] = {}
    for event in events:
        if event.action in GRANTS or event.action == "renewed":
            grant = grants.setdefault(
                event.fence,
                {"start": event.acquired_at, "mode": event.mode, "end": None},
            )
            grant["expires"] = event.expires_at
            grant["mode"] = event.mode
        elif event.action in ("released", "force_released"):
            grants[event.fence]["end"] = event.occurred_at
    return [
        (g["start"], g["end"] or g["expires"], fence, g["mode"])
        for fence, g in grants.items()
    ]


def _most_at_once(intervals, counted=lambda interval: True) -> int:
    """The most intervals open at one instant ([start, end): an end at t is
    before a start at t)."""
    points = []
    for interval in intervals:
        if counted(interval):
            points.append((interval[0], 1))
            points.append((interval[1], -1))
    points.sort(key=lambda p: (p[0], p[1]))
    most = current = 0
    for _, step in points:
        current += step
        most = max(most, current)
    return most


def _check_fences(events: list[LockEvent]) -> None:
    """Every new grant's fence is unique, and increases in grant order."""
    fences = [e.fence for e in events if e.action in ("acquired", "took_over")]
    assert fences == sorted(set(fences)), "fences not unique and increasing"


def _run_threads(target, numbers) -> list[str]:
    """Runs ``target(number)`` in a thread per number; what any of them raised."""
    errors: list[str] = []

    def run(number: int) -> None:
        try:
            target(number)
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            errors.append(f"client {number}: {exc!r}")

    threads = [threading.Thread(target=run, args=(n,)) for n in numbers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


class Run:
    """When the clients of a race stop, shared by every process of it: after
    ``seconds``, and on until ``target`` grants were counted (a loaded machine
    grants fewer per second), at most HARD_DEADLINE."""

    def __init__(self, context, seconds: float, target: int):
        self.started = context.Value("d", 0.0)
        self.granted = context.Value("i", 0)
        self.seconds = seconds
        self.target = target

    def going(self) -> bool:
        elapsed = time.time() - self.started.value
        enough = self.granted.value >= self.target
        return elapsed < HARD_DEADLINE and (elapsed < self.seconds or not enough)

    def count(self) -> None:
        with self.granted.get_lock():
            self.granted.value += 1


# -- the clients: threads of this process or of child processes ----------------


def semaphore_client(app, number: int, run: Run) -> None:
    resource, owner = "race:semaphore", f"w{number}"
    chance = random.Random(number)
    with app.app_context():
        service = lock_service()
        while run.going():
            # One grant in eight is left to expire: its holder is taken over.
            dropped = chance.random() < 0.125
            # Half the contenders wait in line, half poll.
            try:
                result = service.acquire(
                    resource,
                    owner,
                    ttl=0.2 if dropped else 30,
                    limit=LIMIT,
                    wait=5 if (number // 2) % 2 else 0,
                )
            except ServiceBusy:
                # SQLite's writer lock stayed taken past its busy timeout (32
                # writers of three processes on one file): the service's
                # answer is "try again", and a client does.
                continue
            if not result.acquired:
                continue
            if result.action.value != "reacquired":
                run.count()
            if dropped:
                continue
            service.get(resource)  # the work: one read while holding
            try:
                service.release(resource, owner)
            except LockNotFound:
                # Our short grant of an earlier round ran out meanwhile.
                pass


def reader_or_writer_client(app, number: int, run: Run) -> None:
    """Clients below READERS read (shared), the others write (exclusive);
    each at least once, however late its thread started."""
    resource = "race:rw"
    with app.app_context():
        service = lock_service()
        rounds = 0
        while rounds == 0 or run.going():
            rounds += 1
            if number < READERS:
                owner = f"r{number}"
                # Waiting in line too: behind a waiting writer, not past it.
                result = service.acquire(resource, owner, ttl=30, mode="shared", wait=2)
                if not result.acquired:
                    continue
            else:
                owner = f"w{number}"
                result = service.acquire(resource, owner, ttl=30, wait=10)
                assert result.acquired, "a waiting writer was starved"
                run.count()
            service.get(resource)
            service.release(resource, owner)


def _race_app(database_url: str, instance: str, threads: int):
    """A child's app: a connection per thread and a few more, no more (the
    server's connections are shared by every process of the race)."""
    return create_app(
        {
            "LOCKKEEPER_DATABASE_URL": database_url,
            "LOCKKEEPER_INSTANCE_PATH": instance,
            "LOCKKEEPER_BOOTSTRAP": False,
            "LOCKKEEPER_AUTO_MIGRATE": False,
            "SECRET_KEY": "test",
            **RACE_CONFIG,
            "SQLALCHEMY_ENGINE_OPTIONS": {"pool_size": threads, "max_overflow": 4},
        }
    )


def _clients_process(database_url, instance, client, numbers, run, barrier, results):
    """A child process: its own app, a thread per client number."""
    app = _race_app(database_url, instance, len(numbers))
    barrier.wait(timeout=120)
    errors = _run_threads(lambda number: client(app, number, run), numbers)
    results.put(errors)
    with app.app_context():
        db.engine.dispose()


def _race(app, database_url, client, count: int, seconds: float, target: int) -> Run:
    """Clients 0..count-1 race: the even ones threads of this process, the odd
    ones threads of PROCESSES child processes, all started together."""
    context = worker_context()
    run = Run(context, seconds, target)
    barrier = context.Barrier(PROCESSES + 1)
    results = context.Queue()
    odd = list(range(1, count, 2))
    processes = [
        context.Process(
            target=_clients_process,
            args=(
                database_url,
                app.instance_path,
                client,
                odd[p::PROCESSES],
                run,
                barrier,
                results,
            ),
        )
        for p in range(PROCESSES)
    ]
    for process in processes:
        process.start()
    errors: list[str] = []
    try:
        # Going until the clock starts below, however soon a child looks.
        run.started.value = time.time() + HARD_DEADLINE
        barrier.wait(timeout=120)  # every child has its app: go
        run.started.value = time.time()
        errors += _run_threads(
            lambda number: client(app, number, run), range(0, count, 2)
        )
        for _ in processes:
            errors += results.get(timeout=HARD_DEADLINE + 60)
    finally:
        for process in processes:
            process.join(timeout=60)
            if process.is_alive():
                process.kill()
    assert errors == []
    assert [process.exitcode for process in processes] == [0] * PROCESSES
    return run


@pytest.fixture
def app(make_app):
    return make_app(**RACE_CONFIG)


def test_32_clients_in_threads_and_processes_are_never_more_than_4_holders(
    app, database_url
):
    run = _race(
        app, database_url, semaphore_client, CONTENDERS, RUN_SECONDS, TARGET_GRANTS
    )
    events = _events(app, "race:semaphore")
    intervals = _intervals(events)
    assert run.granted.value == len(intervals) >= TARGET_GRANTS
    assert _most_at_once(intervals) <= LIMIT
    _check_fences(events)


def test_an_expired_holder_is_taken_over_once(app):
    """16 threads race for the one holder that expired beside a live one."""
    resource = "race:takeover"
    with app.app_context():
        service = lock_service()
        assert service.acquire(resource, "stays", ttl=60, limit=2).acquired
        assert service.acquire(resource, "crashed", ttl=0.3, limit=2).acquired
        deadline = time.monotonic() + 10
        while len(service.holders(resource).holders) > 1:
            assert time.monotonic() < deadline, "the short place never expired"
    barrier = threading.Barrier(16)
    won: list[str] = []

    def contender(number: int) -> None:
        with app.app_context():
            barrier.wait(timeout=30)
            result = lock_service().acquire(resource, f"c{number}", ttl=60, limit=2)
            if result.acquired:
                won.append(result.action.value)

    assert _run_threads(contender, range(16)) == []
    assert won == ["took_over"]
    events = _events(app, resource)
    taken = [e for e in events if e.action == "took_over"]
    assert [e.previous_owner for e in taken] == ["crashed"]
    assert _most_at_once(_intervals(events)) <= 2


def test_readers_and_writers_never_overlap_and_writers_are_not_starved(
    app, database_url
):
    run = _race(
        app,
        database_url,
        reader_or_writer_client,
        READERS + WRITERS,
        READ_WRITE_SECONDS,
        WRITERS,
    )
    events = _events(app, "race:rw")
    intervals = _intervals(events)
    assert {mode for *_, mode in intervals} == {"shared", "exclusive"}
    assert run.granted.value >= WRITERS
    # Every writer, in this process and in the children, was granted.
    writers = {e.owner for e in events if e.mode == "exclusive" and e.action in GRANTS}
    assert writers == {f"w{n}" for n in range(READERS, READERS + WRITERS)}
    # A writer is never with anyone else: counting writers alone, and each
    # writer against everyone, the most at once is one.
    assert _most_at_once(intervals, lambda i: i[3] == "exclusive") == 1
    for start, end, fence, mode in intervals:
        if mode != "exclusive":
            continue
        overlapping = [
            other
            for other in intervals
            if other[2] != fence and other[0] < end and start < other[1]
        ]
        assert overlapping == [], f"writer {fence} overlapped {overlapping[:3]}"
    # Readers did share the resource.
    assert _most_at_once(intervals, lambda i: i[3] == "shared") > 1
    _check_fences(events)
