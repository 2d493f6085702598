"""The JSON API of sets: ``/api/v1/sets`` (acquire, renew, release as one)."""

from __future__ import annotations

import contextlib

from jsonschema import Draft202012Validator
from lockkeeper_core.models import DistributedLock, LockWaiter
from sqlalchemy import select

from app.api.shapes import set_places
from app.extensions import lock_service
from tests.conftest import ApiClient
from tests.test_openapi import Conformance

MEMBERS = [
    {"resource": "acct:2"},
    {"resource": "acct:1", "mode": "shared"},
    {"resource": "pool:x", "limit": 3},
]


def test_a_set_is_acquired_renewed_and_released_as_one(api, clock):
    granted = api.post("/api/v1/sets", json={"owner": "w-1", "members": MEMBERS})
    assert granted.status_code == 200, granted.get_json()
    body = granted.get_json()
    assert body["acquired"] is True
    resources = [lock["resource"] for lock in body["locks"]]
    assert resources == ["acct:2", "acct:1", "pool:x"]
    assert [(lock["mode"], lock["limit"]) for lock in body["locks"]] == [
        ("exclusive", 1),
        ("shared", 1),
        ("exclusive", 3),
    ]
    assert len({lock["fence"] for lock in body["locks"]}) == 3
    set_id = body["set"]
    assert set_id
    names = ["acct:1", "acct:2", "pool:x"]
    renewed = api.patch(
        "/api/v1/sets", json={"owner": "w-1", "ttl": 90, "resources": names}
    )
    assert renewed.status_code == 200, renewed.get_json()
    assert [lock["ttl_remaining"] for lock in renewed.get_json()["locks"]] == [90] * 3
    released = api.delete(
        "/api/v1/sets",
        json={"owner": "w-1", "resources": [*names, "acct:none"]},
    )
    assert released.status_code == 200, released.get_json()
    body = released.get_json()
    assert [lock["resource"] for lock in body["released"]] == names
    assert body["not_held"] == ["acct:none"]
    # Each member's events name the set: its grant, renewal and release.
    history = api.get("/api/v1/locks/acct:1/events").get_json()["events"]
    assert [(e["action"], e["set"]) for e in reversed(history)] == [
        ("acquired", set_id),
        ("renewed", None),
        ("released", set_id),
    ]


def test_a_refused_set_names_its_member_and_the_grant_in_the_way(api, fake_app):
    other = api.with_token("other")
    assert other.post("/api/v1/locks/acct:1", json={"owner": "w-2"}).status_code == 200
    refused = api.post("/api/v1/sets", json={"owner": "w-1", "members": MEMBERS})
    assert refused.status_code == 409
    body = refused.get_json()
    assert (body["acquired"], body["refused"]) == (False, "acct:1")
    assert body["lock"]["owner"] == "w-2"
    assert int(refused.headers["Retry-After"]) >= 1
    with fake_app.app_context():
        # Nothing of the set was granted.
        assert lock_service().holders("acct:2").holders == []


def test_a_frozen_member_is_a_423_naming_it(api, fake_app):
    with fake_app.app_context():
        lock_service().freeze("pool:", actor="op", reason="maintenance")
    refused = api.post("/api/v1/sets", json={"owner": "w-1", "members": MEMBERS})
    assert refused.status_code == 423
    assert refused.mimetype == "application/problem+json"
    assert "'pool:x'" in refused.get_json()["detail"]


def test_every_member_must_be_in_the_tokens_scope(api):
    scoped = api.with_token("acct-only", prefixes=["acct:"])
    refused = scoped.post("/api/v1/sets", json={"owner": "w-1", "members": MEMBERS})
    assert refused.status_code == 403
    assert "pool:x" not in refused.get_data(as_text=True)
    for method in ("PATCH", "DELETE"):
        answer = scoped.open(
            method, "/api/v1/sets", json={"owner": "w", "resources": ["pool:x"]}
        )
        assert answer.status_code == 403
    inside = [m for m in MEMBERS if m["resource"].startswith("acct:")]
    granted = scoped.post("/api/v1/sets", json={"owner": "w-1", "members": inside})
    assert granted.status_code == 200


