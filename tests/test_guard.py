"""The guard (migration 0008): a fence check inside the caller's own transaction
on PostgreSQL and MariaDB, holding the grant's row with a shared lock until that
transaction ends, so every path that ends or changes the grant waits for it.

The service runs on a fake clock that starts at the database's time: moving it
past a grant's ttl makes the service see the grant expired while the database's
clock (the guard's) still sees it valid, which is the moment of a real take-over
of a grant whose guarded transaction is still open, without sleeping through a
ttl. The real-time races, with stopped processes, are in test_guard_races.py.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest
from lockkeeper_core.values import Ask
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from app.extensions import db, lock_service
from app.factory import upgrade_schema
from tests.clock import FakeClock
from tests.databases import downgrade_schema
from tests.row_waits import RowHolder, run_blocked

RESOURCE = "guard:job"
pytestmark = [
    pytest.mark.backends("postgresql", "mariadb"),
    pytest.mark.usefixtures("backend"),
]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(datetime.now(UTC))


@pytest.fixture
def guarded_app(make_app, clock):
    app = make_app(LOCKKEEPER_CLOCK=clock)
    with app.app_context():
        yield app


def guard(conn, resource: str, fence: int) -> None:
    verb = "SELECT" if conn.dialect.name == "postgresql" else "CALL"
    conn.execute(
        text(f"{verb} lockkeeper_guard(:resource, :fence)"),
        {"resource": resource, "fence": fence},
    )


def refusal(conn, resource: str, fence: int) -> tuple[str, str]:
    """(SQLSTATE, message) of a guard that fails; the transaction is rolled back."""
    with pytest.raises(DBAPIError) as failed:
        guard(conn, resource, fence)
    if conn.dialect.name == "postgresql":
        error = failed.value.orig
        found = (error.sqlstate, error.diag.message_primary)
    else:
        # PyMySQL reports the error number (1644) and message, not the SQLSTATE:
        # the server's diagnostics area still holds it.
        assert failed.value.orig.args[0] == 1644
        conn.exec_driver_sql(
            "GET DIAGNOSTICS CONDITION 1 @state = RETURNED_SQLSTATE,"
            " @message = MESSAGE_TEXT"
        )
        found = tuple(conn.exec_driver_sql("SELECT @state, @message").one())
    conn.rollback()
    return found


def _guards(app) -> int:
    with db.engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            sql = "SELECT count(*) FROM pg_proc WHERE proname = 'lockkeeper_guard'"
        else:
            sql = (
                "SELECT count(*) FROM information_schema.routines"
                " WHERE routine_schema = DATABASE()"
                " AND routine_name = 'lockkeeper_guard'"
            )
        return conn.exec_driver_sql(sql).scalar()


def test_the_guard_comes_and_goes_with_its_migration(guarded_app):
    assert _guards(guarded_app) == 1
    downgrade_schema("0007")
    assert _guards(guarded_app) == 0
    upgrade_schema(guarded_app)
    assert _guards(guarded_app) == 1


def test_a_valid_grant_passes_and_the_guarded_write_commits(guarded_app):
    lock = lock_service().acquire(RESOURCE, "w-1", ttl=30).lock
    with db.engine.connect() as conn:
        conn.exec_driver_sql("CREATE TABLE guard_notes (fence BIGINT)")
        conn.commit()
        guard(conn, RESOURCE, lock.fence)
        guard(conn, RESOURCE, lock.fence)  # twice in one transaction: no deadlock
        conn.execute(text("INSERT INTO guard_notes VALUES (:f)"), {"f": lock.fence})
        conn.commit()
        assert conn.exec_driver_sql("SELECT fence FROM guard_notes").scalar() == (
            lock.fence
        )


def test_a_grant_taken_over_is_lost(guarded_app, clock):
    service = lock_service()
    first = service.acquire(RESOURCE, "w-1", ttl=30).lock
    clock.advance(31)
    second = service.acquire(RESOURCE, "w-2", ttl=30).lock
    with db.engine.connect() as conn:
        state, message = refusal(conn, RESOURCE, first.fence)
        assert state == "LK001"
        assert message.startswith("lockkeeper_guard: lost: 'guard:job'")
        guard(conn, RESOURCE, second.fence)
        conn.rollback()


def test_a_released_grant_is_lost(guarded_app):
    service = lock_service()
    lock = service.acquire(RESOURCE, "w-1", ttl=30).lock
    service.release(RESOURCE, "w-1")
    with db.engine.connect() as conn:
        assert refusal(conn, RESOURCE, lock.fence)[0] == "LK001"


def test_a_grant_past_its_ttl_by_the_database_clock_is_expired(make_app):
    # The real clock: the guard and the grant agree on what time it is.
    app = make_app()
    with app.app_context():
        lock = lock_service().acquire(RESOURCE, "w-1", ttl=0.05).lock
        with db.engine.connect() as conn:
            deadline = datetime.now(UTC) + timedelta(seconds=10)
            while True:
                now = conn.exec_driver_sql(
                    "SELECT clock_timestamp()"
                    if conn.dialect.name == "postgresql"
                    else "SELECT UTC_TIMESTAMP(6)"
                ).scalar()
                conn.rollback()
                if now.replace(tzinfo=UTC) > lock.expires_at:
                    break
                assert datetime.now(UTC) < deadline
            state, message = refusal(conn, RESOURCE, lock.fence)
    assert state == "LK002"
    assert message.startswith("lockkeeper_guard: expired:")


def test_a_fence_never_granted_on_the_resource_is_never_held(guarded_app):
    service = lock_service()
    lock = service.acquire(RESOURCE, "w-1", ttl=30).lock
    elsewhere = service.acquire("guard:other", "w-1", ttl=30).lock
    with db.engine.connect() as conn:
        for resource, fence in (
            (RESOURCE, elsewhere.fence),
            (RESOURCE, lock.fence + 1000),
            ("guard:nothing-here", lock.fence),
            ("GUARD:JOB", lock.fence),  # names compare byte for byte
        ):
            state, message = refusal(conn, resource, fence)
            assert state == "LK003", (resource, fence)
            assert message.startswith("lockkeeper_guard: never held:")


NOWAIT = "SELECT id FROM distributed_locks WHERE resource = :r FOR UPDATE NOWAIT"


def row_is_free(resource: str) -> bool:
    """Whether another transaction can lock ``resource``'s row at once."""
    with db.engine.connect() as other:
        try:
            other.execute(text(NOWAIT), {"r": resource})
        except DBAPIError:
            return False
        finally:
            other.rollback()
    return True


