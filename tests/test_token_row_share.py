"""A token far from its lock quota shares its row lock at a grant; near it, a
grant takes the row alone (PostgreSQL: migration 0011; MariaDB: the call
``lockkeeper_token_grant``, migration 0044, told by the token's last grant in
the process). Real grants of one token,
one paused inside its transaction, on the server databases (SQLite has one
writer at a time and no row locks)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest
from lockkeeper_core.errors import QuotaExceeded, TokenEnded
from lockkeeper_core.models import DistributedLock, LockEvent
from sqlalchemy import event, func, insert, select, text, update

from app.auth.models import ApiToken
from app.database import autocommit
from app.extensions import db, lock_service
from tests.conftest import ApiClient
from tests.row_waits import DEADLINE, lock_waits

locks = DistributedLock.__table__
pytestmark = [
    pytest.mark.backends("postgresql", "mariadb"),
    pytest.mark.usefixtures("backend"),
]


def _margin() -> int:
    """The server's max_connections: how many grants can be in flight at once."""
    if db.engine.dialect.name == "postgresql":
        return int(db.session.scalar(text("SHOW max_connections")))
    return int(db.session.scalar(text("SELECT @@max_connections")))


class PausedGrant:
    """A real grant of ``token`` in a thread, paused inside its transaction
    right after it locked the token's row until ``go()``: at the clock read
    that draws its fence, or on MariaDB's hot path at the statement after
    ``lockkeeper_token_grant``, the call that locks the row and draws it."""

    def __init__(self, app, resource: str, token: str, max_locks: int):
        self.app = app
        self.inside, self.release = threading.Event(), threading.Event()
        # The hot path may run on the engine's autocommit twin (app.database).
        self.engines = {db.engine, autocommit(db.engine)}
        for engine in self.engines:
            event.listen(engine, "before_cursor_execute", self._statement)
        self.pool = ThreadPoolExecutor(1)
        self.future = self.pool.submit(self._run, resource, token, max_locks)
        if not self.inside.wait(DEADLINE):
            self.future.result(timeout=0)
            raise AssertionError("the grant never reached its clock read")

    def _run(self, resource, token, max_locks):
        self.thread = threading.current_thread()
        with self.app.app_context():
            return lock_service().acquire(
                resource, "paused", token=token, max_locks=max_locks
            )

    def _statement(self, _conn, _cursor, statement, *_args):
        if threading.current_thread() is not getattr(self, "thread", None):
            return
        if "lockkeeper_token_grant" in statement:
            self.called = True
            return
        if (
            "lock_fence_seq" in statement or getattr(self, "called", False)
        ) and not self.inside.is_set():
            self.inside.set()
            assert self.release.wait(DEADLINE), "the paused grant was never let go"

    def go(self):
        self.release.set()
        try:
            return self.future.result(DEADLINE)
        finally:
            for engine in self.engines:
                event.remove(engine, "before_cursor_execute", self._statement)
            self.pool.shutdown()


@pytest.mark.backends("mariadb")
def test_a_far_tokens_grants_do_not_wait_for_each_other(app, backend):
    """Default quota (10000): a grant of the token holding its row inside its
    transaction does not hold back another new grant of the same token."""
    ApiClient(app, "shared", max_locks=10000)
    with app.app_context():
        paused = PausedGrant(app, "far:a", "shared", 10000)
        try:
            with ThreadPoolExecutor(1) as pool:
                other = pool.submit(
                    lambda: _acquire(app, "far:b", "shared", 10000)
                ).result(DEADLINE)
            assert other.acquired
            assert not paused.future.done()
        finally:
            first = paused.go()
        assert first.acquired


@pytest.mark.backends("mariadb")
def test_a_grant_near_the_quota_waits_for_the_token_grant_in_flight(app, backend):
    """Under --max-locks 2 (within max_connections of the quota) a new grant
    takes the token's row alone: it waits for the grant in flight, then counts
    it."""
    ApiClient(app, "near", max_locks=2)
    with app.app_context():
        service = lock_service()
        paused = PausedGrant(app, "near:a", "near", 2)
        pool = ThreadPoolExecutor(1)
        try:
            second = pool.submit(_acquire, app, "near:b", "near", 2)
            # (run_blocked would add a listener while the paused grant is in one)
            _wait_for_the_token_row(second)
            assert not second.done()
        finally:
            first = paused.go()
        assert first.acquired
        assert second.result(DEADLINE).acquired
        pool.shutdown()
        with pytest.raises(QuotaExceeded):
            service.acquire("near:c", "w", token="near", max_locks=2)


