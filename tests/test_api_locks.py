"""Every outcome of the lock API (docs/api.md's table), through the test client,
on every database, on a fake clock."""

from __future__ import annotations

import re

import pytest
from lockkeeper_core.results import AcquireResult

pytestmark = pytest.mark.usefixtures("backend")

RFC3339_Z = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z")


def acquire(api, resource="job:42", owner="w-1", ttl=30):
    body = {"owner": owner} if ttl is None else {"owner": owner, "ttl": ttl}
    return api.post(f"/api/v1/locks/{resource}", json=body)


def assert_problem(response, status: int) -> dict:
    assert response.status_code == status, response.get_data(as_text=True)
    assert response.mimetype == "application/problem+json"
    body = response.get_json()
    assert body["status"] == status
    assert body["instance"] == response.request.path
    assert {"type", "title", "detail"} <= body.keys()
    return body


def events_of(api, resource="job:42") -> list[dict]:
    response = api.get(f"/api/v1/locks/{resource}/events")
    assert response.status_code == 200
    return response.get_json()["events"]


# -- acquire ------------------------------------------------------------------


def test_acquire_of_free_resource_grants_it(api):
    response = acquire(api)
    assert response.status_code == 200
    body = response.get_json()
    assert body["acquired"] is True
    lock = body["lock"]
    assert lock == {
        "resource": "job:42",
        "owner": "w-1",
        "token": "worker",
        "fence": lock["fence"],
        "acquired_at": "2026-11-30T09:00:00.000000Z",
        "expires_at": "2026-11-30T09:00:30.000000Z",
        "ttl_remaining": 30.0,
        "state": "held",
        "waiters": 0,
        "limit": 1,
        "mode": "exclusive",
        "holders": 1,
    }
    assert isinstance(lock["fence"], int)
    assert lock["fence"] >= 1


def test_acquire_without_ttl_uses_the_default(api):
    lock = acquire(api, ttl=None).get_json()["lock"]
    assert lock["expires_at"] == "2026-11-30T09:00:30.000000Z"


def test_fractional_ttl_keeps_microseconds(api):
    lock = acquire(api, ttl=0.2505).get_json()["lock"]
    assert lock["expires_at"] == "2026-11-30T09:00:00.250500Z"
    assert RFC3339_Z.fullmatch(lock["acquired_at"])
    # Judged against its own ttl: a grant just made is not expiring, however
    # short that ttl.
    assert lock["state"] == "held"


def test_acquire_of_lock_held_by_another_is_409_naming_the_holder(api, clock):
    first = acquire(api, owner="w-1").get_json()["lock"]
    clock.advance(10.5)
    response = acquire(api, owner="w-2")
    assert response.status_code == 409
    assert response.mimetype == "application/json"
    body = response.get_json()
    assert body["acquired"] is False
    assert body["lock"]["owner"] == "w-1"
    assert body["lock"]["fence"] == first["fence"]
    assert body["lock"]["ttl_remaining"] == pytest.approx(19.5)
    # ceil(19.5): a worker that waits this long finds the lock expired.
    assert response.headers["Retry-After"] == "20"


def test_retry_after_is_at_least_one_second(api, clock):
    acquire(api, owner="w-1", ttl=1)
    clock.advance(0.9)
    response = acquire(api, owner="w-2")
    assert response.status_code == 409
    assert response.headers["Retry-After"] == "1"


def test_refused_acquire_writes_no_event(api):
    acquire(api, owner="w-1")
    acquire(api, owner="w-2")
    assert [event["action"] for event in events_of(api)] == ["acquired"]


def test_same_owner_reacquire_keeps_fence_and_moves_both_timestamps(api, clock):
    first = acquire(api, owner="w-1").get_json()["lock"]
    clock.advance(20)
    response = acquire(api, owner="w-1", ttl=60)
    assert response.status_code == 200
    again = response.get_json()["lock"]
    assert again["fence"] == first["fence"]
    assert again["acquired_at"] == "2026-11-30T09:00:20.000000Z"
    assert again["expires_at"] == "2026-11-30T09:01:20.000000Z"
    assert events_of(api)[0]["action"] == "reacquired"


def test_acquire_of_stale_lock_takes_over_with_a_new_fence(api, clock):
    first = acquire(api, owner="w-1").get_json()["lock"]
    clock.advance(31)
    response = acquire(api, owner="w-2")
    assert response.status_code == 200
    lock = response.get_json()["lock"]
    assert lock["owner"] == "w-2"
    assert lock["fence"] > first["fence"]
    event = events_of(api)[0]
    assert (event["action"], event["previous_owner"]) == ("took_over", "w-1")


def test_same_owner_acquire_after_expiry_is_a_new_grant_with_a_new_fence(api, clock):
    first = acquire(api, owner="w-1").get_json()["lock"]
    clock.advance(31)
    lock = acquire(api, owner="w-1").get_json()["lock"]
    assert lock["fence"] > first["fence"]


