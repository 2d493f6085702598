"""How many statements and commits each hot-path operation sends, per database.

These numbers are the round-trip tables of docs/locking.md; a change that adds a
query to acquire, renew or release fails here first.
"""

from __future__ import annotations

from collections import Counter

import pytest
from sqlalchemy import event, text

from app.database import autocommit
from app.extensions import db, lock_service

pytestmark = pytest.mark.usefixtures("backend")

# (statements, commits) per operation and database, as an API token with a lock
# quota (the default for new tokens) makes them. SQLite's statements include its
# BEGIN IMMEDIATE (in-process calls, not network round trips).
EXPECTED = {
    "postgresql": {
        "acquire new": (1, 0),
        "acquire free row": (1, 0),
        "reacquire": (1, 0),
        "refused acquire": (1, 0),
        "renew": (1, 0),
        "release": (1, 0),
    },
    # The clock is read in its own statement after the locking read (MariaDB
    # evaluates UTC_TIMESTAMP(6) when a statement starts, before it waits for the
    # row lock); a grant's fence comes in that same statement.
    "mariadb": {
        # locking read, one call (lockkeeper_token_grant: the token's row
        # lock, then the clock, the quota count and nextval, which must follow
        # it), insert, event
        "acquire new": (4, 1),
        # the same, with an update
        "acquire free row": (4, 1),
        "reacquire": (4, 1),  # locking read, clock, update, event
        "refused acquire": (2, 1),  # locking read, clock
        "renew": (4, 1),
        "release": (4, 1),
    },
    "sqlite": {
        # BEGIN IMMEDIATE, read, quota count (no clock read to ride on), the
        # token's row, counter, insert, event
        "acquire new": (7, 1),
        # the quota count rides on the read; the token's row
        "acquire free row": (6, 1),
        "reacquire": (4, 1),
        "refused acquire": (2, 1),
        "renew": (4, 1),
        "release": (4, 1),
    },
}
TOKEN = {"token": "rt", "max_locks": 10000}
OTHER = {"token": "rt-2", "max_locks": 10000}


class RoundTrips:
    """Counts what reaches the driver through the engine and its autocommit twin
    (where single statements and PostgreSQL's hot path run)."""

    def __init__(self, engine):
        self.counts = Counter()
        for each in {engine, autocommit(engine)}:
            event.listen(each, "before_cursor_execute", self._statement)
            event.listen(each, "commit", self._commit)

    def _statement(self, *_args):
        self.counts["statements"] += 1

    def _commit(self, *_args):
        self.counts["commits"] += 1

    def measure(self, operation) -> tuple[int, int]:
        self.counts.clear()
        operation()
        return self.counts["statements"], self.counts["commits"]


def test_hot_path_round_trips_stay_as_documented(app, backend):
    """On the production clock: the database's (PostgreSQL, MariaDB)."""
    with app.app_context():
        service = lock_service()
        trips = RoundTrips(db.engine)
        measured = {
            "acquire new": trips.measure(
                lambda: service.acquire("rt:1", "w-1", **TOKEN)
            ),
            "reacquire": trips.measure(lambda: service.acquire("rt:1", "w-1", **TOKEN)),
            # The same owner under another token is another holder.
            "refused acquire": trips.measure(
                lambda: service.acquire("rt:1", "w-1", **OTHER)
            ),
            "renew": trips.measure(lambda: service.renew("rt:1", "w-1", token="rt")),
            "release": trips.measure(
                lambda: service.release("rt:1", "w-1", token="rt")
            ),
            "acquire free row": trips.measure(
                lambda: service.acquire("rt:1", "w-2", **OTHER)
            ),
        }
    assert measured == EXPECTED[backend]


def test_a_full_quota_costs_reacquire_and_renew_nothing(app, backend):
    """With the token's quota full, a new grant is refused, and its re-acquire and
    renewal of a lock it holds still pass in the documented round trips."""
    from lockkeeper_core.errors import QuotaExceeded

    with app.app_context():
        service = lock_service()
        full = {"token": "rt", "max_locks": 1}
        assert service.acquire("rt:1", "w-1", **full).acquired
        with pytest.raises(QuotaExceeded):
            service.acquire("rt:2", "w-1", **full)
        trips = RoundTrips(db.engine)
        measured = {
            "reacquire": trips.measure(lambda: service.acquire("rt:1", "w-1", **full)),
            "renew": trips.measure(lambda: service.renew("rt:1", "w-1", token="rt")),
        }
    expected = EXPECTED[backend]
    assert measured == {"reacquire": expected["reacquire"], "renew": expected["renew"]}