def failed_guard(conn, resource: str, fence: int) -> str:
    """The SQLSTATE of a guard that fails; the caller's transaction stays
    open (on PostgreSQL, aborted: only a rollback ends it)."""
    with pytest.raises(DBAPIError) as failed:
        guard(conn, resource, fence)
    if conn.dialect.name == "postgresql":
        return failed.value.orig.sqlstate
    conn.exec_driver_sql("GET DIAGNOSTICS CONDITION 1 @state = RETURNED_SQLSTATE")
    return conn.exec_driver_sql("SELECT @state").scalar()


def test_any_live_grants_fence_passes_and_holds_the_row(guarded_app, clock):
    service = lock_service()
    readers = [
        service.acquire("guard:rw", owner, ttl=30, mode="shared").lock
        for owner in ("r-1", "r-2")
    ]
    holder = service.acquire("guard:sem", "s-1", ttl=30, limit=3).lock
    exclusive = service.acquire(RESOURCE, "w-1", ttl=30).lock
    for resource, fence in [
        ("guard:rw", readers[0].fence),
        ("guard:rw", readers[1].fence),
        ("guard:sem", holder.fence),
        (RESOURCE, exclusive.fence),
    ]:
        with db.engine.connect() as conn:
            guard(conn, resource, fence)
            # Nothing may change that grant's resource until this commits.
            assert not row_is_free(resource), (resource, fence)
            conn.commit()
        assert row_is_free(resource)
    # Another shared holder guards beside it (shared locks coexist).
    with db.engine.connect() as first, db.engine.connect() as second:
        guard(first, "guard:rw", readers[0].fence)
        guard(second, "guard:rw", readers[1].fence)
        first.rollback()
        second.rollback()
    # A holder released is lost; one past its ttl (the database's clock) is
    # expired; a demoted grant's fence is its shared grant's now.
    service.release("guard:rw", "r-1")
    with db.engine.connect() as conn:
        assert refusal(conn, "guard:rw", readers[0].fence)[0] == "LK001"
    demoted = service.acquire(RESOURCE, "w-1", ttl=30, mode="shared").lock
    assert demoted.fence == exclusive.fence
    with db.engine.connect() as conn:
        guard(conn, RESOURCE, exclusive.fence)
        conn.rollback()
    with db.engine.connect() as conn:
        conn.execute(
            text("UPDATE lock_holders SET expires_at = :past WHERE fence = :f"),
            {"past": datetime.now(UTC) - timedelta(seconds=5), "f": holder.fence},
        )
        conn.commit()
        assert refusal(conn, "guard:sem", holder.fence)[0] == "LK002"


