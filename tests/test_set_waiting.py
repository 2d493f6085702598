"""A set waiting in line, on every database, as a single waiter does: woken
by the release it waits for (not by its next poll), in one seat of the
worker's waiting room, and gone from every line when its client hangs up or
its API token ends."""

from __future__ import annotations

import copy
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import httpx
import pytest
from lockkeeper_core import queue as line_module
from lockkeeper_core.errors import TokenEnded
from lockkeeper_core.models import DistributedLock, LockWaiter
from lockkeeper_core.queue import PLACE_KEPT_FOR
from lockkeeper_core.set_waiting import join_lines
from lockkeeper_core.values import Ask, Member
from sqlalchemy import select

from app.extensions import lock_service
from tests.conftest import ApiClient
from tests.live_server import serve

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


# -- a set keeps its places as a single waiter keeps its place -----------------


def _keep_places_for(monkeypatch, seconds: float) -> None:
    """Kept places last ``seconds`` (not 2 s): what is proven is the order
    while they are presented, not how fast this machine answers."""
    monkeypatch.setattr("lockkeeper_core.set_waiting.PLACE_KEPT_FOR", seconds)


def _join_behind(app, resource: str, owner: str, token: str) -> None:
    """A later single waiter's place, straight into ``resource``'s line."""
    with app.app_context():
        lock_service().queue.join(resource, owner, token, 30, mode="exclusive", limit=1)


def test_a_set_turned_away_keeps_its_places_for_its_retry(make_app, monkeypatch):
    """A waiting set that asks for it (``places``: {}) keeps a place in every
    member's line when the room turns it away: the 503 names them, and the
    retry that presents them waits from there, ahead of a waiter that came
    after it. Another owner presenting them joins the end instead; a set
    that did not ask keeps none."""
    _keep_places_for(monkeypatch, 30.0)
    app = make_app(LOCKKEEPER_MAX_WAITERS=1)
    api = ApiClient(app)
    for resource in ("room:a", "room:c"):
        taken = api.post(f"/api/v1/locks/{resource}", json={"owner": "holder"})
        assert taken.status_code == 200
    asked = {"owner": "w-set", "wait": 5, "members": MEMBERS}
    with ThreadPoolExecutor(1) as pool:
        seated = pool.submit(
            _same_token(api).post,
            "/api/v1/locks/room:c",
            json={"owner": "seated", "wait": 30},
        )
        _poll(lambda: _lines(app)["room:c"] == ["seated"], "the room's one seat")
        plain = api.post("/api/v1/sets", json=asked)
        _turned_away(plain, "LOCKKEEPER_MAX_WAITERS")
        assert "places" not in plain.get_json()
        assert _lines(app) == {"room:a": [], "room:b": [], "room:c": ["seated"]}

        turned = api.post("/api/v1/sets", json={**asked, "places": {}})
        _turned_away(turned, "LOCKKEEPER_MAX_WAITERS")
        places = turned.get_json()["places"]
        assert sorted(places) == ["room:a", "room:b"]
        _join_behind(app, "room:a", "later", api.token_name)
        # Presented by another owner: places of its own, at the ends.
        stolen = api.post(
            "/api/v1/sets", json={**asked, "owner": "thief", "places": places}
        )
        _turned_away(stolen, "LOCKKEEPER_MAX_WAITERS")
        assert all(stolen.get_json()["places"][r] > places[r] for r in places)
        # The set's own retry, turned away again, keeps the same places.
        again = api.post("/api/v1/sets", json={**asked, "places": places})
        _turned_away(again, "LOCKKEEPER_MAX_WAITERS")
        assert again.get_json()["places"] == places
        assert _lines(app) == {
            "room:a": ["w-set", "later", "thief"],
            "room:b": ["w-set", "thief"],
            "room:c": ["seated"],
        }
        assert api.delete("/api/v1/locks/room:c", json={"owner": "holder"}).status_code
        assert seated.result(timeout=GRANTED_WITHIN).status_code == 200
    assert api.delete("/api/v1/locks/room:a", json={"owner": "holder"}).status_code
    # The seat is free again: the retry waits from its places, first in both
    # lines, and is granted before the later waiter.
    granted = api.post("/api/v1/sets", json={**asked, "places": places})
    assert granted.status_code == 200, granted.get_json()
    assert [lock["owner"] for lock in granted.get_json()["locks"]] == ["w-set"] * 2
    assert _lines(app) == {
        "room:a": ["later", "thief"],
        "room:b": ["thief"],
        "room:c": [],
    }


