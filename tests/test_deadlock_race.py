"""The lock order (``lockkeeper_core.statements``) raced: operations that meet on one
resource, run by real threads against PostgreSQL and MariaDB, and the servers'
own deadlock counters read around them. The issue's readers and writers (one
token), and every pair of exclusive, shared and semaphore acquires, renew,
release, a session's create, heartbeat and end, an operator's force-release and
claim, and the guard, each pair under one token and under two at once.

PostgreSQL counts deadlocks per database (``pg_stat_database.deadlocks``), and
each test has a database of its own: the count must not move. A backend
reports its counts when it goes idle (at most once a second) or exits, so the
app's connections are closed and their backends gone before the count is read.

MariaDB counts them for the whole server (``Innodb_deadlocks``), which other
sessions share. The count must not move, unless every deadlock it counted was
someone else's: the newest one the server describes (``SHOW ENGINE INNODB
STATUS``) names no table of this test's database, and no transaction of this
test was chosen as a deadlock's victim (the service retries those: the race
counts every conflict the service's retry saw, and every one the guard's own
transactions met). On today's main neither can hold for a deadlock of ours.

Every answer here is non-blocking. A deadlock is read from the counts, not
from the time: a bound of four times the same calls made one after another
failed a clean race on a loaded machine (1.16 s against 1.0 s), where the
scheduler, not a cycle, made a racer wait. The time only catches a racer
stuck far longer than any queue for one row takes (``HUNG``).
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from lockkeeper_core import transactions
from lockkeeper_core.errors import (
    LimitMismatch,
    LockExpired,
    LockHeld,
    LockNotFound,
    NotOwner,
    SessionBound,
    SessionExpired,
    UnknownSession,
)
from lockkeeper_core.models import DistributedLock
from sqlalchemy import create_engine, insert, text
from sqlalchemy.exc import DBAPIError

from app.auth.models import ApiToken
from app.auth.service import create_token
from app.extensions import db, lock_service
from tests.row_waits import DEADLINE, RowHolder, run_blocked

locks = DistributedLock.__table__

# The app's pool (16 racers at most, and the test's own reads) and the
# counter's connection.
CONNECTIONS = 22
pytestmark = [
    pytest.mark.backends("postgresql", "mariadb"),
    pytest.mark.usefixtures("backend"),
    pytest.mark.connections(CONNECTIONS),
]

# Far longer than a queue of 16 racers for one row takes on a loaded machine
# (the slowest seen: 1.2 s): an answer this slow waited on something else.
HUNG = 10.0
# The app's connections to PostgreSQL go by this name: their backends must
# be gone (and so have reported their counts) before the count is read.
RACERS = "deadlock-race"


class Deadlocks:
    """The server's deadlock count for ``app``'s database, read before and
    after a race (``counted``); ``conflicts`` counts what this process's
    transactions met (the service's retries, and the guard's: ``met``)."""

    def __init__(self, app, monkeypatch):
        self.app = app
        with app.app_context():
            self.url = db.engine.url
            self.database = db.engine.url.database
        self.backend = self.url.get_backend_name()
        self.admin = create_engine(self.url, isolation_level="AUTOCOMMIT")
        self.conflicts = Counter()
        self.during = None  # what the race is at (a pair), for the report
        self._is_conflict = transactions.is_conflict
        monkeypatch.setattr(transactions, "is_conflict", self.met)
        self.before = self._read()

    def met(self, exc: BaseException) -> bool:
        """Whether ``exc`` is a deadlock or a lock-wait timeout, counted if so
        (the service's retries ask through here; so do the guard's calls)."""
        found = self._is_conflict(exc)
        if found:
            code = getattr(exc.orig, "sqlstate", None) or exc.orig.args[0]
            self.conflicts[self.during, code] += 1
        return found

    def _read(self) -> int:
        with self.admin.connect() as conn:
            if self.backend == "postgresql":
                conn.execute(text("SELECT pg_stat_clear_snapshot()"))
                return conn.execute(
                    text(
                        "SELECT deadlocks FROM pg_stat_database"
                        " WHERE datname = current_database()"
                    )
                ).scalar_one()
            return int(
                conn.execute(text("SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'")).one()[
                    1
                ]
            )

    def _latest_is_ours(self) -> bool:
        with self.admin.connect() as conn:
            status = conn.execute(text("SHOW ENGINE INNODB STATUS")).one()[2]
        latest = re.search(
            r"LATEST DETECTED DEADLOCK\n-+\n(.*?)\n-{8,}\n[A-Z]", status, re.S
        )
        return latest is not None and f"`{self.database}`." in latest.group(1)

    def counted(self) -> int:
        """Deadlocks of this test's database since the start."""
        with self.app.app_context():
            db.engine.dispose()
        if self.backend == "postgresql":
            deadline = time.monotonic() + 10
            with self.admin.connect() as conn:
                while left := conn.execute(
                    text(
                        "SELECT count(*) FROM pg_stat_activity"
                        " WHERE datname = current_database()"
                        " AND application_name = :racers"
                    ),
                    {"racers": RACERS},
                ).scalar_one():
                    assert time.monotonic() < deadline, f"{left} racers connected"
                    time.sleep(0.05)
            return self._read() - self.before
        moved = self._read() - self.before
        if moved and not self._latest_is_ours() and not sum(self.conflicts.values()):
            return 0  # other sessions' deadlocks, none of them ours
        return moved