@pytest.mark.backends("mariadb")
def test_a_token_found_near_a_quota_above_the_margin_takes_its_row_alone(app, backend):
    """A quota above max_connections: far from it the token's grants share its
    row, but a grant whose count leaves the token within max_connections of
    it makes the token's next grant in this process take the row alone: it
    waits for the grant in flight, then counts it."""
    with app.app_context():
        margin = _margin()
        max_locks = margin + 3
        ApiClient(app, "nearing", max_locks=max_locks)
        now = datetime.now(UTC)
        db.session.execute(
            insert(locks),
            [
                {
                    "resource": f"nearing:held:{n}",
                    "owner": "o",
                    "token": "nearing",
                    "fence": 10**9 + n,
                    "acquired_at": now,
                    "expires_at": now + timedelta(hours=1),
                }
                for n in range(2)
            ],
        )
        db.session.commit()
        # Shared: 2 live locks are below max_locks - margin (3). After it, 3 are.
        assert _acquire(app, "nearing:first", "nearing", max_locks).acquired
        paused = PausedGrant(app, "nearing:a", "nearing", max_locks)
        pool = ThreadPoolExecutor(1)
        try:
            second = pool.submit(_acquire, app, "nearing:b", "nearing", max_locks)
            _wait_for_the_token_row(second)
            assert not second.done()
        finally:
            first = paused.go()
        assert first.acquired
        assert second.result(DEADLINE).acquired
        pool.shutdown()
        live = db.session.scalar(
            select(func.count()).select_from(locks).where(locks.c.token == "nearing")
        )
        assert live == 5


def test_a_quota_above_the_margin_holds_under_twenty_parallel_grants(app, backend):
    """A token 5 grants short of a quota above max_connections: twenty new
    grants at once (none of them told yet that the token is near: on MariaDB
    the first tries shared, finds it near, and is tried again alone) end with
    exactly 5 granted and 15 refused for the quota."""
    with app.app_context():
        margin = _margin()
        max_locks = margin + 10
        ApiClient(app, "crowded", max_locks=max_locks)
        now = datetime.now(UTC)
        db.session.execute(
            insert(locks),
            [
                {
                    "resource": f"crowded:held:{n}",
                    "owner": "o",
                    "token": "crowded",
                    "fence": 10**9 + n,
                    "acquired_at": now,
                    "expires_at": now + timedelta(hours=1),
                }
                for n in range(max_locks - 5)
            ],
        )
        db.session.commit()
    parallel = 20
    start = threading.Barrier(parallel)

    def grant(n: int) -> str:
        start.wait(DEADLINE)
        try:
            result = _acquire(app, f"crowded:{n}", "crowded", max_locks)
        except QuotaExceeded:
            return "over quota"
        return "granted" if result.acquired else f"refused: {result}"

    with ThreadPoolExecutor(parallel) as pool:
        answers = sorted(pool.map(grant, range(parallel)))
    assert answers == ["granted"] * 5 + ["over quota"] * 15
    with app.app_context():
        live = db.session.scalar(
            select(func.count()).select_from(locks).where(locks.c.token == "crowded")
        )
        assert live == max_locks