def test_a_set_whose_wait_runs_out_and_rejoins_keeps_its_places(make_app, monkeypatch):
    """A waiting set that says its wait goes on (``rejoin``) keeps its place
    in every member's line when its wait runs out: the 409 names them, and
    the next request that presents them waits from there, ahead of a waiter
    that came meanwhile. Its last request (no ``rejoin``) leaves every line;
    so does a set that did not ask."""
    _keep_places_for(monkeypatch, 30.0)
    app = make_app()
    api = ApiClient(app)
    assert api.post("/api/v1/locks/room:a", json={"owner": "holder"}).status_code
    asked = {"owner": "w-set", "wait": 0.1, "members": MEMBERS}
    plain = api.post("/api/v1/sets", json=asked)
    assert plain.status_code == 409
    assert "places" not in plain.get_json()
    assert _lines(app) == {"room:a": [], "room:b": [], "room:c": []}

    ran_out = api.post("/api/v1/sets", json={**asked, "places": {}, "rejoin": True})
    assert ran_out.status_code == 409
    assert ran_out.get_json()["refused"] == "room:a"
    places = ran_out.get_json()["places"]
    assert sorted(places) == ["room:a", "room:b"]
    assert _lines(app)["room:a"] == _lines(app)["room:b"] == ["w-set"]
    _join_behind(app, "room:a", "later", api.token_name)
    again = api.post("/api/v1/sets", json={**asked, "places": places, "rejoin": True})
    assert again.status_code == 409
    assert again.get_json()["places"] == places
    assert _lines(app)["room:a"] == ["w-set", "later"]
    # Freed while the places are kept: the next request is granted first.
    assert api.delete("/api/v1/locks/room:a", json={"owner": "holder"}).status_code
    granted = api.post(
        "/api/v1/sets", json={**asked, "wait": 5, "places": places, "rejoin": True}
    )
    assert granted.status_code == 200, granted.get_json()
    assert _lines(app) == {"room:a": ["later"], "room:b": [], "room:c": []}
    released = api.delete(
        "/api/v1/sets", json={"owner": "w-set", "resources": ["room:a", "room:b"]}
    )
    assert released.status_code == 200

    # The last request of a wait leaves every line, its places presented.
    assert api.post("/api/v1/locks/room:b", json={"owner": "holder"}).status_code
    kept = api.post("/api/v1/sets", json={**asked, "places": {}, "rejoin": True})
    last = api.post("/api/v1/sets", json={**asked, "places": kept.get_json()["places"]})
    assert last.status_code == 409
    assert "places" not in last.get_json()
    assert _lines(app)["room:b"] == []


@pytest.mark.parametrize(
    "places",
    [
        [1],
        {"room:elsewhere": 1},
        {"room:a": 0},
        {"room:a": "1"},
        {"room:a": True},
        {"room a": 1},  # not a resource's name
        {"": 1},
        # More places than a set has members (LOCKKEEPER_MAX_SET_SIZE, 16).
        {f"room:{n}": 1 for n in range(17)},
    ],
)
def test_places_that_are_not_the_sets_are_refused(make_app, places):
    """``places`` maps the set's own members to places in line, else a 400
    naming it, and nothing written."""
    app = make_app()
    api = ApiClient(app)
    refused = api.post(
        "/api/v1/sets",
        json={"owner": "w-set", "wait": 1, "members": MEMBERS, "places": places},
    )
    assert refused.status_code == 400, refused.get_json()
    assert refused.headers["Content-Type"] == "application/problem+json"
    assert "places" in str(refused.get_json()["errors"])
    assert _lines(app) == {"room:a": [], "room:b": [], "room:c": []}
    assert _row_names(app) == []