def test_a_set_past_the_bound_is_a_clear_400(make_app, clock):
    app = make_app(LOCKKEEPER_CLOCK=clock, LOCKKEEPER_MAX_SET_SIZE=2)
    api = ApiClient(app)
    refused = api.post("/api/v1/sets", json={"owner": "w-1", "members": MEMBERS})
    assert refused.status_code == 400
    assert refused.get_json()["errors"] == [
        {
            "field": "members",
            "message": "must hold at most 2 items (LOCKKEEPER_MAX_SET_SIZE)",
        }
    ]
    # The document served says the bound this server holds.
    document = app.test_client().get("/api/v1/openapi.json").get_json()
    assert document["components"]["schemas"]["SetMembers"]["maxItems"] == 2


def test_places_past_the_bound_are_a_clear_400_and_write_nothing(make_app, clock):
    """A set has a place in each member's line at most: ``places`` is bound
    as its members are (LOCKKEEPER_MAX_SET_SIZE), its keys are resources'
    names and its values places; else a 400 naming it, before the set is
    asked (no grant, no row, no place)."""
    app = make_app(LOCKKEEPER_CLOCK=clock, LOCKKEEPER_MAX_SET_SIZE=2)
    api = ApiClient(app)
    two = MEMBERS[:2]
    names = [m["resource"] for m in two]
    asked = {"owner": "w-1", "members": two, "wait": 1}
    for places, message in [
        (
            {"acct:1": 1, "acct:2": 2, "acct:3": 3},
            "must hold at most 2 entries (LOCKKEEPER_MAX_SET_SIZE)",
        ),
        ({"acct 1": 1}, "must be keyed by resources' names"),
        ({names[0]: 0}, "must be at least 1 and at most 9223372036854775807"),
    ]:
        refused = api.post("/api/v1/sets", json={**asked, "places": places})
        assert refused.status_code == 400, refused.get_json()
        assert refused.headers["Content-Type"] == "application/problem+json"
        assert refused.get_json()["errors"] == [{"field": "places", "message": message}]
    with app.app_context(), lock_service().engine.connect() as conn:
        assert conn.scalars(select(DistributedLock.resource)).all() == []
        assert conn.scalars(select(LockWaiter.id)).all() == []
    document = app.test_client().get("/api/v1/openapi.json").get_json()
    places = set_places(document["components"]["schemas"])
    assert [schema["maxProperties"] for schema in places] == [2, 2, 2]


def test_a_set_turned_away_keeping_its_places_is_answered_as_documented(
    make_app, clock
):
    """The waiting room's 503 to a set that asked for its places names them
    (WaitingRoomFullProblem, its ``places`` under the members' bound): the
    served document describes the answer, and one with more places than a
    set has members would not conform."""
    app = make_app(LOCKKEEPER_CLOCK=clock, LOCKKEEPER_MAX_SET_SIZE=2)
    api = ApiClient(app)
    two = MEMBERS[:2]
    held = api.post("/api/v1/locks/acct:2", json={"owner": "holder"})
    assert held.status_code == 200
    with app.app_context(), contextlib.ExitStack() as room:
        queue = lock_service().queue
        for _ in range(queue.max_waiters_per_token):
            room.enter_context(queue.seat(api.token_name))
        turned = api.post(
            "/api/v1/sets",
            json={"owner": "w-1", "members": two, "wait": 1, "places": {}},
        )
    assert turned.status_code == 503, turned.get_json()
    body = turned.get_json()
    assert body["setting"] == "LOCKKEEPER_MAX_WAITERS_PER_TOKEN"
    assert sorted(body["places"]) == ["acct:1", "acct:2"]
    document = app.test_client().get("/api/v1/openapi.json").get_json()
    Conformance(app, document).check(turned, "POST")
    problem = {
        **document["components"]["schemas"]["WaitingRoomFullProblem"],
        "components": document["components"],
    }
    assert Draft202012Validator(problem).is_valid(body)
    too_many = {**body, "places": {**body["places"], "acct:3": 1}}
    assert not Draft202012Validator(problem).is_valid(too_many)