@pytest.mark.parametrize("isolation", ["READ COMMITTED", "REPEATABLE READ"])
def test_a_refused_fence_leaves_the_row_free(guarded_app, clock, isolation):
    # A guard locked the row before it looked: a wrong fence kept it locked
    # until the caller's transaction ended (on MariaDB a failed CALL does not
    # end it), and the holder's renewal waited behind it.
    service = lock_service()
    lost = service.acquire(RESOURCE, "w-1", ttl=30).lock
    clock.advance(31)
    held = service.acquire(RESOURCE, "w-2", ttl=30).lock
    holder = service.acquire("guard:sem", "s-1", ttl=30, limit=2).lock
    service.release("guard:sem", "s-1")
    service.acquire("guard:sem", "s-2", ttl=30, limit=2)
    refused = [(RESOURCE, lost.fence, "LK001"), ("guard:sem", holder.fence, "LK001")]
    if isolation == "READ COMMITTED":
        # Under a snapshot a fence newer than any it knows may be a grant made
        # since: PostgreSQL fails it with 40001, MariaDB looks under the lock
        # (migration 0030).
        refused.append((RESOURCE, held.fence + 1000, "LK003"))
    for resource, fence, state in refused:
        with db.engine.connect().execution_options(isolation_level=isolation) as conn:
            conn.exec_driver_sql("SELECT 1")  # the transaction (and snapshot) begins
            assert failed_guard(conn, resource, fence) == state
            assert row_is_free(resource), (isolation, resource, fence)
            conn.rollback()
    renewed = service.renew(RESOURCE, "w-2", ttl=30)
    assert renewed.fence == held.fence


def test_outside_a_transaction_mariadb_refuses_and_postgresql_holds_nothing(
    guarded_app, backend
):
    """PostgreSQL cannot tell an autocommit statement from a transaction's first
    (the client's helpers refuse autocommit there); MariaDB's procedure can."""
    lock = lock_service().acquire(RESOURCE, "w-1", ttl=30).lock
    autocommit = {"isolation_level": "AUTOCOMMIT"}
    with db.engine.connect().execution_options(**autocommit) as conn:
        if backend == "mariadb":
            state, message = refusal(conn, RESOURCE, lock.fence)
            assert state == "LK004"
            assert message.startswith("lockkeeper_guard: no transaction:")
            return
        guard(conn, RESOURCE, lock.fence)
        # Its statement was its transaction: the row is free again.
        lock_service().force_release(RESOURCE, actor="alice", reason="unguarded")


def test_the_guard_holds_the_row_until_the_transaction_ends(guarded_app):
    lock = lock_service().acquire(RESOURCE, "w-1", ttl=30).lock
    nowait = "SELECT id FROM distributed_locks WHERE resource = :r FOR UPDATE NOWAIT"
    with db.engine.connect() as guarded, db.engine.connect() as other:
        guard(guarded, RESOURCE, lock.fence)
        with pytest.raises(DBAPIError):
            other.execute(text(nowait), {"r": RESOURCE})
        other.rollback()
        # A second guard of the same grant shares the row: no wait.
        guard(other, RESOURCE, lock.fence)
        other.rollback()
        guarded.commit()
        assert other.execute(text(nowait), {"r": RESOURCE}).scalar() is not None
        other.rollback()


def test_the_guard_waits_for_a_take_over_in_flight_and_then_is_lost(guarded_app, clock):
    service = lock_service()
    first = service.acquire(RESOURCE, "w-1", ttl=30).lock
    clock.advance(31)
    with RowHolder(service, RESOURCE) as held, db.engine.connect() as conn:
        checking = run_blocked(service, lambda: refusal(conn, RESOURCE, first.fence))
        held.finish(
            lambda c: service.core.transactional.acquire(
                c, Ask(RESOURCE, "w-2", None, 30, "worker"), service.core.given_now()
            )
        )
        assert checking.result(timeout=30)[0] == "LK001"


_ACTIVITY = {
    "postgresql": "SELECT pid, state, wait_event_type, wait_event, left(query, 80)"
    " FROM pg_stat_activity WHERE datname = current_database()",
    "mariadb": "SELECT id, command, state, left(info, 80)"
    " FROM information_schema.processlist WHERE db = DATABASE()",
}