def test_a_shared_grant_counts_again_after_its_lock(app, backend):
    """The grant takes the token's row shared (the token is far from its quota:
    the first look, or on MariaDB a token no grant has found near); by the time
    it holds it the token has filled its quota (an exclusive holder committed a
    quota's worth of locks). The grant counts after its lock and is refused,
    not granted on what it found before."""
    with app.app_context():
        max_locks = _margin() + 10
        ApiClient(app, "filling", max_locks=max_locks)
        with db.engine.connect() as holder:
            holder.execute(
                text("SELECT 1 FROM api_tokens WHERE name = 'filling' FOR UPDATE")
            )
            pool = ThreadPoolExecutor(1)
            waiting = pool.submit(_acquire, app, "fill:new", "filling", max_locks)
            _wait_for_the_token_row(waiting)
            now = datetime.now(UTC)
            holder.execute(
                insert(locks),
                [
                    {
                        "resource": f"fill:{n}",
                        "owner": "o",
                        "token": "filling",
                        "fence": 10**9 + n,
                        "acquired_at": now,
                        "expires_at": now + timedelta(hours=1),
                    }
                    for n in range(max_locks)
                ],
            )
            holder.commit()
        with pytest.raises(QuotaExceeded):
            waiting.result(DEADLINE)
        pool.shutdown()
        live = db.session.scalar(
            select(func.count()).select_from(locks).where(locks.c.token == "filling")
        )
        assert live == max_locks


@pytest.mark.parametrize("take_over", [False, True], ids=["fresh", "take-over"])
def test_a_revocation_committed_while_a_grant_waits_for_the_token_row_is_seen(
    app, backend, take_over
):
    """A revocation holds the token's row while a new grant of the token waits
    for it (a fresh resource, or the take-over of an expired holder): once the
    revocation commits, the grant sees it where it commits, is refused and
    writes nothing. On MariaDB both wait inside ``lockkeeper_token_grant``,
    whose clock and count come after that wait."""
    resource = f"late:{'taken' if take_over else 'fresh'}"
    with app.app_context():
        ApiClient(app, "late", max_locks=10000)
        if take_over:
            now = datetime.now(UTC)
            db.session.execute(
                insert(locks).values(
                    resource=resource,
                    owner="gone",
                    token="other",
                    fence=10**9,
                    acquired_at=now - timedelta(minutes=2),
                    expires_at=now - timedelta(minutes=1),
                )
            )
            db.session.commit()
        before = _rows_and_events(resource)
        with db.engine.connect() as revoker:
            revoker.execute(
                text("SELECT 1 FROM api_tokens WHERE name = 'late' FOR UPDATE")
            )
            pool = ThreadPoolExecutor(1)
            waiting = pool.submit(_acquire, app, resource, "late", 10000)
            _wait_for_the_token_row(waiting)
            revoker.execute(
                update(ApiToken)
                .where(ApiToken.name == "late")
                .values(revoked_at=datetime.now(UTC))
            )
            revoker.commit()
        with pytest.raises(TokenEnded):
            waiting.result(DEADLINE)
        pool.shutdown()
        assert _rows_and_events(resource) == before


def _rows_and_events(resource: str) -> tuple[list, int]:
    """The resource's row as it stands and how many events it has."""
    rows = db.session.execute(
        select(locks.c.owner, locks.c.token, locks.c.fence, locks.c.expires_at).where(
            locks.c.resource == resource
        )
    ).all()
    events = db.session.scalar(
        select(func.count())
        .select_from(LockEvent)
        .where(LockEvent.resource == resource)
    )
    db.session.rollback()
    return [tuple(row) for row in rows], events


def _wait_for_the_token_row(future) -> None:
    """Return once a grant of this database waits for a token's row lock."""
    deadline = time.monotonic() + DEADLINE
    while True:
        with db.engine.connect() as conn:
            if lock_waits(conn):
                return
        assert not future.done(), f"the grant finished without waiting: {_states()}"
        assert time.monotonic() < deadline, f"no token row wait: {_states()}"
        time.sleep(0.01)


def _states() -> list:
    """Every connection's state, for a failure's message."""
    with db.engine.connect() as conn:
        if db.engine.dialect.name == "postgresql":
            sql = (
                "SELECT pid, state, wait_event_type, wait_event, left(query, 60) "
                "FROM pg_stat_activity WHERE datname = current_database()"
            )
        else:
            sql = (
                "SELECT p.id, p.db, p.command, p.state, left(p.info, 60), "
                "t.trx_state FROM information_schema.processlist AS p "
                "LEFT JOIN information_schema.innodb_trx AS t "
                "ON t.trx_mysql_thread_id = p.id"
            )
        return [tuple(row) for row in conn.execute(text(sql))]


def _acquire(app, resource: str, token: str, max_locks: int):
    with app.app_context():
        return lock_service().acquire(resource, "w", token=token, max_locks=max_locks)