class Answers:
    """Each call's answer and the slowest of them, from any thread."""

    def __init__(self):
        self.counts = Counter()
        self.slowest = 0.0
        self.slowest_call = None
        self._lock = threading.Lock()

    def record(self, name: str, call) -> None:
        started = time.monotonic()
        try:
            answer = call()
        except Exception as exc:  # noqa: BLE001 - every answer is counted
            answer = type(exc).__name__
        took = time.monotonic() - started
        with self._lock:
            self.counts[name, answer] += 1
            if took > self.slowest:
                self.slowest, self.slowest_call = took, name


def race(app, calls) -> None:
    """Run ``calls`` (callables) at once, each in a thread with the app's
    context, released together."""
    start = threading.Barrier(len(calls))
    failures = []

    def run(call):
        try:
            with app.app_context():
                start.wait(timeout=30)
                call()
        except Exception as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(call,)) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads), "a racer hung"
    assert not failures, failures


@pytest.fixture
def race_app(make_app, backend):
    options = {"pool_size": 20, "max_overflow": 0}
    if backend == "postgresql":
        options["connect_args"] = {"application_name": RACERS}
    # A share of sessions so large that no race meets it, but in force: a
    # session's create locks its token's row.
    app = make_app(
        SQLALCHEMY_ENGINE_OPTIONS=options, LOCKKEEPER_MAX_SESSIONS_PER_TOKEN=10_000
    )
    with app.app_context():
        create_token("one")
        create_token("two")
    return app


def quota(app, token: str) -> int:
    with app.app_context():
        return db.session.scalars(
            db.select(ApiToken.max_locks).where(ApiToken.name == token)
        ).one()


def test_one_tokens_readers_and_writers_never_deadlock(race_app, backend, monkeypatch):
    # Issue 43: one token, a resource held shared, rounds of 8 shared and 8
    # exclusive non-blocking acquires. The exclusive statement locked the
    # token's row then the resource's, the shared one the other way round:
    # 128 deadlocks in 96 requests, the slowest answer 32.7 s.
    resource, max_locks = "rw:job", quota(race_app, "one")
    with race_app.app_context():
        lock_service().acquire(
            resource, "reader", ttl=60, token="one", max_locks=max_locks, mode="shared"
        )
    deadlocks = Deadlocks(race_app, monkeypatch)
    answers = Answers()

    def acquire(owner: str, mode: str):
        def call():
            return (
                lock_service()
                .acquire(
                    resource, owner, ttl=60, token="one", max_locks=max_locks, mode=mode
                )
                .acquired
            )

        return lambda: answers.record(mode, call)

    def round_of_calls():
        return [acquire(f"r-{n}", "shared") for n in range(8)] + [
            acquire(f"w-{n}", "exclusive") for n in range(8)
        ]

    def readers_leave():
        with race_app.app_context():
            for n in range(8):
                lock_service().release(resource, f"r-{n}", token="one")

    rounds = 4
    for _ in range(rounds):
        race(race_app, round_of_calls())
        readers_leave()
    assert answers.counts == {
        ("shared", True): 8 * rounds,
        ("exclusive", False): 8 * rounds,
    }
    assert deadlocks.counted() == 0, deadlocks.conflicts
    assert not deadlocks.conflicts
    assert answers.slowest < HUNG, answers.slowest_call