def _row_state(resource: str):
    """Everything a write or a row lock would change (PostgreSQL's xmin/xmax)."""
    with db.engine.connect() as conn:
        if db.engine.dialect.name == "postgresql":
            row = conn.execute(
                text(
                    "SELECT xmin::text, xmax::text, ctid::text, owner, fence, "
                    "expires_at FROM distributed_locks WHERE resource = :r"
                ),
                {"r": resource},
            ).one()
            sequence = conn.scalar(text("SELECT last_value FROM lock_fence_seq"))
        else:
            row = conn.execute(
                text(
                    "SELECT owner, fence, acquired_at, expires_at "
                    "FROM distributed_locks WHERE resource = :r"
                ),
                {"r": resource},
            ).one()
            sequence = None
        events = conn.scalar(text("SELECT count(*) FROM lock_events"))
    return tuple(row), sequence, events


def test_refused_acquire_writes_and_locks_nothing(fake_app, clock):
    """On PostgreSQL the row keeps its xmin (not rewritten), its xmax (not even
    locked), its ctid, and the fence sequence does not move."""
    with fake_app.app_context():
        service = lock_service()
        service.acquire("rt:held", "w-1", ttl=60)
        before = _row_state("rt:held")
        for _ in range(5):
            assert not service.acquire("rt:held", "w-2").acquired
        assert _row_state("rt:held") == before


def test_a_full_semaphore_refuses_without_locking_or_writing(fake_app, clock):
    """The plain look before the holders' row lock (on PostgreSQL inside the
    holder's function): refused contenders of a full semaphore never lock its
    row, write, or draw a fence."""
    with fake_app.app_context():
        service = lock_service()
        for owner in ("w-1", "w-2"):
            assert service.acquire("rt:full", owner, ttl=60, limit=2).acquired
        before = _row_state("rt:full")
        for _ in range(5):
            refused = service.acquire("rt:full", "w-3", ttl=60, limit=2)
            assert not refused.acquired
            assert refused.lock.owner == "w-1"  # the holder that ends first
        assert _row_state("rt:full") == before


# A session's heartbeat renews the session and every grant bound to it: one
# statement on PostgreSQL, whatever the number of grants.
HEARTBEAT = {
    "postgresql": (1, 0),
    # locking read of the session, clock, update of the session, its
    # resources (a plain read of its grants' and of its holders'), their rows
    # locked in resource order (the lock order), update of its grants, of its
    # holders' resources (places_until), of its holders
    "mariadb": (9, 1),
    # BEGIN IMMEDIATE and the same, the host's clock read in Python
    "sqlite": (6, 1),
}


def test_a_heartbeat_of_fifty_grants_is_one_round_trip_on_postgresql(app, backend):
    with app.app_context():
        service = lock_service()
        session = service.sessions.create("w-1", 30, token="rt")
        for n in range(50):
            granted = service.acquire(
                f"rt:{n}", "w-1", session=session.id, token="rt", max_locks=10000
            )
            assert granted.acquired
        trips = RoundTrips(db.engine)
        measured = trips.measure(
            lambda: service.sessions.heartbeat(session.id, token="rt")
        )
        assert len(service.sessions.get(session.id, token="rt").locks) == 50
    assert measured == HEARTBEAT[backend]


