"""Sets raced by real threads on every database: workers take random
overlapping sets of 2-5 resources, named in random orders, in random modes
(one worker binds each of its sets to a session of its own, heartbeats it,
and ends every other one by ending the session; another's sets wait in line,
each granted within its wait; a third's ask to wait with their token's share
of the waiting room taken, and are turned away unless granted at once, or
wait until their client hangs up), and an operator releases the newest
granted set as one, again and again.

While they run, a reader reads every grant in one statement (one snapshot)
again and again: no reading ever shows part of a set (each set's owner is its
own, so a set is whole when every member shows it), two exclusive grants of one
resource, an exclusive grant beside a shared one, or a semaphore past its
limit. The history afterwards says the same: every set's grant events come
together, each member once, and every grant and release event names the set
its acquire answered, and no other (the operator's releases too). On
PostgreSQL and MariaDB the servers' own deadlock counters do not move
(``tests/test_deadlock_race.Deadlocks``).

The dining philosophers (5 workers, 5 forks, each taking its two neighbours
as one set) all finish their meals on PostgreSQL and MariaDB.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
from collections import Counter, defaultdict

import pytest
from lockkeeper_core.errors import ServiceBusy, WaitersFull
from lockkeeper_core.models import EXCLUSIVE, SHARED, LockEvent
from lockkeeper_core.statements.common import holders, locks
from lockkeeper_core.values import Member
from sqlalchemy import literal, select, union_all

from app.extensions import db, lock_service
from tests.test_deadlock_race import RACERS, Deadlocks

# The racers, the reader, the test's own reads and the counter's connection.
WORKERS = 8
CONNECTIONS = 16
SECONDS = float(os.environ.get("LOCKKEEPER_SET_RACE_SECONDS", "20"))
# Six locks of limit 1 (taken exclusive or shared) and two semaphores of 2.
PLAIN = [f"set:r{i}" for i in range(6)]
SEMAPHORES = {f"set:s{i}": 2 for i in range(2)}
RESOURCES = PLAIN + list(SEMAPHORES)
TTL = 60.0
# A waiting set's wait (worker 2's): a set waits for the holders ahead of it,
# whose turns a loaded machine stretches (a 10 s wait once ran out in a race
# that granted 19 sets in 20 s), so it is long; a granted wait ends at once.
WAIT = 30.0
# The API token of the sets bound to sessions (a name with no row: a label).
SESSIONS = "sessions"
# The API token whose share of the waiting room is taken (worker 3's).
CROWDED = "crowded"

pytestmark = [
    pytest.mark.usefixtures("backend"),
    pytest.mark.connections(CONNECTIONS),
    pytest.mark.slow,
]


@pytest.fixture
def set_app(make_app, backend):
    options = {"pool_size": WORKERS + 4, "max_overflow": 0}
    if backend == "postgresql":
        options["connect_args"] = {"application_name": RACERS}
    return make_app(SQLALCHEMY_ENGINE_OPTIONS=options)


def _random_set(rng: random.Random) -> list[Member]:
    chosen = rng.sample(RESOURCES, rng.randint(2, 5))  # in a random order
    return [
        Member(r, SEMAPHORES[r], EXCLUSIVE)
        if r in SEMAPHORES
        else Member(r, 1, rng.choice((EXCLUSIVE, SHARED)))
        for r in chosen
    ]


def _in_a_full_room(service, members: list[Member], owner: str):
    """A waiting set asked while its token's share of the waiting room is
    taken: its answer, or None when the room turned it away."""
    queue = service.queue
    with contextlib.ExitStack() as room:
        for _ in range(queue.max_waiters_per_token):
            room.enter_context(queue.seat(CROWDED))
        try:
            return service.acquire_set(
                members, owner, ttl=TTL, token=CROWDED, wait=WAIT
            )
        except WaitersFull:
            return None


class Reader:
    """Reads every live grant (exclusive or a holder) in one statement, one
    snapshot, over and over, and keeps what broke the rules."""

    def __init__(self, sets: dict[str, set[str]], lock: threading.Lock):
        self.sets = sets  # owner -> its set's resources (once granted)
        self.lock = lock
        self.broken: list[str] = []
        self.reads = 0

    def read_once(self) -> None:
        exclusive = select(
            locks.c.resource,
            locks.c.owner,
            locks.c.expires_at,
            locks.c.holder_limit.label("limit"),
            literal(EXCLUSIVE).label("mode"),
        ).where(locks.c.owner.is_not(None))
        holder_rows = select(
            holders.c.resource,
            holders.c.owner,
            holders.c.expires_at,
            locks.c.holder_limit.label("limit"),
            holders.c.mode,
        ).join(locks, locks.c.resource == holders.c.resource)
        with db.engine.connect() as conn:
            rows = conn.execute(union_all(exclusive, holder_rows)).all()
        self.reads += 1
        by_owner = defaultdict(set)
        by_resource = defaultdict(list)
        for row in rows:
            # Grants of this race live for TTL: none expires while it runs.
            by_owner[row.owner].add(row.resource)
            by_resource[row.resource].append(row)
        with self.lock:
            known = {owner: set(self.sets.get(owner, ())) for owner in by_owner}
        for owner, seen in by_owner.items():
            # Each worker records its set before it asks.
            if seen != known[owner]:
                self.broken.append(f"partial set of {owner}: {seen} of {known[owner]}")
        for resource, grants in by_resource.items():
            modes = Counter(g.mode for g in grants)
            limit = grants[0].limit or 1
            if modes[EXCLUSIVE] and modes[SHARED]:
                self.broken.append(f"{resource}: exclusive beside shared {grants}")
            if modes[EXCLUSIVE] > limit:
                self.broken.append(f"{resource}: {modes[EXCLUSIVE]} > {limit}")


def _race(app, workers: int, seconds: float, *, busy_answers: bool = False) -> dict:
    """``workers`` threads take random sets for ``seconds``; a reader reads.

    ``busy_answers``: SQLite may answer ``ServiceBusy`` (the API's 503) when a
    writer waited out its whole busy timeout behind the others, as on a machine
    loaded far past its cores: counted, and a release so answered is asked
    again, as a client would."""
    sets: dict[str, set[str]] = {}
    named: dict[str, str] = {}  # owner → the set id its acquire answered
    latest: list[str] = []  # the owners of the sets granted, in order
    forced: list[str] = []  # the sets the operator released
    taken: list[str] = []  # the sets whose holder found them released
    left_to_operator: dict[str, threading.Event] = {}
    record = threading.Lock()
    reader = Reader(sets, record)
    stop = threading.Event()
    counts = Counter()
    failures: list[BaseException] = []
    start = threading.Barrier(workers + 2)

    def worker(n: int) -> None:
        rng = random.Random(n)
        with app.app_context():
            service = lock_service()
            start.wait(timeout=30)
            i = 0
            while not stop.is_set():
                i += 1
                owner = f"w{n}-{i}"
                members = _random_set(rng)
                with record:
                    # Recorded before the ask: a reader that sees any member
                    # of it judges it against the whole set.
                    sets[owner] = {m.resource for m in members}
                # Worker 1 binds each of its sets to a session of its own
                # (the session's row, then the members'), heartbeats it while
                # held, and ends every other one by ending its session.
                session = None
                token = None  # the sets' API token (a label)
                try:
                    if n == 1:
                        token = SESSIONS
                        session = service.sessions.create(owner, TTL, token=SESSIONS)
                        result = service.acquire_set(
                            members, owner, token=SESSIONS, session=session.id
                        )
                    elif n == 2:
                        # Worker 2's sets wait in line: each is granted
                        # within its wait.
                        result = service.acquire_set(members, owner, ttl=TTL, wait=WAIT)
                        counts["waited"] += 1
                        if not result.acquired:
                            counts["wait ran out"] += 1
                    elif n == 3 and i % 2:
                        # Every other set of worker 3 asks to wait with its
                        # token's share of the waiting room taken: granted
                        # at its first look, or turned away writing nothing.
                        token = CROWDED
                        result = _in_a_full_room(service, members, owner)
                        if result is None:
                            counts["turned away"] += 1
                            continue
                    elif n == 3:
                        # Its others wait in line until their client hangs
                        # up, within half a second: granted by then, or they
                        # leave the lines having written nothing.
                        gone_at = time.monotonic() + rng.uniform(0, 0.5)
                        result = service.acquire_set(
                            members,
                            owner,
                            ttl=TTL,
                            wait=WAIT,
                            still_wanted=lambda t=gone_at: time.monotonic() < t,
                        )
                        if not result.acquired:
                            counts["client gone"] += 1
                    else:
                        result = service.acquire_set(members, owner, ttl=TTL)
                except ServiceBusy:
                    if not busy_answers:
                        raise
                    counts["busy"] += 1
                    if session is not None:
                        retried(lambda s=session: end(s))
                    continue
                if not result.acquired:
                    counts["refused"] += 1
                    if session is not None:
                        retried(lambda s=session: end(s))
                    continue
                counts["granted"] += 1
                counts[f"size {len(members)}"] += 1
                handed = threading.Event()
                with record:
                    named[owner] = result.set_id
                    latest.append(owner)
                    if n == 0:
                        # Worker 0 leaves its sets to the operator (the
                        # others race it to their own release).
                        left_to_operator[owner] = handed
                if n == 0:
                    while not handed.wait(0.05) and not stop.is_set():
                        pass
                if session is not None:
                    retried(
                        lambda s=session: service.sessions.heartbeat(
                            s.id, token=SESSIONS
                        )
                    )
                if session is not None and i % 2:
                    ended = retried(lambda s=session: end(s))
                    counts["ended by its session"] += 1
                    ended_here = len(ended.locks)
                else:
                    released = retried(
                        lambda m=members, o=owner, t=token: service.release_set(
                            [x.resource for x in reversed(m)], o, token=t
                        )
                    )
                    ended_here = len(released.released)
                    if session is not None:
                        retried(lambda s=session: end(s))
                # Whole, or the operator's release of the set came first
                # and took it whole.
                assert ended_here in (0, len(members)), (owner, ended_here)
                if ended_here == 0:
                    taken.append(owner)

    def retried(call):
        """``call``, asked again after a ServiceBusy (SQLite only)."""
        while True:
            try:
                return call()
            except ServiceBusy:
                if not busy_answers:
                    raise
                counts["busy"] += 1

    def end(session):
        return lock_service().sessions.end(
            session.id, token=SESSIONS, actor=session.owner
        )

    def operate() -> None:
        """An operator releasing the newest granted set as one, again and
        again: the same rows in the same order as the sets' own."""
        with app.app_context():
            service = lock_service()
            start.wait(timeout=30)
            while not stop.is_set():
                with record:
                    # The set worker 0 waits on first, else the newest.
                    pending = [
                        o for o, done in left_to_operator.items() if not done.is_set()
                    ]
                    owner = pending[-1] if pending else latest[-1] if latest else None
                if owner is None:
                    stop.wait(0.01)
                    continue
                try:
                    done = service.force_release_set(
                        named[owner], actor="op", reason="race"
                    )
                except ServiceBusy:
                    if not busy_answers:
                        raise
                    counts["busy"] += 1
                    continue
                assert len(done.released) in (0, len(sets[owner])), done
                if done.released:
                    forced.append(owner)
                    counts["force released"] += 1
                if owner in left_to_operator:
                    left_to_operator[owner].set()

    def read() -> None:
        with app.app_context():
            start.wait(timeout=30)
            while not stop.is_set():
                reader.read_once()

    def guarded(target, *args):
        try:
            target(*args)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)
            stop.set()

    threads = [
        threading.Thread(target=guarded, args=(worker, n)) for n in range(workers)
    ]
    threads.append(threading.Thread(target=guarded, args=(read,)))
    threads.append(threading.Thread(target=guarded, args=(operate,)))
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not stop.is_set():
        stop.wait(0.1)
    stop.set()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads), "a racer hung"
    assert not failures, failures
    assert not reader.broken, reader.broken[:5]
    counts["reads"] = reader.reads
    # Each set the operator released is one its holder found released.
    assert sorted(forced) == sorted(taken)
    return {"counts": counts, "sets": sets, "named": named}


