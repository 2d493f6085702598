"""Freezes (423, the list) and the fence check over the JSON API, on every
database, and the worker client's side of both."""

from __future__ import annotations

import pytest
from lockkeeper_client import FenceRejected, LockClient, LockFrozen

from app.extensions import lock_service

LOCK = "/api/v1/locks/billing:42"


def freeze(app, prefix="billing:", **kwargs):
    with app.app_context():
        return lock_service().freeze(
            prefix, actor="alice", reason=kwargs.pop("reason", "migration"), **kwargs
        )


@pytest.mark.usefixtures("backend")
def test_acquire_under_a_freeze_is_a_423_problem_naming_the_freeze(api, fake_app):
    freeze(fake_app)
    response = api.post(LOCK, json={"owner": "w-1"})
    assert response.status_code == 423
    assert response.mimetype == "application/problem+json"
    body = response.get_json()
    assert body["freeze"]["prefix"] == "billing:"
    assert body["freeze"]["reason"] == "migration"
    assert body["freeze"]["actor"] == "alice"
    assert body["freeze"]["ends_at"] is None
    assert "billing:" in body["detail"]
    assert api.get(LOCK).status_code == 404


@pytest.mark.usefixtures("backend")
def test_renew_and_release_go_on_under_a_freeze(api, fake_app):
    assert api.post(LOCK, json={"owner": "w-1", "ttl": 60}).status_code == 200
    freeze(fake_app)
    assert api.patch(LOCK, json={"owner": "w-1", "ttl": 60}).status_code == 200
    assert api.post(LOCK, json={"owner": "w-1", "ttl": 60}).status_code == 200
    assert api.delete(LOCK, json={"owner": "w-1"}).status_code == 204
    assert api.post(LOCK, json={"owner": "w-1"}).status_code == 423


@pytest.mark.usefixtures("backend")
def test_freezes_are_listed_until_they_end(api, fake_app, clock):
    from datetime import timedelta

    freeze(fake_app, "billing:", duration=timedelta(minutes=10))
    freeze(fake_app, "audit:", reason="export running")
    body = api.get("/api/v1/freezes").get_json()
    assert [(f["prefix"], f["reason"]) for f in body["freezes"]] == [
        ("audit:", "export running"),
        ("billing:", "migration"),
    ]
    assert body["freezes"][1]["ends_at"].endswith("Z")
    clock.advance(600)
    body = api.get("/api/v1/freezes").get_json()
    assert [f["prefix"] for f in body["freezes"]] == ["audit:"]
    assert api.post(LOCK, json={"owner": "w-1"}).status_code == 200


@pytest.mark.usefixtures("backend")
def test_fence_check_answers_200_only_for_the_valid_grant(api, clock):
    lock = api.post(LOCK, json={"owner": "w-1", "ttl": 10}).get_json()["lock"]
    fence = lock["fence"]
    ok = api.get(f"{LOCK}?fence={fence}")
    assert ok.status_code == 200
    assert ok.get_json()["fence"] == fence

    wrong = api.get(f"{LOCK}?fence={fence + 1}")
    assert wrong.status_code == 409
    assert wrong.mimetype == "application/problem+json"
    assert wrong.get_json()["lock"]["fence"] == fence

    clock.advance(11)
    expired = api.get(f"{LOCK}?fence={fence}")
    assert expired.status_code == 409
    assert expired.get_json()["lock"]["state"] == "stale"

    api.post(LOCK, json={"owner": "w-2"})
    api.delete(LOCK, json={"owner": "w-2"})
    free = api.get(f"{LOCK}?fence={fence}")
    assert free.status_code == 409
    assert free.get_json()["lock"] is None


@pytest.mark.parametrize("fence", ["0", "-3", "x", "1.5", "", "9" * 30])
def test_fence_check_with_a_bad_fence_is_a_400(api, fence):
    response = api.get(f"{LOCK}?fence={fence}")
    assert response.status_code == 400
    assert response.get_json()["errors"][0]["field"] == "fence"


# -- the worker client -------------------------------------------------------------


@pytest.fixture
def worker(live_server):
    with LockClient(live_server.url, live_server.token, timeout=5) as lock_client:
        yield lock_client


def test_client_check_fence_returns_the_lock_or_raises(worker):
    lock = worker.acquire("job:1", "w-1", ttl=30).lock
    assert worker.check_fence("job:1", lock.fence).fence == lock.fence
    with pytest.raises(FenceRejected) as rejected:
        worker.check_fence("job:1", lock.fence + 1)
    assert rejected.value.current.fence == lock.fence
    assert "job:1" in str(rejected.value)
    worker.release("job:1", "w-1")
    with pytest.raises(FenceRejected) as rejected:
        worker.check_fence("job:1", lock.fence)
    assert rejected.value.current is None


def test_client_maps_a_freeze_to_lock_frozen(live_server, worker):
    with live_server.service() as locks:
        locks.freeze("job:", actor="alice", reason="migration")
    with pytest.raises(LockFrozen) as frozen:
        worker.acquire("job:1", "w-1")
    assert frozen.value.freeze["prefix"] == "job:"
    assert frozen.value.freeze["reason"] == "migration"
    assert "migration" in str(frozen.value)
    with pytest.raises(LockFrozen):
        with worker.lock("job:2", ttl=5, wait=5):
            pass
