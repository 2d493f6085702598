"""A right is decided where the grant commits: a waiting acquire whose token
ends while it is in line is never granted, and a token's lock quota holds under
parallel acquires. Real threads against every database."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest
from lockkeeper_core.errors import TokenEnded
from lockkeeper_core.models import DistributedLock
from sqlalchemy import func, select, update

from app.auth.models import ApiToken
from app.auth.service import revoke_token
from app.extensions import db, lock_service
from tests.conftest import ApiClient

pytestmark = pytest.mark.usefixtures("backend")

locks = DistributedLock.__table__


def wait_until(condition: Callable[[], bool], timeout: float = 10.0, what: str = ""):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def post(api: ApiClient, path: str, json: dict):
    """One request on a test client of its own (safe from any thread)."""
    client = api.app.test_client()
    return client.post(
        path, json=json, headers={"Authorization": f"Bearer {api.token}"}
    )


def in_line(app, resource: str) -> list[str | None]:
    with app.app_context():
        return [waiter.token for waiter in lock_service().queue.line(resource)]


def holder(app, resource: str):
    with app.app_context():
        return db.session.execute(
            select(locks.c.owner, locks.c.token, locks.c.expires_at).where(
                locks.c.resource == resource
            )
        ).one_or_none()


class Waiting:
    """A waiting acquire through the API in a thread; ``response`` when done."""

    def __init__(self, api: ApiClient, resource: str, owner: str, wait: float):
        self.response = None
        self.thread = threading.Thread(
            target=self._run, args=(api, resource, owner, wait), daemon=True
        )
        self.thread.start()

    def _run(self, api, resource, owner, wait):
        self.response = post(
            api, f"/api/v1/locks/{resource}", {"owner": owner, "ttl": 60, "wait": wait}
        )

    def join(self):
        self.thread.join(30)
        assert not self.thread.is_alive()
        return self.response


def _revoke_elsewhere(app, name: str) -> None:
    """Revoke ``name`` as another worker would: this process's token cache still
    holds the token as live (for up to its bound)."""
    with app.app_context():
        db.session.execute(
            update(ApiToken)
            .where(ApiToken.name == name)
            .values(revoked_at=datetime.now(UTC))
        )
        db.session.commit()


# -- H1: the waiting line ----------------------------------------------------------


def test_a_waiting_acquire_whose_token_is_revoked_is_never_granted(app):
    holder_api = ApiClient(app, "holder")
    waiter_api = holder_api.with_token("waiter")
    assert post(holder_api, "/api/v1/locks/w:1", {"owner": "h", "ttl": 60}).json[
        "acquired"
    ]
    waiting = Waiting(waiter_api, "w:1", "late", wait=20)
    wait_until(lambda: in_line(app, "w:1") == ["waiter"], what="the waiter in line")

    with app.app_context():
        revoke_token("waiter")
    # Revoking takes the token's places in line at once.
    assert in_line(app, "w:1") == []
    started = time.monotonic()
    response = waiting.join()
    assert response.status_code == 401, response.json
    assert time.monotonic() - started < 2.0
    # The holder lets go: nobody is granted on the revoked token's behalf.
    holder_api.client.delete("/api/v1/locks/w:1?owner=h", headers=_auth(holder_api))
    assert holder(app, "w:1").owner is None


def test_the_grant_refuses_a_token_revoked_while_another_worker_caches_it(app):
    """Revoked by another worker: this worker's cache still calls the token live,
    so only the grant itself can refuse it, in the same statement/transaction."""
    holder_api = ApiClient(app, "holder")
    waiter_api = holder_api.with_token("waiter")
    assert post(holder_api, "/api/v1/locks/w:2", {"owner": "h", "ttl": 60}).json[
        "acquired"
    ]
    waiting = Waiting(waiter_api, "w:2", "late", wait=20)
    wait_until(lambda: in_line(app, "w:2") == ["waiter"], what="the waiter in line")
    _revoke_elsewhere(app, "waiter")
    # The holder lets go while the revoked waiter is still first in line.
    release = holder_api.client.delete(
        "/api/v1/locks/w:2?owner=h", headers=_auth(holder_api)
    )
    assert release.status_code == 204
    response = waiting.join()
    assert response.status_code == 401, response.json
    assert holder(app, "w:2").owner is None
    assert in_line(app, "w:2") == []


def test_a_non_waiting_acquire_of_a_token_revoked_elsewhere_is_refused(app):
    api = ApiClient(app, "cached")
    assert post(api, "/api/v1/locks/w:3", {"owner": "a"}).json["acquired"]
    _revoke_elsewhere(app, "cached")
    response = post(api, "/api/v1/locks/w:4", {"owner": "a"})
    assert response.status_code == 401, response.json
    assert holder(app, "w:4") is None


def test_a_waiting_acquire_whose_token_expires_is_never_granted(app):
    holder_api = ApiClient(app, "holder")
    waiter_api = holder_api.with_token("brief", expires_in=timedelta(seconds=1.5))
    assert post(holder_api, "/api/v1/locks/w:5", {"owner": "h", "ttl": 60}).json[
        "acquired"
    ]
    waiting = Waiting(waiter_api, "w:5", "late", wait=20)
    wait_until(lambda: in_line(app, "w:5") == ["brief"], what="the waiter in line")
    with app.app_context():
        expires_at = db.session.scalar(
            select(ApiToken.expires_at).where(ApiToken.name == "brief")
        )
    response = waiting.join()
    ended = datetime.now(UTC)
    assert response.status_code == 401, response.json
    # It left the line within the waiting line's check interval of its expiry.
    assert ended - expires_at < timedelta(seconds=1)
    assert in_line(app, "w:5") == []
    assert holder(app, "w:5").owner == "h"


def test_an_expired_tokens_grant_is_refused_where_it_commits(make_app, clock):
    """The grant judges the token's expiry by its own clock, after any earlier
    check in Python passed."""
    app = make_app(LOCKKEEPER_CLOCK=clock)
    api = ApiClient(app, "brief", expires_in=timedelta(seconds=60))
    with app.app_context():
        service = lock_service()
        clock.advance(61)
        with pytest.raises(TokenEnded):
            service.acquire("w:6", "a", token="brief", max_locks=None)
        assert service.acquire("w:6", "a", token=None).acquired
    assert api.token


def test_the_waiting_line_records_the_token_not_the_actor(service):
    """The waiter's identity is its token, whoever the actor is."""
    service.acquire("w:7", "h", ttl=60, token="holder")
    seen: list[list] = []

    def look():
        wait_until(lambda: service.queue.line("w:7"), what="the waiter")
        seen.append([w.token for w in service.queue.line("w:7")])
        service.release("w:7", "h", token="holder")

    with service_thread(look):
        result = service.acquire(
            "w:7", "w", ttl=60, actor="session:olga", token="tok", wait=10
        )
    assert result.acquired
    assert seen == [["tok"]]