def _history_is_whole(app, sets: dict[str, set[str]], named: dict[str, str]) -> int:
    """Every set's grant events: each member once, or none at all; each
    grant and release event names its owner's set, as its acquire answered."""
    with app.app_context():
        rows = db.session.execute(
            select(
                LockEvent.owner, LockEvent.resource, LockEvent.action, LockEvent.set_id
            ).where(
                LockEvent.action.in_(
                    ("acquired", "took_over", "released", "force_released")
                )
            )
        ).all()
    granted = defaultdict(list)
    released = defaultdict(list)
    for owner, resource, action, set_id in rows:
        assert set_id is not None, (owner, action)
        assert set_id == named.get(owner), (owner, action)
        ended = action in ("released", "force_released")
        (released if ended else granted)[owner].append(resource)
    for owner, resources in granted.items():
        assert sorted(resources) == sorted(sets[owner]), owner
        assert sorted(released[owner]) == sorted(resources), owner
    return len(granted)


def test_random_overlapping_sets_never_show_a_partial_set_nor_deadlock(
    set_app, backend, monkeypatch
):
    deadlocks = Deadlocks(set_app, monkeypatch) if backend != "sqlite" else None
    # SQLite: one writer at a time, each waiting its turn by sleeps (its busy
    # handler, not a queue): four writers, so none waits past its timeout.
    workers = 4 if backend == "sqlite" else WORKERS
    found = _race(set_app, workers, SECONDS, busy_answers=backend == "sqlite")
    counts = found["counts"]
    assert counts["granted"] >= 10, counts
    assert counts["refused"] >= 1, counts  # the sets met
    assert counts["reads"] >= 20, counts
    assert counts["force released"] >= 1, counts
    assert counts["ended by its session"] >= 1, counts
    assert counts["waited"] >= 1, counts
    assert counts["wait ran out"] == 0, counts
    assert counts["turned away"] >= 1, counts
    assert counts["client gone"] >= 1, counts
    whole = _history_is_whole(set_app, found["sets"], found["named"])
    assert whole == counts["granted"]
    if deadlocks is not None:
        assert deadlocks.counted() == 0, deadlocks.conflicts
        assert not deadlocks.conflicts
    print(f"{backend}: {dict(counts)}")


