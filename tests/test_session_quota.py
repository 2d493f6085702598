"""One API token's share of sessions (``LOCKKEEPER_MAX_SESSIONS_PER_TOKEN``):
past it a new session is a 429 naming the setting, decided where the session
is created, in its transaction, so parallel creates never pass the share."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from lockkeeper_core.models import LockSession
from sqlalchemy import func, select

from app.extensions import db, lock_service
from tests.conftest import ApiClient
from tests.test_api_locks import assert_problem

pytestmark = pytest.mark.usefixtures("backend")

SETTING = "LOCKKEEPER_MAX_SESSIONS_PER_TOKEN"
sessions = LockSession.__table__


def _start(api: ApiClient, ttl: float = 60):
    return api.post("/api/v1/sessions", json={"owner": "w", "ttl": ttl})


def _live_sessions(app, token: str) -> int:
    with app.app_context():
        now = lock_service().now()
        return db.session.scalar(
            select(func.count())
            .select_from(sessions)
            .where(sessions.c.token == token, sessions.c.expires_at > now)
        )


def test_a_token_past_its_share_gets_a_429_naming_the_setting(make_app, clock):
    app = make_app(LOCKKEEPER_CLOCK=clock, **{SETTING: 2})
    api = ApiClient(app, "capped")
    first = _start(api, ttl=30).get_json()
    assert _start(api, ttl=60).status_code == 201
    refused = _start(api)
    body = assert_problem(refused, 429)
    assert body["setting"] == SETTING
    assert body["limit"] == 2
    assert SETTING in body["detail"]
    assert "'capped'" in body["detail"]
    # Until the soonest of its sessions expires.
    assert refused.headers["Retry-After"] == "30"
    assert _live_sessions(app, "capped") == 2
    # Another token has a share of its own.
    assert _start(api.with_token("other")).status_code == 201
    # An end makes room, and so does an expiry.
    ended = api.open("DELETE", f"/api/v1/sessions/{first['id']}")
    assert ended.status_code == 204
    assert _start(api).status_code == 201
    assert_problem(_start(api), 429)
    clock.advance(61)
    assert _start(api).status_code == 201


def test_zero_is_no_limit(make_app):
    app = make_app(**{SETTING: 0})
    api = ApiClient(app, "unlimited")
    for _ in range(5):
        assert _start(api).status_code == 201


@pytest.mark.connections(24)
@pytest.mark.backends("postgresql", "mariadb", "sqlite")
def test_parallel_creates_never_pass_the_share(make_app):
    """Twenty real threads create sessions of one token at once, three rounds
    (each round's sessions ended after it): exactly the share is granted, the
    rest refused, and the database never holds more."""
    share = 3
    parallel = 20
    app = make_app(**{SETTING: share})
    api = ApiClient(app, "racing")
    for _round in range(3):
        start = threading.Barrier(parallel)

        def create(_n: int, start=start):
            start.wait(10)
            return _start(api)

        with ThreadPoolExecutor(parallel) as pool:
            responses = list(pool.map(create, range(parallel)))
        statuses = sorted(r.status_code for r in responses)
        assert _live_sessions(app, "racing") == share, statuses
        assert statuses == [201] * share + [429] * (parallel - share), statuses
        for response in responses:
            if response.status_code == 201:
                session = response.get_json()["id"]
                ended = api.open("DELETE", f"/api/v1/sessions/{session}")
                assert ended.status_code == 204