# -- every pair of operations that meet on one resource ----------------------

RESOURCE = "race:pairs"
OPERATIONS = (
    "exclusive",
    "shared",
    "semaphore",
    "renew",
    "release",
    "create_session",
    "heartbeat",
    "end",
    "force_release",
    "claim",
    "guard",
)
PAIRS = [
    (first, second) for n, first in enumerate(OPERATIONS) for second in OPERATIONS[n:]
]


class Meeting:
    """The resource's state every pair meets on, set up anew before each pair:
    under each token a session with a shared grant bound to it, and a plain
    shared grant (whose fence the guard is given)."""

    def __init__(self, app, deadlocks: Deadlocks):
        self.app = app
        self.deadlocks = deadlocks
        self.sessions: dict[str, str] = {}
        self.fence = 0

    def set_up(self) -> None:
        service = lock_service()
        try:
            service.force_release_all(RESOURCE, actor="op", reason="next pair")
        except LockNotFound:
            pass
        for token in ("one", "two"):
            session = service.sessions.create(f"bound-{token}", 60, token=token)
            self.sessions[token] = session.id
            service.acquire(
                RESOURCE, f"bound-{token}", token=token,
                session=session.id, mode="shared",
            )  # fmt: skip
            plain = service.acquire(
                RESOURCE, f"plain-{token}", ttl=60, token=token,
                mode="shared",
            )  # fmt: skip
            self.fence = plain.lock.fence

    def call(self, operation: str, token: str, n: int):
        """The work of ``operation`` under ``token`` (its ``n``-th racer)."""
        service = lock_service()
        session = self.sessions[token]
        return {
            "exclusive": lambda: service.acquire(
                RESOURCE, f"w-{token}-{n}", ttl=60, token=token
            ),
            "shared": lambda: service.acquire(
                RESOURCE, f"r-{token}-{n}", ttl=60, token=token, mode="shared"
            ),
            "semaphore": lambda: service.acquire(
                RESOURCE, f"s-{token}-{n}", ttl=60, token=token, limit=3
            ),
            "renew": lambda: service.renew(
                RESOURCE, f"plain-{token}", ttl=60, token=token
            ),
            "release": lambda: service.release(RESOURCE, f"plain-{token}", token=token),
            # Under a share of sessions: the token's row alone, then an insert.
            "create_session": lambda: service.sessions.create(
                f"new-{token}-{n}", 60, token=token
            ),
            "heartbeat": lambda: service.sessions.heartbeat(session, token=token),
            "end": lambda: service.sessions.end(session, token=token, actor=None),
            "force_release": lambda: service.force_release_all(
                RESOURCE, actor="op", reason="race"
            ),
            "claim": lambda: service.claim(
                RESOURCE, f"op-{n}", 60, actor="op", reason="race", force=True
            ),
            "guard": self._guard,
        }[operation]

    def _guard(self) -> None:
        """A guarded write's transaction, committed (or rolled back when the
        guard refuses)."""
        with db.engine.connect() as conn:
            verb = "SELECT" if conn.dialect.name == "postgresql" else "CALL"
            try:
                conn.execute(
                    text(f"{verb} lockkeeper_guard(:resource, :fence)"),
                    {"resource": RESOURCE, "fence": self.fence},
                )
                conn.commit()
            except DBAPIError as exc:
                conn.rollback()
                if self.deadlocks.met(exc):
                    raise