MEALS = 15
PHILOSOPHERS = 5


@pytest.mark.backends("postgresql", "mariadb")
def test_the_dining_philosophers_all_eat(set_app, backend, monkeypatch):
    """Each philosopher takes the forks on either side as one set, in the
    order of its own hands (the last one's are the other way round): none
    holds one fork waiting for the other, so none starves the table."""
    deadlocks = Deadlocks(set_app, monkeypatch)
    forks = [f"fork:{i}" for i in range(PHILOSOPHERS)]
    meals = Counter()
    failures: list[BaseException] = []
    start = threading.Barrier(PHILOSOPHERS)
    deadline = time.monotonic() + 120

    def philosopher(n: int) -> None:
        rng = random.Random(n)
        hands = [forks[n], forks[(n + 1) % PHILOSOPHERS]]
        with set_app.app_context():
            service = lock_service()
            start.wait(timeout=30)
            while meals[n] < MEALS:
                assert time.monotonic() < deadline, f"philosopher {n} starved"
                owner = f"p{n}"
                got = service.acquire_set([Member(f) for f in hands], owner, ttl=TTL)
                if not got.acquired:
                    # Poll with a short random backoff: sets do not wait in line.
                    time.sleep(rng.uniform(0.001, 0.01))
                    continue
                meals[n] += 1
                service.release_set(hands, owner)

    def guarded(n):
        try:
            philosopher(n)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=guarded, args=(n,)) for n in range(PHILOSOPHERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=150)
    assert not any(thread.is_alive() for thread in threads)
    assert not failures, failures
    assert all(meals[n] == MEALS for n in range(PHILOSOPHERS)), meals
    assert deadlocks.counted() == 0, deadlocks.conflicts
    assert not deadlocks.conflicts


