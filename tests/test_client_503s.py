"""Each 503 an acquire can get, from a real server, and what the worker client
does with it: the problem's ``type`` names the kind, and only a full waiting
room is read as one.

- ``waiting-room-full``: an answer to a waiting acquire (poll, keep the place);
- ``lock-changed-hands``: the holder went while the server decided; asked again
  at once, never backed off from as an outage;
- ``service-busy`` (SQLite's writer lock kept by others) and
  ``database-unavailable`` (a standby): retried with backoff, then
  ``ServiceUnavailable``, never "the waiting room was full".
"""

from __future__ import annotations

import sqlite3
import threading

import httpx
import lockkeeper_client._sync.client as sync_client
import lockkeeper_client._sync.waiting as sync_waiting
import pytest
from lockkeeper_client import LockClient
from lockkeeper_client.errors import LockNotAcquired, ServiceUnavailable
from sqlalchemy.engine import make_url

from app.extensions import lock_service
from tests.live_server import serve

PROBLEM = "urn:lockkeeper:problem:"


class AnswerLog(httpx.HTTPTransport):
    """An HTTP transport that notes each answer's status and problem type, and
    calls ``on_answer`` with it (in the client's thread)."""

    def __init__(self, on_answer=None):
        super().__init__()
        self.answers: list[tuple[int, str | None]] = []
        self.on_answer = on_answer

    def handle_request(self, request):
        response = super().handle_request(request)
        response.read()
        kind = None
        if response.headers.get("Content-Type", "").startswith("application/prob"):
            kind = response.json().get("type")
        self.answers.append((response.status_code, kind))
        if self.on_answer is not None:
            self.on_answer(response.status_code, kind)
        return response


@pytest.fixture
def pauses(monkeypatch) -> list[float]:
    """Every pause the blocking client takes between two requests."""
    taken: list[float] = []
    monkeypatch.setattr(sync_client, "sleep", taken.append)
    monkeypatch.setattr(sync_waiting, "sleep", taken.append)
    return taken


def test_a_full_waiting_room_is_typed_and_read_as_one(make_app):
    app = make_app(LOCKKEEPER_MAX_WAITERS=0)
    with serve(app) as server, app.app_context():
        assert lock_service().acquire("full:1", "holder", ttl=30).acquired
        log = AnswerLog()
        with LockClient(server.url, server.token, transport=log) as client:
            refused = client.acquire("full:1", "x", wait=5)
        assert log.answers == [(503, PROBLEM + "waiting-room-full")]
        assert refused.waiting_room_full
        assert refused.waiting_room_cap == "LOCKKEEPER_MAX_WAITERS"
        assert not refused.changed_hands


@pytest.fixture
def holder_goes_while_deciding(monkeypatch) -> threading.Event:
    """Until the event is set, every refused acquire finds its row changed
    under it (as when the holder released between the statement and the
    decision), on every try: the server answers "lock changed hands"."""
    from lockkeeper_core import rules

    settled = threading.Event()
    real = rules.refuse_acquire

    def refuse_acquire(ask, outcome, show):
        found = real(ask, outcome, show)
        return found if settled.is_set() else rules.SecondLook(0)

    monkeypatch.setattr(rules, "refuse_acquire", refuse_acquire)
    return settled


def test_lock_changed_hands_is_asked_again_at_once(
    make_app, pauses, holder_goes_while_deciding
):
    """Before its type was read, this 503 was an outage to the client: retried
    after its Retry-After (1 s), then ``ServiceUnavailable``."""
    app = make_app()
    with serve(app) as server, app.app_context():
        locks = lock_service()
        assert locks.acquire("hands:1", "holder", ttl=30).acquired
        settled = holder_goes_while_deciding
        log = AnswerLog(lambda status, _kind: status == 503 and settled.set())
        with LockClient(server.url, server.token, transport=log) as client:
            refused = client.acquire("hands:1", "x", ttl=30)
        assert log.answers == [(503, PROBLEM + "lock-changed-hands"), (409, None)]
        assert pauses == []  # asked again at once
        assert not refused.acquired
        assert refused.lock.owner == "holder"
        assert not refused.waiting_room_full
        assert not refused.changed_hands


def test_lock_changed_hands_that_persists_is_a_refusal_with_no_holder(
    make_app, pauses, holder_goes_while_deciding
):
    app = make_app()
    with serve(app) as server, app.app_context():
        locks = lock_service()
        assert locks.acquire("hands:2", "holder", ttl=30).acquired
        log = AnswerLog()
        with LockClient(server.url, server.token, transport=log, retries=2) as client:
            plain = client.acquire("hands:2", "x", ttl=30)
            assert log.answers == [(503, PROBLEM + "lock-changed-hands")] * 3
            assert pauses == []
            assert plain.changed_hands
            assert plain.lock is None
            assert not plain.waiting_room_full
            # A waiting acquire returns it to its caller, who knows what time
            # is left: one request, no retry.
            log.answers.clear()
            waited = client.acquire("hands:2", "x", ttl=30, wait=0.2)
            assert log.answers == [(503, PROBLEM + "lock-changed-hands")]
            assert waited.changed_hands
            assert not waited.waiting_room_full
            assert pauses == []