def test_events_name_the_token_as_actor(api):
    other = api.with_token("deploy-bot")
    acquire(other, owner="w-1")
    assert events_of(api)[0]["actor"] == "deploy-bot"


def test_acquire_whose_holder_vanished_while_deciding_is_503_retry_now(
    api, monkeypatch
):
    service = api.app.extensions["lockkeeper.locks"]
    monkeypatch.setattr(
        service, "acquire", lambda *args, **kwargs: AcquireResult(False, None)
    )
    response = acquire(api)
    assert_problem(response, 503)
    assert response.headers["Retry-After"] == "1"


# -- get ----------------------------------------------------------------------


def test_get_returns_the_valid_lock(api, clock):
    acquired = acquire(api).get_json()["lock"]
    clock.advance(20)
    response = api.get("/api/v1/locks/job:42")
    assert response.status_code == 200
    lock = response.get_json()
    assert lock["fence"] == acquired["fence"]
    assert lock["ttl_remaining"] == pytest.approx(10)
    assert lock["state"] == "expiring"


def test_get_of_absent_lock_is_404(api):
    body = assert_problem(api.get("/api/v1/locks/job:42"), 404)
    assert "job:42" in body["detail"]


def test_get_of_expired_lock_is_404(api, clock):
    acquire(api)
    clock.advance(30)
    assert_problem(api.get("/api/v1/locks/job:42"), 404)


# -- renew --------------------------------------------------------------------


def test_renew_moves_expiry_and_keeps_fence_and_acquired_at(api, clock):
    first = acquire(api).get_json()["lock"]
    clock.advance(25)
    response = api.patch("/api/v1/locks/job:42", json={"owner": "w-1", "ttl": 60})
    assert response.status_code == 200
    lock = response.get_json()
    assert lock["expires_at"] == "2026-11-30T09:01:25.000000Z"
    assert lock["acquired_at"] == first["acquired_at"]
    assert lock["fence"] == first["fence"]
    assert events_of(api)[0]["action"] == "renewed"


def test_renew_without_ttl_uses_the_default(api, clock):
    acquire(api, ttl=5)
    clock.advance(1)
    lock = api.patch("/api/v1/locks/job:42", json={"owner": "w-1"}).get_json()
    assert lock["expires_at"] == "2026-11-30T09:00:31.000000Z"


def test_renew_of_absent_lock_is_404(api):
    response = api.patch("/api/v1/locks/job:42", json={"owner": "w-1"})
    assert_problem(response, 404)


def test_renew_of_expired_lock_is_409(api, clock):
    acquire(api)
    clock.advance(30)
    response = api.patch("/api/v1/locks/job:42", json={"owner": "w-1"})
    assert_problem(response, 409)
    assert events_of(api)[0]["action"] == "acquired"


def test_renew_by_other_owner_is_409(api):
    acquire(api, owner="w-1")
    response = api.patch("/api/v1/locks/job:42", json={"owner": "w-2"})
    assert_problem(response, 409)


def test_renew_needs_an_owner(api):
    acquire(api)
    body = assert_problem(api.patch("/api/v1/locks/job:42", json={"ttl": 5}), 400)
    assert body["errors"] == [{"field": "owner", "message": "is required"}]


# -- release ------------------------------------------------------------------


def test_release_with_owner_in_body_is_204_and_frees_the_lock(api):
    acquire(api)
    response = api.delete("/api/v1/locks/job:42", json={"owner": "w-1"})
    assert response.status_code == 204
    assert response.get_data() == b""
    assert_problem(api.get("/api/v1/locks/job:42"), 404)
    assert events_of(api)[0]["action"] == "released"


def test_release_with_owner_in_query_is_204(api):
    acquire(api)
    response = api.delete("/api/v1/locks/job:42?owner=w-1")
    assert response.status_code == 204
    assert acquire(api, owner="w-2").status_code == 200


def test_a_release_answers_no_body_whatever_encodings_the_client_takes(api):
    acquire(api)
    response = api.delete(
        "/api/v1/locks/job:42?owner=w-1", headers={"Accept-Encoding": "gzip, br"}
    )
    assert response.status_code == 204
    assert response.get_data() == b""
    # Nothing to encode, so nothing varies with Accept-Encoding.
    assert "Content-Encoding" not in response.headers
    assert "Vary" not in response.headers
    assert response.headers["X-Content-Type-Options"] == "nosniff"


def test_release_of_absent_lock_is_404(api):
    assert_problem(api.delete("/api/v1/locks/job:42?owner=w-1"), 404)


def test_release_of_expired_lock_is_404(api, clock):
    acquire(api)
    clock.advance(31)
    assert_problem(api.delete("/api/v1/locks/job:42?owner=w-1"), 404)


def test_release_by_other_owner_is_forbidden(api):
    acquire(api, owner="w-1")
    assert_problem(api.delete("/api/v1/locks/job:42?owner=w-2"), 403)
    assert api.get("/api/v1/locks/job:42").get_json()["owner"] == "w-1"