# A database whose names sort as ICU's English does ('a' before 'B'), where
# Python's sorted() (by code point: 'B' before 'a') does not.
ICU_ENGLISH = "TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en' LOCALE 'C.UTF-8'"


@pytest.fixture
def icu_app(make_app, tmp_path):
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from tests.databases import SERVER_URLS, migrated

    admin_url = make_url(SERVER_URLS["postgresql"])
    name = f"lk_icu_{os.getpid()}_{random.randrange(16**6):06x}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name} {ICU_ENGLISH}"))
    app = None
    try:
        url = admin_url.set(database=name).render_as_string(hide_password=False)
        migrated(url, tmp_path / "migrate")
        app = make_app(
            LOCKKEEPER_DATABASE_URL=url,
            SQLALCHEMY_ENGINE_OPTIONS={
                "pool_size": 8,
                "max_overflow": 0,
                "connect_args": {"application_name": RACERS},
            },
        )
        yield app
    finally:
        if app is not None:
            # What the app counted goes to its database while it exists.
            app.extensions["lockkeeper.refusals"].stop()
            with app.app_context():
                db.engine.dispose()
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()


@pytest.mark.backends("postgresql")
def test_sets_take_rows_in_the_databases_order_whatever_its_collation(
    icu_app, monkeypatch
):
    """On a database whose collation does not sort names by code point, a
    set's renewal, its wait's join of the lines and an operator's release
    of a set lock the members' rows in the order the set functions take
    them (the database's ``ORDER BY resource``). They took them in Python's
    ``sorted`` order: a renewal of {a, B} and another worker's acquire of
    the same set deadlocked about once a second."""
    members = [Member("a"), Member("B")]
    names = ["a", "B"]
    deadlocks = Deadlocks(icu_app, monkeypatch)
    with icu_app.app_context():
        service = lock_service()
        held = service.acquire_set(members, "w-1", ttl=300)
        assert held.acquired
        until = time.monotonic() + 5
        cycles: Counter = Counter()
        failures: list[BaseException] = []

        def loop(name, call):
            while time.monotonic() < until:
                try:
                    call()
                except BaseException as exc:  # noqa: BLE001 - reported below
                    failures.append(exc)
                    return
                cycles[name] += 1

        threads = [
            threading.Thread(target=loop, args=args, daemon=True)
            for args in (
                ("renew", lambda: service.renew_set(names, "w-1", ttl=300)),
                ("acquire", lambda: service.acquire_set(members, "w-2", ttl=30)),
                (
                    "wait",
                    lambda: service.acquire_set(members, "w-3", ttl=30, wait=0.05),
                ),
            )
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
            assert not thread.is_alive()
        released = service.force_release_set(held.set_id, actor="op", reason="end")
        assert [lock.resource for lock in released.released] == ["B", "a"]
    assert not failures, failures
    assert min(cycles.values()) > 0, cycles
    assert deadlocks.counted() == 0, deadlocks.conflicts