def test_a_wait_asks_again_at_once_after_lock_changed_hands(
    make_app, pauses, holder_goes_while_deciding
):
    app = make_app()
    with serve(app) as server, app.app_context():
        locks = lock_service()
        assert locks.acquire("hands:3", "holder", ttl=30).acquired

        def on_answer(status, kind):
            if kind == PROBLEM + "lock-changed-hands":
                holder_goes_while_deciding.set()
                locks.release("hands:3", "holder")

        log = AnswerLog(on_answer)
        with (
            LockClient(
                server.url, server.token, transport=log, max_server_wait=0.2
            ) as client,
            client.lock("hands:3", ttl=30, wait=20, owner="patient") as held,
        ):
            assert held.fence > 0
        assert log.answers == [
            (503, PROBLEM + "lock-changed-hands"),
            (200, None),
            (204, None),  # the release
        ]
        assert all(pause == 0.0 for pause in pauses)  # the next request at once


@pytest.fixture
def short_sqlite_busy_timeout(monkeypatch) -> None:
    import lockkeeper_core.engine

    monkeypatch.setattr(lockkeeper_core.engine, "SQLITE_BUSY_TIMEOUT_MS", 50)


def test_a_busy_database_is_retried_with_backoff_not_read_as_a_full_room(
    make_app, short_sqlite_busy_timeout, pauses
):
    """Another writer keeps SQLite's writer lock past the busy timeout: the
    server's 503 is ``service-busy``; the client retries it after the server's
    Retry-After and is granted once the writer lets go."""
    app = make_app()
    with serve(app) as server:
        path = make_url(app.config["LOCKKEEPER_DATABASE_URL"]).database
        writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        writer.execute("BEGIN IMMEDIATE")
        try:

            def on_answer(status, _kind):
                if status == 503 and writer.in_transaction:
                    writer.execute("ROLLBACK")

            log = AnswerLog(on_answer)
            with LockClient(server.url, server.token, transport=log) as client:
                granted = client.acquire("busy:1", "x", ttl=30, wait=5)
        finally:
            if writer.in_transaction:
                writer.execute("ROLLBACK")
            writer.close()
    assert log.answers == [(503, PROBLEM + "service-busy"), (200, None)]
    assert granted.acquired
    assert not granted.waiting_room_full
    assert len(pauses) == 1
    assert pauses[0] >= 1.0


def test_a_busy_database_that_stays_busy_is_an_outage(
    make_app, short_sqlite_busy_timeout, pauses
):
    app = make_app()
    with serve(app) as server:
        path = make_url(app.config["LOCKKEEPER_DATABASE_URL"]).database
        writer = sqlite3.connect(path, isolation_level=None)
        writer.execute("BEGIN IMMEDIATE")
        try:
            log = AnswerLog()
            with LockClient(server.url, server.token, transport=log, retries=1) as c:
                with pytest.raises(ServiceUnavailable, match="kept answering 503"):
                    c.acquire("busy:2", "x", ttl=30, wait=5)
        finally:
            writer.execute("ROLLBACK")
            writer.close()
    assert log.answers == [(503, PROBLEM + "service-busy")] * 2


@pytest.mark.connections(16, backend="postgresql")  # two apps on the server
def test_a_standby_is_an_outage_not_a_full_room(make_app, databases, tmp_path, pauses):
    """A database that refuses every write (a standby after a failover): the
    wait ends in ``ServiceUnavailable``, not in ``LockNotAcquired`` blaming the
    waiting room."""
    url = make_url(databases("postgresql").fresh(tmp_path)).update_query_dict(
        {"options": "-c default_transaction_read_only=on"}
    )
    writable = make_app(
        LOCKKEEPER_DATABASE_URL=url.update_query_dict(
            {"options": "-c default_transaction_read_only=off"}
        ).render_as_string(hide_password=False)
    )
    with writable.app_context():
        from app.auth.service import create_token

        token = create_token("standby-test")
    app = make_app(LOCKKEEPER_DATABASE_URL=url.render_as_string(hide_password=False))
    with serve(app, token=token) as server:
        log = AnswerLog()
        with LockClient(server.url, server.token, transport=log, retries=1) as c:
            try:
                c.lock("standby:1", ttl=30, wait=0.5).__enter__()
            except ServiceUnavailable:
                pass
            except LockNotAcquired as exc:  # pragma: no cover - the bug
                pytest.fail(f"an outage read as a refusal: {exc}")
            else:  # pragma: no cover
                pytest.fail("granted on a read-only database")
    assert log.answers
    assert set(log.answers) == {(503, PROBLEM + "database-unavailable")}