def test_a_resource_named_twice_is_a_400(api):
    twice = [{"resource": "acct:1"}, {"resource": "acct:1", "mode": "shared"}]
    refused = api.post("/api/v1/sets", json={"owner": "w-1", "members": twice})
    assert refused.status_code == 400
    assert refused.get_json()["errors"] == [
        {"field": "members[1].resource", "message": "names a resource already named"}
    ]


def test_renewing_a_set_with_a_lost_member_is_refused_whole(api, clock):
    api.post("/api/v1/sets", json={"owner": "w-1", "ttl": 5, "members": MEMBERS[:1]})
    api.post("/api/v1/sets", json={"owner": "w-1", "ttl": 60, "members": MEMBERS[1:]})
    clock.advance(10)
    names = ["acct:1", "acct:2", "pool:x"]
    refused = api.patch("/api/v1/sets", json={"owner": "w-1", "resources": names})
    assert refused.status_code == 409
    assert "'acct:2'" in refused.get_json()["detail"]


def test_a_set_bound_to_a_session_ends_with_it(api, clock):
    session = api.post("/api/v1/sessions", json={"owner": "w-7", "ttl": 15}).get_json()
    both = api.post(
        "/api/v1/sets",
        json={"owner": "w-7", "ttl": 30, "session": session["id"], "members": MEMBERS},
    )
    assert both.status_code == 400
    unknown = api.post(
        "/api/v1/sets",
        json={"owner": "w-7", "session": "no-such-session", "members": MEMBERS},
    )
    assert unknown.status_code == 404
    granted = api.post(
        "/api/v1/sets",
        json={"owner": "w-7", "session": session["id"], "members": MEMBERS},
    )
    assert granted.status_code == 200, granted.get_json()
    locks = granted.get_json()["locks"]
    assert {lock["session"] for lock in locks} == {session["id"]}
    assert {lock["ttl_remaining"] for lock in locks} == {15}
    ended = api.delete(f"/api/v1/sessions/{session['id']}")
    assert ended.status_code in (200, 204)
    history = api.get("/api/v1/locks/pool:x/events").get_json()["events"]
    assert [(e["action"], e["set"]) for e in reversed(history)] == [
        ("acquired", granted.get_json()["set"]),
        ("released", granted.get_json()["set"]),
    ]
    clock.advance(20)
    expired = api.post("/api/v1/sessions", json={"owner": "w-8", "ttl": 5}).get_json()
    clock.advance(6)
    late = api.post(
        "/api/v1/sets",
        json={"owner": "w-8", "session": expired["id"], "members": MEMBERS},
    )
    assert late.status_code == 409


def test_a_set_that_waits_in_line_and_runs_out_leaves_every_line(api, fake_app):
    other = api.with_token("other")
    assert other.post("/api/v1/locks/acct:1", json={"owner": "w-2"}).status_code == 200
    too_long = api.post(
        "/api/v1/sets", json={"owner": "w-1", "wait": 3600, "members": MEMBERS}
    )
    assert too_long.status_code == 400
    refused = api.post(
        "/api/v1/sets", json={"owner": "w-1", "wait": 0.2, "members": MEMBERS}
    )
    assert refused.status_code == 409
    assert refused.get_json()["refused"] == "acct:1"
    with fake_app.app_context():
        for resource in ("acct:1", "acct:2", "pool:x"):
            assert lock_service().queue.line(resource) == []
