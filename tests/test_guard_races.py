"""The guard against real pauses: a holder in a process of its own, stopped with
SIGSTOP past its ttl and resumed, on PostgreSQL and MariaDB, on the real clock.

- stopped before its guard: the lock is taken over meanwhile, and the resumed
  holder's guarded write never commits;
- stopped inside its guarded transaction: the take-over waits for the row until
  the holder resumes and commits, so the write and the new grant never
  interleave (the new grant's clock reading follows the write's);
- a force-release waits for the guarded transaction too, then wins.
"""

from __future__ import annotations

import os
import signal
import time
from datetime import UTC, datetime

import pytest
from lockkeeper_client import GuardRefused, guard
from sqlalchemy import text
from sqlalchemy.engine import make_url

from app.extensions import db, lock_service
from tests.forks import worker_context
from tests.row_waits import run_blocked

SERVERS = ("postgresql", "mariadb")
RESOURCE = "guard:paused"
TTL = 2.0  # long enough for a loaded machine to guard and write within it
DEADLINE = 20.0


def pytest_generate_tests(metafunc):
    if "server" in metafunc.fixturenames:
        chosen = metafunc.config.getoption("--backends").split(",")
        metafunc.parametrize("server", [s for s in SERVERS if s in chosen])


@pytest.fixture
def database_url(server, databases, tmp_path) -> str:
    return databases(server).fresh(tmp_path)


@pytest.fixture
def app(make_app):
    app = make_app()
    with app.app_context():
        with db.engine.begin() as conn:
            conn.exec_driver_sql(
                "CREATE TABLE IF NOT EXISTS paused_writes"
                " (fence BIGINT, written_at DATETIME(6))"
                if conn.dialect.name != "postgresql"
                else "CREATE TABLE IF NOT EXISTS paused_writes"
                " (fence BIGINT, written_at timestamptz)"
            )
            conn.exec_driver_sql("DELETE FROM paused_writes")
        yield app


# -- the holder's process -----------------------------------------------------------


class _Lock:
    def __init__(self, resource: str, fence: int):
        self.resource = resource
        self.fence = fence


def _connect(url: str):
    parsed = make_url(url)
    if parsed.get_backend_name() == "postgresql":
        import psycopg

        return psycopg.connect(
            host=parsed.host,
            port=parsed.port,
            user=parsed.username,
            dbname=parsed.database,
        )
    import pymysql

    return pymysql.connect(
        host=parsed.host,
        port=parsed.port,
        user=parsed.username,
        database=parsed.database,
    )


def holder(url: str, pipe) -> None:
    """The worker: connects, says "ready", then takes ``(order, fence)``.
    "write": guard, write and commit. "guard": guard and write, say "guarded",
    wait for "commit", commit. Answers "committed" or the guard's reason."""
    conn = _connect(url)
    now = (
        "clock_timestamp()"
        if make_url(url).get_backend_name() == "postgresql"
        else "UTC_TIMESTAMP(6)"
    )
    pipe.send("ready")
    order, fence = pipe.recv()
    try:
        guard(conn, _Lock(RESOURCE, fence))
        with conn.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO paused_writes (fence, written_at) VALUES (%s, {now})",
                (fence,),
            )
        if order == "guard":
            pipe.send("guarded")
            assert pipe.recv() == "commit"
        conn.commit()
        pipe.send("committed")
    except GuardRefused as refused:
        conn.rollback()
        pipe.send(refused.reason)
    finally:
        conn.close()


class Holder:
    """The holder's process, connected and ready; stop() and resume() send
    SIGSTOP and SIGCONT."""

    def __init__(self, url: str):
        context = worker_context()
        self.pipe, theirs = context.Pipe()
        self.process = context.Process(target=holder, args=(url, theirs), daemon=True)
        self.process.start()
        self.expect("ready")

    def send(self, *message) -> None:
        self.pipe.send(message if len(message) > 1 else message[0])

    def expect(self, message: str) -> None:
        assert self.pipe.poll(DEADLINE), f"the holder never said {message!r}"
        assert self.pipe.recv() == message

    def answer(self) -> str:
        assert self.pipe.poll(DEADLINE), "the holder never answered"
        return self.pipe.recv()

    def stop(self) -> None:
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)

    def close(self) -> None:
        if self.process.is_alive():
            self.resume()
            self.process.kill()
        self.process.join(DEADLINE)


def _expired(service, lock) -> None:
    """Return once the database's clock is past the grant's expiry."""
    deadline = time.monotonic() + DEADLINE
    while service.now() <= lock.expires_at:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def _utc(moment: datetime) -> datetime:
    """MariaDB's DATETIME comes back naive (it holds UTC_TIMESTAMP here)."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


def _writes(app) -> list[tuple]:
    with db.engine.connect() as conn:
        return [
            tuple(row)
            for row in conn.execute(
                text("SELECT fence, written_at FROM paused_writes ORDER BY fence")
            )
        ]


def test_a_holder_stopped_past_its_ttl_cannot_write_after_the_take_over(
    app, database_url
):
    service = lock_service()
    paused = Holder(database_url)
    try:
        lock = service.acquire(RESOURCE, "w-1", ttl=TTL).lock
        paused.stop()
        _expired(service, lock)
        taken = service.acquire(RESOURCE, "w-2", ttl=30)
        assert taken.acquired
        paused.send("write", lock.fence)
        paused.resume()
        assert paused.answer() == "lost"
    finally:
        paused.close()
    assert _writes(app) == []


def test_a_take_over_waits_for_a_stopped_holders_guarded_transaction(app, database_url):
    service = lock_service()
    paused = Holder(database_url)
    try:
        lock = service.acquire(RESOURCE, "w-1", ttl=TTL).lock
        paused.send("guard", lock.fence)
        paused.expect("guarded")
        paused.stop()
        _expired(service, lock)

        def take_over():
            with app.app_context():
                return lock_service().acquire(RESOURCE, "w-2", ttl=30)

        taking = run_blocked(service, take_over)
        assert not taking.done()
        paused.send("commit")
        paused.resume()
        assert paused.answer() == "committed"
        taken = taking.result(timeout=DEADLINE)
    finally:
        paused.close()
    assert taken.acquired
    assert taken.lock.fence > lock.fence
    ((fence, written_at),) = _writes(app)
    assert fence == lock.fence
    # The new grant's clock was read after the write was made (and committed).
    assert taken.lock.acquired_at > _utc(written_at)


def test_a_force_release_waits_for_the_guarded_transaction_and_then_wins(
    app, database_url
):
    service = lock_service()
    paused = Holder(database_url)
    try:
        lock = service.acquire(RESOURCE, "w-1", ttl=30).lock
        paused.send("guard", lock.fence)
        paused.expect("guarded")
        paused.stop()

        def force_release():
            with app.app_context():
                return lock_service().force_release(
                    RESOURCE, actor="alice", reason="hung worker"
                )

        releasing = run_blocked(service, force_release)
        assert not releasing.done()
        paused.send("commit")
        paused.resume()
        assert paused.answer() == "committed"
        released = releasing.result(timeout=DEADLINE)
    finally:
        paused.close()
    assert released.fence == lock.fence
    assert [fence for fence, _ in _writes(app)] == [lock.fence]
    # And the holder's next guarded write is refused: the grant is gone.
    again = Holder(database_url)
    try:
        again.send("write", lock.fence)
        assert again.answer() == "lost"
    finally:
        again.close()
