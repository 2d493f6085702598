"""Semaphores and shared grants through the API, on every database, on a fake
clock."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.usefixtures("backend")


def acquire(api, resource, owner, **fields):
    return api.post(
        f"/api/v1/locks/{resource}", json={"owner": owner, "ttl": 30, **fields}
    )


def test_a_semaphore_through_the_api(api, clock):
    first = acquire(api, "api:sem", "a", limit=2)
    assert first.status_code == 200, first.get_json()
    lock = first.get_json()["lock"]
    assert (lock["limit"], lock["mode"], lock["holders"]) == (2, "exclusive", 1)
    clock.advance(5)
    second = acquire(api, "api:sem", "b", limit=2).get_json()["lock"]
    assert second["holders"] == 2
    assert second["fence"] > lock["fence"]
    refused = acquire(api, "api:sem", "c", limit=2)
    assert refused.status_code == 409
    body = refused.get_json()
    assert body["acquired"] is False
    assert body["lock"]["owner"] == "a"  # the live grant that ends first
    assert refused.headers["Retry-After"] == "25"
    held = api.get("/api/v1/locks/api:sem/holders")
    assert held.status_code == 200
    listing = held.get_json()
    assert (listing["resource"], listing["limit"], listing["mode"]) == (
        "api:sem",
        2,
        "exclusive",
    )
    assert [h["owner"] for h in listing["holders"]] == ["a", "b"]
    assert listing["waiters"] == 0
    # GET with several live grants: the one that ends first.
    assert api.get("/api/v1/locks/api:sem").get_json()["owner"] == "a"
    # The fence check passes for any live grant.
    for fence in (lock["fence"], second["fence"]):
        assert api.get(f"/api/v1/locks/api:sem?fence={fence}").status_code == 200
    assert api.get("/api/v1/locks/api:sem?fence=999999").status_code == 409
    # Renew and release act on the caller's own grant.
    assert api.patch("/api/v1/locks/api:sem", json={"owner": "b"}).status_code == 200
    assert api.delete("/api/v1/locks/api:sem?owner=a").status_code == 204
    events = api.get("/api/v1/locks/api:sem/events").get_json()["events"]
    assert [(e["action"], e["mode"]) for e in events] == [
        ("released", "exclusive"),
        ("renewed", "exclusive"),
        ("acquired", "exclusive"),
        ("acquired", "exclusive"),
    ]


def test_another_limit_is_a_limit_mismatch_problem(api):
    acquire(api, "api:mm", "a", limit=3)
    response = acquire(api, "api:mm", "b", limit=4)
    assert response.status_code == 409
    assert response.mimetype == "application/problem+json"
    body = response.get_json()
    assert body["type"].endswith("limit-mismatch")
    assert body["limit"] == 3
    assert body["lock"]["owner"] == "a"
    shared = acquire(api, "api:mm", "b", mode="shared")
    assert shared.get_json()["type"].endswith("limit-mismatch")


def test_shared_grants_and_a_writer(api):
    for reader in ("r1", "r2"):
        granted = acquire(api, "api:rw", reader, mode="shared")
        assert granted.status_code == 200
        assert granted.get_json()["lock"]["mode"] == "shared"
    writer = acquire(api, "api:rw", "w")
    assert writer.status_code == 409
    assert writer.get_json()["lock"]["mode"] == "shared"
    listing = api.get("/api/v1/locks/api:rw/holders").get_json()
    assert listing["mode"] == "shared"
    assert len(listing["holders"]) == 2


@pytest.mark.parametrize(
    "fields",
    [
        {"limit": 0},
        {"limit": 1001},
        {"limit": "2"},
        {"mode": "read"},
        {"limit": 2, "mode": "shared"},
    ],
)
def test_bad_limit_or_mode_is_a_400_problem(api, fields):
    response = acquire(api, "api:bad", "w", **fields)
    assert response.status_code == 400
    assert response.mimetype == "application/problem+json"
    assert api.get("/api/v1/locks/api:bad/holders").get_json()["holders"] == []


def test_holders_of_a_free_resource_and_of_an_exclusive_lock(api):
    free = api.get("/api/v1/locks/api:none/holders").get_json()
    assert free == {
        "resource": "api:none",
        "limit": 1,
        "mode": "exclusive",
        "holders": [],
        "waiters": 0,
    }
    acquire(api, "api:x", "w")
    held = api.get("/api/v1/locks/api:x/holders").get_json()
    assert [h["owner"] for h in held["holders"]] == ["w"]
    assert api.post("/api/v1/locks/api:x/holders", json={}).status_code == 405


def test_the_lock_list_has_one_entry_per_live_grant(api, clock):
    for owner in ("a", "b"):
        assert acquire(api, "sem:pool", owner, limit=3).status_code == 200
    for owner in ("r-1", "r-2"):
        assert acquire(api, "rw:cfg", owner, mode="shared").status_code == 200
    listed = api.get("/api/v1/locks").get_json()["locks"]
    assert [(lock["resource"], lock["owner"]) for lock in listed] == [
        ("rw:cfg", "r-1"),
        ("rw:cfg", "r-2"),
        ("sem:pool", "a"),
        ("sem:pool", "b"),
    ]
    assert {(lock["mode"], lock["limit"], lock["holders"]) for lock in listed} == {
        ("shared", 1, 2),
        ("exclusive", 3, 2),
    }
    assert len({lock["fence"] for lock in listed}) == 4
    seen, cursor = [], None
    while True:
        query = {"limit": 1} if cursor is None else {"limit": 1, "cursor": cursor}
        page = api.get("/api/v1/locks", query_string=query).get_json()
        seen += [(lock["resource"], lock["fence"]) for lock in page["locks"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [(lock["resource"], lock["fence"]) for lock in listed]
    mine = api.get("/api/v1/locks", query_string={"owner": "b"}).get_json()["locks"]
    assert [(lock["resource"], lock["owner"]) for lock in mine] == [("sem:pool", "b")]


def test_a_session_bound_holder_names_its_session_in_the_lists(api):
    session = api.post("/api/v1/sessions", json={"owner": "w-7", "ttl": 15}).get_json()
    bound = api.post(
        "/api/v1/locks/sem:s",
        json={"owner": "w-7", "session": session["id"], "limit": 2},
    )
    assert bound.status_code == 200, bound.get_json()
    assert acquire(api, "sem:s", "w-8", limit=2).status_code == 200
    holders = api.get("/api/v1/locks/sem:s/holders").get_json()["holders"]
    listed = api.get("/api/v1/locks").get_json()["locks"]
    for grants in (holders, listed):
        assert {lock["owner"]: lock.get("session") for lock in grants} == {
            "w-7": session["id"],
            "w-8": None,
        }