# The holders path (a semaphore's holders, shared grants): on PostgreSQL one
# statement (migration 0021); elsewhere one transaction, before which a plain
# read refuses a semaphore already full of others. A resource with no row yet
# gets it with its first grant (migration 0029): the transaction reads its line
# (no row carries it) and inserts the row, where the plain read inserted it.
# (statements, commits) per operation.
HOLDERS_EXPECTED = {
    # the function: its plain look, then the row lock and the decision
    "postgresql": {
        "holder first grant": (1, 0),  # the function inserts the missing row
        "place grant": (1, 0),
        "place reacquire": (1, 0),
        "place refused (full)": (1, 0),  # the plain look alone, inside it
        # the exclusive statement first (the hot path), then the holder's
        # (migration 0022)
        "place renew": (2, 0),
        "place release": (2, 0),
        "shared grant": (1, 0),
    },
    # the plain read (the row; then its live holders), then the transaction:
    # locking read, clock, holders, the token's row, freeze, quota count, fence,
    # insert, update of the row's places_until, event; COMMIT. Renew and
    # release: the exclusive attempt a transaction of its own (2 statements),
    # then the holder's: locking read, clock, holders, update, update, event.
    "mariadb": {
        "holder first grant": (13, 1),  # the line's read, the row's insert
        "place grant": (12, 1),
        "place reacquire": (8, 1),
        "place refused (full)": (2, 0),
        "place renew": (8, 2),
        "place release": (8, 2),
        "shared grant": (13, 1),  # a first grant too
    },
    # SQLite's clock is the host's; BEGIN IMMEDIATE counts
    "sqlite": {
        "holder first grant": (14, 1),
        "place grant": (14, 1),
        "place reacquire": (10, 1),
        "place refused (full)": (4, 0),
        "place renew": (8, 2),
        "place release": (8, 2),
        "shared grant": (14, 1),
    },
}


def test_holders_round_trips_stay_as_documented(app, backend):
    with app.app_context():
        service = lock_service()
        trips = RoundTrips(db.engine)
        sem = {"limit": 2, **TOKEN}
        measured = {
            "holder first grant": trips.measure(
                lambda: service.acquire("rt:sem", "w-1", **sem)
            ),
            "place grant": trips.measure(
                lambda: service.acquire("rt:sem", "w-2", **sem)
            ),
            "place reacquire": trips.measure(
                lambda: service.acquire("rt:sem", "w-2", **sem)
            ),
            "place refused (full)": trips.measure(
                lambda: service.acquire("rt:sem", "w-3", **sem)
            ),
            "place renew": trips.measure(
                lambda: service.renew("rt:sem", "w-1", token="rt")
            ),
            "place release": trips.measure(
                lambda: service.release("rt:sem", "w-1", token="rt")
            ),
            "shared grant": trips.measure(
                lambda: service.acquire("rt:rw", "w-1", mode="shared", **TOKEN)
            ),
        }
    assert measured == HOLDERS_EXPECTED[backend]


# An overview request (a viewer's page, no search): its statements, how many of
# them read the database's clock, and how many evaluate the holder-held
# resources (a window over every live holder). The page is judged at one
# instant, read once, and the holder-held resources are read by the counts
# (with the contended count) and by the listing, never more.
OVERVIEW_EXPECTED = {
    # the viewer, the clock, the counts with the contended count, the newest
    # event, the lines' version, the listing, the freezes
    "postgresql": {"statements": 7, "clock reads": 1, "holder-held reads": 2},
    "mariadb": {"statements": 7, "clock reads": 1, "holder-held reads": 2},
    # SQLite's clock is the host's: no statement reads it; two BEGINs (in
    # process, no round trip).
    "sqlite": {"statements": 8, "clock reads": 0, "holder-held reads": 2},
}


def test_an_overview_reads_the_clock_once_and_the_holder_held_resources_twice(
    app, backend
):
    from tests.dashboard_helpers import log_in, make_user

    with app.app_context():
        service = lock_service()
        service.acquire("rt:alone", "w-1", **TOKEN)
        service.acquire("rt:sem", "w-1", limit=2, **TOKEN)
        service.acquire("rt:sem", "w-2", limit=2, **TOKEN)
        service.acquire("rt:rw", "w-3", mode="shared", **TOKEN)
        # The statement the service reads the database's clock with (none on
        # SQLite).
        read_now = getattr(service.core.transactional, "_read_now", None)
        clock_sql = (
            None
            if read_now is None
            else str(read_now.compile(dialect=db.engine.dialect))
        )
        make_user(app, "rt-viewer", "viewer")
        client = app.test_client()
        assert log_in(client, "rt-viewer").status_code == 303
        sent: list[str] = []
        # SQLite's autocommit engine is the engine with other options: it
        # shares the engine's pool and listeners (listening to both would
        # count each statement twice).
        engines = [db.engine]
        if autocommit(db.engine).pool is not db.engine.pool:
            engines.append(autocommit(db.engine))
        for each in engines:
            event.listen(
                each,
                "before_cursor_execute",
                lambda _conn, _cursor, statement, *_rest: sent.append(statement),
            )
    page = client.get("/")
    assert page.status_code == 200
    assert "rt:sem" in page.get_data(as_text=True)
    measured = {
        "statements": len(sent),
        "clock reads": sum(statement == clock_sql for statement in sent),
        "holder-held reads": sum("live_holders" in statement for statement in sent),
    }
    assert measured == OVERVIEW_EXPECTED[backend]