def _waiting(service, call):
    """``run_blocked``, whose failure also shows what each connection of the
    database was doing (a wait that is not a row lock's shows up there)."""
    try:
        return run_blocked(service, call)
    except AssertionError as exc:
        with service.engine.connect() as conn:
            activity = conn.exec_driver_sql(_ACTIVITY[conn.dialect.name]).all()
        raise AssertionError(f"{exc}; connections: {activity}") from exc


def _in_context(app, call):
    with app.app_context():
        return call()


def _take_over(service, clock):
    clock.advance(31)
    return lambda: service.acquire(RESOURCE, "w-2", ttl=30)


def _release(service, clock):
    return lambda: service.release(RESOURCE, "w-1")


def _force_release(service, clock):
    return lambda: service.force_release(RESOURCE, actor="alice", reason="stuck")


def _claim(service, clock):
    return lambda: service.claim(
        RESOURCE, "operator:alice", 60, actor="alice", reason="hung", force=True
    )


def _renew(service, clock):
    return lambda: service.renew(RESOURCE, "w-1", ttl=60)


def _release_stale(service, clock):
    clock.advance(31)
    return lambda: service.release_stale(actor="alice", reason="sweep")


def _purge_stale(service, clock):
    clock.advance(31 + 120)
    return lambda: service.purge_stale(timedelta(minutes=1))


# What each path leaves behind once it ran: the guarded fence is ``lost`` (or
# still ``valid``: a renew keeps the grant).
PATHS = {
    "take_over": (_take_over, "lost"),
    "release": (_release, "lost"),
    "force_release": (_force_release, "lost"),
    "claim": (_claim, "lost"),
    "renew": (_renew, "valid"),
    "release_stale": (_release_stale, "lost"),
    "purge_stale": (_purge_stale, "lost"),
}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_every_change_of_the_grant_waits_for_the_guarded_transaction(
    guarded_app, clock, path
):
    service = lock_service()
    lock = service.acquire(RESOURCE, "w-1", ttl=30).lock
    make_call, after = PATHS[path]
    with db.engine.connect() as conn:
        guard(conn, RESOURCE, lock.fence)
        call = make_call(service, clock)
        changing = _waiting(service, lambda: _in_context(guarded_app, call))
        assert not changing.done()
        conn.commit()
        changing.result(timeout=30)
        if after == "valid":
            guard(conn, RESOURCE, lock.fence)
            conn.rollback()
        else:
            assert refusal(conn, RESOURCE, lock.fence)[0] == "LK001"


def test_the_waiting_lines_hand_over_follows_the_guarded_commit(guarded_app):
    """w-2 waits in line; w-1 releases while its guarded transaction is open: the
    release waits for the commit, and only then does w-2 get the grant."""
    service = lock_service()
    lock = service.acquire(RESOURCE, "w-1", ttl=30).lock
    with ThreadPoolExecutor(1) as pool, db.engine.connect() as conn:
        waiter = pool.submit(
            _in_context,
            guarded_app,
            lambda: lock_service().acquire(RESOURCE, "w-2", ttl=30, wait=20),
        )
        _until(lambda: service.get(RESOURCE).waiters == 1)
        guard(conn, RESOURCE, lock.fence)
        releasing = run_blocked(
            service, lambda: _in_context(guarded_app, _release(service, None))
        )
        assert not releasing.done()
        assert not waiter.done()
        conn.commit()
        releasing.result(timeout=30)
        granted = waiter.result(timeout=30)
    assert granted.acquired
    assert granted.lock.owner == "w-2"
    assert granted.lock.fence > lock.fence


def test_a_refused_acquire_waits_for_the_guard_on_mariadb_only(guarded_app, backend):
    """PostgreSQL's acquire locks only a row it may take (free, expired, its
    own): another holder's valid grant is refused at once. MariaDB's locking
    read takes the row first, so the refusal waits for the guarded commit."""
    service = lock_service()
    lock = service.acquire(RESOURCE, "w-1", ttl=30).lock
    with db.engine.connect() as conn:
        guard(conn, RESOURCE, lock.fence)
        if backend == "postgresql":
            assert not service.acquire(RESOURCE, "w-2", ttl=30).acquired
            conn.rollback()
            return
        refusing = run_blocked(
            service,
            lambda: _in_context(
                guarded_app, lambda: lock_service().acquire(RESOURCE, "w-2", ttl=30)
            ),
        )
        assert not refusing.done()
        conn.rollback()
        assert not refusing.result(timeout=30).acquired


def _until(condition, seconds: float = 15) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.01)
