"""A set waiting in line, on every database, as a single waiter does: woken
by the release it waits for (not by its next poll), in one seat of the
worker's waiting room, and gone from every line when its client hangs up or
its API token ends."""

from __future__ import annotations

import copy
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from lockkeeper_core import queue as line_module
from lockkeeper_core.errors import TokenEnded
from lockkeeper_core.models import DistributedLock
from lockkeeper_core.values import Member
from sqlalchemy import select

from app.extensions import lock_service
from tests.conftest import ApiClient

pytestmark = pytest.mark.usefixtures("backend")

# Far longer than any deadline below: a set that waited for its next look
# (the poll interval, or PostgreSQL's safety look) would fail the test.
LONG_PAUSE = 600.0
# How long the tests give a woken set to be granted: a loaded machine's
# seconds, far below ``LONG_PAUSE``.
GRANTED_WITHIN = 60.0


def _poll(condition, what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        threading.Event().wait(0.01)


def _owners(service, resource: str) -> list[str]:
    return [waiter.owner for waiter in service.queue.line(resource)]


def test_a_waiting_set_is_woken_by_the_release_not_by_its_poll(
    make_app, backend, monkeypatch
):
    """The line's pauses made far longer than the test: the set waits for
    its second member (the holder's ttl is longer still), and is granted
    after the release only because the release wakes it (PostgreSQL: a
    NOTIFY heard by the listener; elsewhere: in this process)."""
    monkeypatch.setattr(line_module, "NOTIFY_SAFETY_INTERVAL", LONG_PAUSE)
    app = make_app(LOCKKEEPER_MAX_WAIT=LONG_PAUSE)
    with app.app_context():
        service = lock_service()
        service.queue.poll_interval = LONG_PAUSE
        assert service.acquire("set:b", "holder", ttl=3600).acquired
        answers = []
        granted = threading.Event()

        def waiting_set():
            try:
                with app.app_context():
                    answers.append(
                        lock_service().acquire_set(
                            [Member("set:a"), Member("set:b")],
                            "w-set",
                            ttl=30,
                            wait=GRANTED_WITHIN * 2,
                        )
                    )
            except BaseException as exc:  # noqa: BLE001 - shown by the test
                answers.append(exc)
            granted.set()

        thread = threading.Thread(target=waiting_set, daemon=True)
        thread.start()
        _poll(
            lambda: (
                answers
                or _owners(service, "set:a") == _owners(service, "set:b") == ["w-set"]
            ),
            "the set took its places",
        )
        assert not answers, answers
        if backend == "postgresql":
            # Listening before the release: a listener that connects later
            # wakes every waiter once, which would prove nothing.
            listener = service.queue.listener()
            _poll(lambda: listener.healthy, "the listener LISTENs")
        service.release("set:b", "holder")
        assert granted.wait(GRANTED_WITHIN), "the release did not wake the set"
        (answer,) = answers
        assert answer.acquired
        assert [lock.owner for lock in answer.locks] == ["w-set", "w-set"]
        assert _owners(service, "set:a") == _owners(service, "set:b") == []
        thread.join(GRANTED_WITHIN)


# -- the waiting room: a waiting set takes one seat, as a single waiter does --

MEMBERS = [{"resource": "room:a"}, {"resource": "room:b"}]


def _lines(app) -> dict[str, list[str]]:
    with app.app_context():
        service = lock_service()
        return {r: _owners(service, r) for r in ("room:a", "room:b", "room:c")}


def _row_names(app) -> list[str]:
    with app.app_context(), lock_service().engine.connect() as conn:
        return sorted(conn.scalars(select(DistributedLock.resource)))


def _same_token(api: ApiClient) -> ApiClient:
    """Another client (a connection of its own) under ``api``'s token."""
    twin = copy.copy(api)
    twin.client = api.app.test_client()
    return twin


def _turned_away(answer, setting: str) -> None:
    """The room's 503: a problem naming the cap it hit."""
    assert answer.status_code == 503, answer.get_json()
    assert answer.content_type == "application/problem+json"
    assert answer.headers["Retry-After"] == "1"
    assert answer.get_json()["setting"] == setting
    assert f"({setting})" in answer.get_json()["detail"]


def test_a_waiting_set_takes_the_seat_a_single_waiter_would(make_app):
    """A room of one seat: a set waiting in it turns a waiting single away,
    and a single waiting in it turns a waiting set away (writing nothing:
    no place, no row for its free member)."""
    app = make_app(LOCKKEEPER_MAX_WAITERS=1)
    api = ApiClient(app)
    setter, single = api.with_token("set"), api.with_token("single")
    for resource in ("room:a", "room:c"):
        taken = api.post(f"/api/v1/locks/{resource}", json={"owner": "holder"})
        assert taken.status_code == 200
    with ThreadPoolExecutor(1) as pool:
        waiting_set = pool.submit(
            setter.post,
            "/api/v1/sets",
            json={"owner": "w-set", "wait": 30, "members": MEMBERS},
        )
        _poll(lambda: _lines(app)["room:b"] == ["w-set"], "the set took its places")
        turned_away = single.post(
            "/api/v1/locks/room:c", json={"owner": "w-1", "wait": 5}
        )
        _turned_away(turned_away, "LOCKKEEPER_MAX_WAITERS")
        assert _lines(app)["room:c"] == []
        assert api.delete("/api/v1/locks/room:a", json={"owner": "holder"}).status_code
        assert waiting_set.result(timeout=60).status_code == 200

    # The other way round: a single waits in the seat, the set is turned away.
    with ThreadPoolExecutor(1) as pool:
        waiting_single = pool.submit(
            single.post,
            "/api/v1/locks/room:c",
            json={"owner": "w-1", "wait": 30},
        )
        _poll(lambda: _lines(app)["room:c"] == ["w-1"], "the single took its place")
        released = setter.delete(
            "/api/v1/sets", json={"owner": "w-set", "resources": ["room:a", "room:b"]}
        )
        assert released.status_code == 200
        assert api.post("/api/v1/locks/room:a", json={"owner": "holder"}).status_code
        rows = _row_names(app)
        refused = setter.post(
            "/api/v1/sets",
            json={
                "owner": "w-set",
                "wait": 5,
                "members": [{"resource": "room:a"}, {"resource": "room:new"}],
            },
        )
        _turned_away(refused, "LOCKKEEPER_MAX_WAITERS")
        assert _row_names(app) == rows  # no row made for room:new
        assert _lines(app) == {"room:a": [], "room:b": [], "room:c": ["w-1"]}
        assert api.delete("/api/v1/locks/room:c", json={"owner": "holder"}).status_code
        assert waiting_single.result(timeout=60).status_code == 200


def test_a_waiting_set_takes_one_of_its_tokens_share_of_the_room(make_app):
    """The token's share of one seat: its waiting set turns its waiting
    single away, and the other way round; another token still waits."""
    app = make_app(LOCKKEEPER_MAX_WAITERS=4, LOCKKEEPER_MAX_WAITERS_PER_TOKEN=1)
    api = ApiClient(app)
    greedy = api.with_token("greedy")
    assert api.post("/api/v1/locks/room:a", json={"owner": "holder"}).status_code
    with ThreadPoolExecutor(2) as pool:
        waiting_set = pool.submit(
            greedy.post,
            "/api/v1/sets",
            json={"owner": "g-set", "wait": 30, "members": MEMBERS},
        )
        _poll(lambda: _lines(app)["room:b"] == ["g-set"], "the set took its places")
        single = _same_token(greedy)
        turned_away = single.post(
            "/api/v1/locks/room:a", json={"owner": "g-1", "wait": 5}
        )
        _turned_away(turned_away, "LOCKKEEPER_MAX_WAITERS_PER_TOKEN")
        other = pool.submit(
            api.with_token("other").post,
            "/api/v1/locks/room:b",
            json={"owner": "o-1", "wait": 30},
        )
        _poll(lambda: _lines(app)["room:b"] == ["g-set", "o-1"], "the other waits")
        assert api.delete("/api/v1/locks/room:a", json={"owner": "holder"}).status_code
        assert waiting_set.result(timeout=60).status_code == 200
        released = greedy.delete(
            "/api/v1/sets", json={"owner": "g-set", "resources": ["room:a", "room:b"]}
        )
        assert released.status_code == 200
        assert other.result(timeout=60).status_code == 200

    assert api.post("/api/v1/locks/room:a", json={"owner": "holder"}).status_code
    with ThreadPoolExecutor(1) as pool:
        waiting_single = pool.submit(
            single.post, "/api/v1/locks/room:a", json={"owner": "g-1", "wait": 30}
        )
        _poll(lambda: _lines(app)["room:a"] == ["g-1"], "the single took its place")
        refused = greedy.post(
            "/api/v1/sets", json={"owner": "g-set", "wait": 5, "members": MEMBERS}
        )
        _turned_away(refused, "LOCKKEEPER_MAX_WAITERS_PER_TOKEN")
        assert _lines(app) == {"room:a": ["g-1"], "room:b": [], "room:c": []}
        assert api.delete("/api/v1/locks/room:a", json={"owner": "holder"}).status_code
        assert waiting_single.result(timeout=60).status_code == 200


# -- a waiting set leaves when its client has gone or its token ended --------


@pytest.mark.parametrize("ends", ["client", "token"])
def test_a_waiting_set_leaves_every_line_when_its_client_or_token_goes(make_app, ends):
    """As a single waiter: its client hangs up (the refusal is its answer)
    or its API token ends (``TokenEnded``) while it waits; its places leave
    every line and the row made for its free member is gone."""
    app = make_app()
    with app.app_context():
        service = lock_service()
        assert service.acquire("room:a", "holder", ttl=30).acquired
        rows = _row_names(app)
        there = threading.Event()
        there.set()
        answers = []

        def waiting_set():
            try:
                with app.app_context():
                    answers.append(
                        lock_service().acquire_set(
                            [Member("room:a"), Member("room:new")],
                            "w-set",
                            ttl=30,
                            wait=30,
                            token="t",
                            still_wanted=there.is_set if ends == "client" else None,
                            token_live=there.is_set if ends == "token" else None,
                        )
                    )
            except BaseException as exc:  # noqa: BLE001 - the test reads it
                answers.append(exc)

        thread = threading.Thread(target=waiting_set, daemon=True)
        thread.start()
        _poll(lambda: _owners(service, "room:new") == ["w-set"], "in line")
        there.clear()
        thread.join(GRANTED_WITHIN)
        assert not thread.is_alive()
        (answer,) = answers
        if ends == "client":
            assert not answer.acquired
            assert answer.refused == "room:a"
        else:
            assert isinstance(answer, TokenEnded), answer
        assert _owners(service, "room:a") == _owners(service, "room:new") == []
        assert _row_names(app) == rows