class _Statuses(httpx.HTTPTransport):
    """An HTTP transport that notes the status of every answer."""

    def __init__(self):
        super().__init__()
        self.statuses: list[int] = []

    def handle_request(self, request):
        response = super().handle_request(request)
        self.statuses.append(response.status_code)
        return response


def _later_single(
    service, resource: str, owner: str, granted: list[str], wait: float = 30.0
):
    """A single acquire waiting in ``resource``'s line on another instance
    for up to ``wait`` seconds, released as soon as it is granted; its
    thread. ``granted`` gets its owner, or what it raised."""

    def run():
        try:
            if service.acquire(resource, owner, ttl=30, wait=wait).acquired:
                granted.append(owner)
                service.release(resource, owner)
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            granted.append(repr(exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_lock_all_turned_away_is_not_overtaken_by_a_later_waiter(make_app, monkeypatch):
    """The worker client's ``lock_all`` asks for its places to be kept and
    presents them: a set the full room turned away is served before a single
    waiter that came after it (without kept places, the later one, in line,
    went first)."""
    from lockkeeper_client import LockClient

    _keep_places_for(monkeypatch, 30.0)
    crowded = make_app(LOCKKEEPER_MAX_WAITERS=1)
    elsewhere = make_app()  # another instance: a waiting room of its own
    with serve(crowded) as server, elsewhere.app_context():
        service = lock_service()
        assert service.acquire("room:a", "holder", ttl=30).acquired
        lines_at_grant: dict[str, list[str]] = {}
        answers = _Statuses()

        def seated():
            with (
                LockClient(server.url, server.token) as client,
                client.lock("room:a", ttl=30, wait=60, owner="seated"),
            ):
                pass

        def the_set():
            with (
                LockClient(server.url, server.token, transport=answers) as client,
                client.lock_all(["room:a", "room:b"], ttl=30, wait=60, owner="set"),
            ):
                lines_at_grant["set"] = _owners(service, "room:a")

        first = threading.Thread(target=seated, daemon=True)
        first.start()
        _poll(lambda: _owners(service, "room:a") == ["seated"], "the room's seat")
        second = threading.Thread(target=the_set, daemon=True)
        second.start()
        _poll(lambda: 503 in answers.statuses, "the full room's 503")
        _poll(
            lambda: (
                _owners(service, "room:a") == ["seated", "set"]
                and _owners(service, "room:b") == ["set"]
            ),
            "the set's kept places",
        )
        granted: list[str] = []
        later = _later_single(service, "room:a", "later", granted)
        _poll(lambda: "later" in _owners(service, "room:a"), "later in line")
        service.release("room:a", "holder")
        for thread in (first, second, later):
            thread.join(GRANTED_WITHIN)
            assert not thread.is_alive()
    assert lines_at_grant["set"] == ["later"]  # served before the later one
    assert granted == ["later"]


def test_lock_all_waiting_past_the_servers_max_wait_is_not_overtaken(
    make_app, monkeypatch
):
    """A set's wait longer than the server's ``LOCKKEEPER_MAX_WAIT`` is a
    run of requests: each that runs out keeps the set's places and the next
    presents them, so a single waiter that came later is not served first
    (before, each request left every line and the next joined at the ends)."""
    from lockkeeper_client import LockClient

    _keep_places_for(monkeypatch, 30.0)
    short = make_app(LOCKKEEPER_MAX_WAIT=0.3)
    elsewhere = make_app(LOCKKEEPER_MAX_WAIT=300.0)  # an instance that waits long
    with serve(short) as server, elsewhere.app_context():
        service = lock_service()
        assert service.acquire("room:b", "holder", ttl=300).acquired
        lines_at_grant: dict[str, list[str]] = {}
        answers = _Statuses()

        def the_set():
            with (
                LockClient(server.url, server.token, transport=answers) as client,
                client.lock_all(["room:a", "room:b"], ttl=30, wait=240, owner="set"),
            ):
                lines_at_grant["set"] = _owners(service, "room:b")

        first = threading.Thread(target=the_set, daemon=True)
        first.start()
        _poll(lambda: _owners(service, "room:b") == ["set"], "the set in line")
        granted: list[str] = []
        later = _later_single(service, "room:b", "later", granted, wait=240)
        _poll(lambda: "later" in _owners(service, "room:b"), "later in line")
        # Two of the set's requests run out after later joined: it rejoined.
        ran_out = answers.statuses.count(409)
        _poll(
            lambda: answers.statuses.count(409) >= ran_out + 2,
            "the set's requests running out",
            seconds=120,
        )
        service.release("room:b", "holder")
        for thread in (first, later):
            thread.join(GRANTED_WITHIN)
            assert not thread.is_alive()
    assert lines_at_grant["set"] == ["later"]  # served before the later one
    assert granted == ["later"]


# -- the purge: what a set that never came back for its places left ----------


def test_the_purge_keeps_a_row_under_a_live_place_and_sweeps_a_sets_lapsed_ones(
    make_app, clock
):
    """A set's kept places hold up its members' free rows (made for it) only
    while they are live. Its client rejoins for more than the purge's age: the
    free row made at its first request is that old, but a live place is in its
    line, so the purge keeps it, and a later single acquire still queues behind
    the set. Its client then never comes back: once its places have lapsed
    longer than the purge's age, the purge deletes the free row and the lapsed
    places (nothing left behind for good), and leaves the held member's row."""
    app = make_app(LOCKKEEPER_CLOCK=clock)
    age = timedelta(minutes=1)
    members = [Member("gone:a"), Member("gone:b")]
    with app.app_context():
        service = lock_service()
        assert service.acquire("gone:b", "holder", ttl=3600).acquired

        def rejoined(places):
            result = service.acquire_set(
                members, "w-set", ttl=30, wait=0.05, places=places, rejoin=True
            )
            assert not result.acquired, result
            assert sorted(result.places) == ["gone:a", "gone:b"], result
            return result.places

        places = rejoined({})
        assert _row_names(app) == ["gone:a", "gone:b"]  # gone:a's made for it
        clock.advance(age.total_seconds() + 1)
        places = rejoined(places)  # lapsed: at the end of each line again
        assert service.purge_stale(age) == []
        assert _row_names(app) == ["gone:a", "gone:b"]
        later = service.acquire("gone:a", "later", ttl=30)
        assert not later.acquired, "a later acquire went ahead of the set"

        clock.advance(PLACE_KEPT_FOR + age.total_seconds())
        assert service.purge_stale(age) == []
        assert _row_names(app) == ["gone:b"]
        with service.engine.connect() as conn:
            left = conn.scalars(
                select(LockWaiter.id).where(LockWaiter.resource.like("gone:%"))
            ).all()
        assert left == []


def test_a_rejoining_set_keeps_its_own_places_though_its_request_ran_late(make_app):
    """As a single rejoin: the set's own places are taken back whatever their
    deadline; places merely presented must be live."""
    app = make_app()
    with app.app_context():
        service = lock_service()
        core = service.core

        def asks(owner: str, *names: str) -> list[Ask]:
            made = [Ask(name, owner, None, 30.0) for name in names]
            if core.dialect != "sqlite":  # join_lines makes SQLite's rows itself
                service.sets.create_rows(made)
            return made

        mine = asks("set-rejoiner", "sj:1", "sj:2")
        own, _ = join_lines(core, mine, 0, slack=timedelta(0))
        kept, _ = join_lines(core, mine, 5, own, timedelta(0), own=True)
        assert kept == own
        theirs = asks("set-late", "sj:3", "sj:4")
        presented, _ = join_lines(core, theirs, 0, slack=timedelta(0))
        again, _ = join_lines(core, theirs, 5, presented, timedelta(0))
        assert set(again.values()).isdisjoint(presented.values())