def test_release_needs_an_owner(api):
    acquire(api)
    body = assert_problem(api.delete("/api/v1/locks/job:42"), 400)
    assert body["errors"][0]["field"] == "owner"


def test_release_with_different_owners_in_body_and_query_is_400(api):
    acquire(api)
    response = api.delete("/api/v1/locks/job:42?owner=w-2", json={"owner": "w-1"})
    assert assert_problem(response, 400)["errors"][0]["field"] == "owner"
    assert api.get("/api/v1/locks/job:42").status_code == 200


# -- list ---------------------------------------------------------------------


def list_locks(api, query: str = "") -> dict:
    response = api.get(f"/api/v1/locks{query}")
    assert response.status_code == 200, response.get_data(as_text=True)
    return response.get_json()


def resources(page: dict) -> list[str]:
    return [lock["resource"] for lock in page["locks"]]


@pytest.fixture
def three_states(api, clock):
    """stale:1 expired, expiring:1 with 6 s of its 16 s left, held:1 with 60 s
    left."""
    acquire(api, resource="stale:1", ttl=5)
    acquire(api, resource="expiring:1", owner="w-2", ttl=16)
    clock.advance(10)
    acquire(api, resource="held:1", ttl=60)
    return api


def test_list_without_filters_returns_every_row_by_resource(three_states):
    page = list_locks(three_states)
    assert resources(page) == ["expiring:1", "held:1", "stale:1"]
    assert page["next_cursor"] is None
    states = {lock["resource"]: lock["state"] for lock in page["locks"]}
    assert states == {"expiring:1": "expiring", "held:1": "held", "stale:1": "stale"}


@pytest.mark.parametrize("state", ["held", "expiring", "stale"])
def test_list_filters_by_state(three_states, state):
    assert resources(list_locks(three_states, f"?state={state}")) == [f"{state}:1"]


def test_list_state_all_is_every_row(three_states):
    assert len(list_locks(three_states, "?state=all")["locks"]) == 3


def test_list_filters_by_prefix_and_owner(three_states):
    assert resources(list_locks(three_states, "?prefix=held")) == ["held:1"]
    assert resources(list_locks(three_states, "?owner=w-2")) == ["expiring:1"]


def test_list_pages_with_cursor(api):
    for n in range(5):
        acquire(api, resource=f"job:{n}")
    first = list_locks(api, "?limit=2")
    assert resources(first) == ["job:0", "job:1"]
    second = list_locks(api, f"?limit=2&cursor={first['next_cursor']}")
    assert resources(second) == ["job:2", "job:3"]
    third = list_locks(api, f"?limit=2&cursor={second['next_cursor']}")
    assert resources(third) == ["job:4"]
    assert third["next_cursor"] is None


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("?state=locked", "state"),
        ("?limit=0", "limit"),
        ("?limit=501", "limit"),
        ("?limit=ten", "limit"),
        ("?limit=-1", "limit"),
        ("?cursor=not-a-cursor", "cursor"),
        ("?owner=" + "x" * 256, "owner"),
        ("?sort=resource", "sort"),
    ],
)
def test_list_with_bad_query_is_400_naming_the_parameter(api, query, field):
    body = assert_problem(api.get(f"/api/v1/locks{query}"), 400)
    assert field in [error["field"] for error in body["errors"]]


def test_service_busy_is_a_503_problem_with_retry_after(api, monkeypatch):
    from lockkeeper_core.errors import ServiceBusy

    def busy(*args, **kwargs):
        raise ServiceBusy("the database kept aborting the transaction; try again")

    service = api.app.extensions["lockkeeper.locks"]
    monkeypatch.setattr(service, "renew", busy)
    response = api.patch("/api/v1/locks/job:42", json={"owner": "w-1"})
    assert_problem(response, 503)
    assert response.headers["Retry-After"] == "1"


@pytest.mark.parametrize("name", [".", "..", "%2E", "%2e%2E"])
@pytest.mark.parametrize("method", ["POST", "GET", "PATCH", "DELETE"])
def test_dot_segments_are_no_resource_names(api, name, method):
    """A browser or proxy resolves /locks/.. away: such a lock could never be
    addressed, so the name is refused like any other bad one."""
    body = {"owner": "w-1"} if method == "DELETE" else {"owner": "w-1", "ttl": 5}
    response = api.open(method, f"/api/v1/locks/{name}", json=body)
    assert response.status_code == 400, response.get_data(as_text=True)
    assert [e["field"] for e in response.get_json()["errors"]] == ["resource"]
    events = api.get(f"/api/v1/events?resource={name}")
    assert events.status_code == 400


@pytest.mark.parametrize("name", [".", ".."])
def test_the_cli_refuses_dot_segments_too(fake_app, name):
    runner = fake_app.test_cli_runner()
    for args in (
        ["locks", "release", name, "--reason", "x"],
        ["locks", "claim", name, "--owner", "w", "--reason", "x"],
    ):
        result = runner.invoke(args=args)
        assert result.exit_code != 0
        assert "must not be . or .." in result.output