EXPECTED_REFUSALS = (
    LockHeld,
    LimitMismatch,
    LockNotFound,
    LockExpired,
    NotOwner,
    UnknownSession,
    SessionExpired,
    SessionBound,
    DBAPIError,  # the guard's refusals (LK001-LK003); conflicts fail below
)


# What leaves the resource as the next pair should not find it (a grant or a
# session gone): the meeting is set up again after a pair with one of these.
CHANGING = frozenset({"release", "end", "force_release", "claim"})


def test_no_two_operations_deadlock_on_one_resource(race_app, monkeypatch):
    # Each pair races two of the first under one token against one of the
    # second under the same token and one under the other token.
    deadlocks = Deadlocks(race_app, monkeypatch)
    meeting = Meeting(race_app, deadlocks)
    answers = Answers()

    def racer(operation: str, token: str, n: int):
        def run():
            work = meeting.call(operation, token, n)
            try:
                work()
            except EXPECTED_REFUSALS:
                pass

        return lambda: answers.record(operation, run)

    changed = True
    for first, second in PAIRS:
        if changed:
            with race_app.app_context():
                meeting.set_up()
        deadlocks.during = (first, second)
        race(
            race_app,
            [racer(first, "one", 0), racer(first, "one", 1)]
            + [racer(second, "one", 2), racer(second, "two", 3)],
        )
        changed = bool(CHANGING & {first, second})
    failed = {key: count for key, count in answers.counts.items() if key[1]}
    assert not failed, failed
    assert deadlocks.counted() == 0, deadlocks.conflicts
    assert not deadlocks.conflicts
    assert answers.slowest < HUNG, answers.slowest_call


# -- the operator's stale sweep and a path that locks several rows -----------


def test_a_stale_release_takes_its_rows_in_the_lock_order(race_app, monkeypatch):
    """``release_stale`` locks its batch by name in resource order, as every
    path that locks several rows does (a set's acquire, a purge). It locked
    them as the statement that found them scanned them: on MariaDB, when the
    stale rows are few among live ones, through (expires_at, resource), sorted
    after the locks. Here ``sweep:b`` ran out before ``sweep:a``: the sweep
    held b and waited for a while a set's acquire, holding a, asked for b (a
    deadlock; PostgreSQL locks rows once it has sorted them)."""
    now = datetime.now(UTC)

    def grant(name: str, n: int, expires_at: datetime) -> dict:
        return {
            "resource": name,
            "owner": "w",
            "token": "one",
            "fence": 10**9 + n,
            "acquired_at": now - timedelta(minutes=5),
            "expires_at": expires_at,
        }

    with race_app.app_context():
        live = now + timedelta(hours=1)
        db.session.execute(
            insert(locks),
            [grant(f"busy:{n:03}", n, live) for n in range(300)]
            + [
                grant("sweep:a", 300, now - timedelta(minutes=1)),
                grant("sweep:b", 301, now - timedelta(minutes=2)),
            ],
        )
        db.session.commit()
    deadlocks = Deadlocks(race_app, monkeypatch)
    with race_app.app_context():
        service = lock_service()
        # A set's acquire of both, in resource order: a, then (below) b.
        with RowHolder(service, "sweep:a") as set_acquire:
            sweep = run_blocked(
                service, lambda: service.release_stale(actor="op", reason="race")
            )
            set_acquire.finish(
                lambda conn: service.core.transactional.lock_row(
                    conn, "sweep:b", service.core.given_now()
                )
            )
        released = sweep.result(DEADLINE)
    assert sorted(lock.resource for lock in released) == ["sweep:a", "sweep:b"]
    assert deadlocks.counted() == 0, deadlocks.conflicts
    assert not deadlocks.conflicts