class service_thread:  # noqa: N801 - used as a context manager
    def __init__(self, target):
        from flask import current_app

        app = current_app._get_current_object()

        def run():
            with app.app_context():
                target()

        self.thread = threading.Thread(target=run, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.thread.join(30)
        assert not self.thread.is_alive()


def _auth(api: ApiClient) -> dict[str, str]:
    return {"Authorization": f"Bearer {api.token}"}


# -- H2: the quota under parallel load -----------------------------------------------


def _live_locks(app, token: str) -> int:
    with app.app_context():
        now = lock_service().now()
        return db.session.scalar(
            select(func.count())
            .select_from(locks)
            .where(locks.c.token == token, locks.c.expires_at > now)
        )


@pytest.mark.parametrize("rows", ["fresh", "released before"])
def test_max_locks_holds_under_twenty_parallel_acquires(app, rows):
    api = ApiClient(app, "capped", max_locks=2)
    other = api.with_token("other")
    parallel = 20
    for round_ in range(3):
        names = [f"q{round_}:{n}" for n in range(parallel)]
        if rows == "released before":
            for name in names:
                assert post(other, f"/api/v1/locks/{name}", {"owner": "o"}).json[
                    "acquired"
                ]
                other.client.delete(
                    f"/api/v1/locks/{name}?owner=o", headers=_auth(other)
                )
        start = threading.Barrier(parallel)

        def acquire(name, start=start):
            start.wait(10)
            return post(api, f"/api/v1/locks/{name}", {"owner": "w", "ttl": 60})

        with ThreadPoolExecutor(parallel) as pool:
            responses = list(pool.map(acquire, names))
        statuses = sorted(r.status_code for r in responses)
        granted = [r for r in responses if r.status_code == 200]
        assert _live_locks(app, "capped") <= 2, statuses
        assert len(granted) == 2, statuses
        assert set(statuses) <= {200, 429}, statuses
        for response in granted:
            resource = response.json["lock"]["resource"]
            api.client.delete(f"/api/v1/locks/{resource}?owner=w", headers=_auth(api))


@pytest.mark.parametrize(("max_locks", "far"), [(10000, True), (2, False)])
def test_a_token_far_from_its_quota_shares_its_lock(app, backend, max_locks, far):
    """A token far from its quota (its live locks plus max_connections below
    it) takes its row shared (PostgreSQL FOR SHARE, MariaDB LOCK IN SHARE MODE),
    so its new grants do not wait for each other; near it, the grant takes the
    row alone and waits for every grant in flight. SQLite has one writer at a
    time and no row locks. (tests/test_token_row_share.py: the same with a real
    grant paused inside its transaction.)"""
    from sqlalchemy import text

    ApiClient(app, "shared", max_locks=max_locks)
    share = {"postgresql": "FOR SHARE", "mariadb": "LOCK IN SHARE MODE"}
    waits = backend in share and not far
    with app.app_context():
        service = lock_service()
        with db.engine.connect() as other:
            if backend in share:
                # Another grant of the token in flight, holding the row shared.
                other.execute(
                    text(
                        "SELECT 1 FROM api_tokens WHERE name = 'shared' "
                        + share[backend]
                    )
                )
            done = threading.Event()

            def grant():
                with app.app_context():
                    service.acquire("far:1", "w", token="shared", max_locks=max_locks)
                done.set()

            thread = threading.Thread(target=grant, daemon=True)
            thread.start()
            # A grant that shares finishes while the other holds the row (up to
            # 15 s under load); one that waits cannot, within a second either.
            finished = done.wait(1.0 if waits else 15.0)
            other.rollback()
        thread.join(10)
        assert done.is_set()
        assert finished is not waits