# A set of three (exclusive, shared, a semaphore's holder) on rows that exist:
# (statements, commits) of its acquire and of its release, per database.
SET_EXPECTED = {
    # PostgreSQL: each is one autocommit statement (lockkeeper_acquire_set,
    # migration 0041: the rows locked at once, the clock, each member's
    # lockkeeper_acquire_place, the set named on its events;
    # lockkeeper_release_set, migration 0042: the rows locked at once, each
    # member's lockkeeper_release, else its lockkeeper_release_place, the set
    # its grant was made by named on the event that ends it). Elsewhere the
    # rows locked, the clock, the token's row, then each member's statements
    # in the set's transaction; a release: each member's release statement (a
    # holder's after the exclusive one that found none). Each then names the
    # set on the members' newest events (the events found, then named by key,
    # and a release first finds which set the grants were made by).
    "postgresql": {"acquire set of 3": (1, 0), "release set of 3": (1, 0)},
    # The transactional holders path for each member (about 8 statements).
    "mariadb": {"acquire set of 3": (33, 1), "release set of 3": (23, 1)},
    "sqlite": {"acquire set of 3": (33, 1), "release set of 3": (19, 1)},
}


def test_a_set_of_three_costs_as_documented(app, backend):
    from lockkeeper_core.values import Member

    members = [Member("rt:a"), Member("rt:b", 1, "shared"), Member("rt:c", 3)]
    names = [m.resource for m in members]
    with app.app_context():
        service = lock_service()
        # The rows exist (a first grant inserts them).
        assert service.acquire_set(members, "w-1", **TOKEN).acquired
        service.release_set(names, "w-1", token="rt")
        trips = RoundTrips(db.engine)
        measured = {
            "acquire set of 3": trips.measure(
                lambda: service.acquire_set(members, "w-1", **TOKEN)
            ),
            "release set of 3": trips.measure(
                lambda: service.release_set(names, "w-1", token="rt")
            ),
        }
    assert measured == SET_EXPECTED[backend]


# Joining a waiting line, with what the acquire asks for: (statements, commits).
JOIN = {
    # the clock, the line's lapsed places dropped, the place inserted
    "postgresql": (3, 1),
    "mariadb": (3, 1),
    # BEGIN IMMEDIATE, then the same (the host's clock read in Python)
    "sqlite": (3, 1),
}


def test_a_place_in_line_is_written_with_its_mode_by_the_insert_that_enqueues(
    app, backend
):
    """The mode and limit a waiting acquire asks for ride on the statement that
    puts it in line: joining costs the round trips it did before they were
    recorded."""
    inserts = []

    def seen(_conn, _cursor, statement, parameters, _context, _many):
        if statement.lstrip().upper().startswith("INSERT INTO LOCK_WAITERS"):
            inserts.append((statement, parameters))

    with app.app_context():
        service = lock_service()
        event.listen(db.engine, "before_cursor_execute", seen)
        try:
            trips = RoundTrips(db.engine)
            measured = trips.measure(
                lambda: service.queue.join(
                    "rt:q", "w-1", None, 5, limit=3, mode="exclusive"
                )
            )
        finally:
            event.remove(db.engine, "before_cursor_execute", seen)
    assert measured == JOIN[backend]
    ((statement, parameters),) = inserts
    assert "mode" in statement
    assert "holder_limit" in statement
    values = list(parameters.values() if isinstance(parameters, dict) else parameters)
    assert "exclusive" in values
    assert 3 in values
