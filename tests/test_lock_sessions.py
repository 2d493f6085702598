"""Sessions through the API on every database: one heartbeat renews every bound
grant, expiry makes them all stale at one instant, an end releases them all."""

from __future__ import annotations

import pytest
from lockkeeper_core.models import LockEvent, LockSession
from sqlalchemy import func, select

from app.extensions import db, lock_service
from tests.test_api_locks import assert_problem

pytestmark = pytest.mark.usefixtures("backend")


def start(api, owner="w-7", ttl=15):
    response = api.post("/api/v1/sessions", json={"owner": owner, "ttl": ttl})
    assert response.status_code == 201, response.get_data(as_text=True)
    return response.get_json()


def bind(api, session, resource, owner="w-7", **extra):
    return api.post(
        f"/api/v1/locks/{resource}",
        json={"owner": owner, "session": session["id"], **extra},
    )


def count(app, query):
    with app.app_context(), db.engine.connect() as conn:
        return conn.scalar(query)


def events(app, action):
    return count(
        app,
        select(func.count()).select_from(LockEvent).where(LockEvent.action == action),
    )


def test_create_answers_the_session(api):
    body = start(api)
    assert body == {
        "id": body["id"],
        "owner": "w-7",
        "token": "worker",
        "ttl": 15.0,
        "created_at": "2026-11-30T09:00:00.000000Z",
        "expires_at": "2026-11-30T09:00:15.000000Z",
        "last_heartbeat": "2026-11-30T09:00:00.000000Z",
        "ttl_remaining": 15.0,
        "locks": [],
    }
    assert len(body["id"]) >= 32


def test_a_bound_grant_expires_with_its_session(api, clock):
    session = start(api)
    response = bind(api, session, "job:1")
    assert response.status_code == 200, response.get_data(as_text=True)
    lock = response.get_json()["lock"]
    assert lock["expires_at"] == session["expires_at"]
    assert lock["token"] == "worker"
    clock.advance(10)
    beat = api.patch(f"/api/v1/sessions/{session['id']}")
    assert beat.status_code == 200
    assert beat.get_json()["expires_at"] == "2026-11-30T09:00:25.000000Z"
    assert api.get("/api/v1/locks/job:1").get_json()["expires_at"] == (
        "2026-11-30T09:00:25.000000Z"
    )
    read = api.get(f"/api/v1/sessions/{session['id']}").get_json()
    assert [lock["resource"] for lock in read["locks"]] == ["job:1"]
    assert read["last_heartbeat"] == "2026-11-30T09:00:10.000000Z"


def test_fifty_grants_one_heartbeat_one_instant_one_end(api, clock, fake_app):
    session = start(api, ttl=15)
    for n in range(50):
        assert bind(api, session, f"job:{n}").status_code == 200
    clock.advance(10)
    assert api.patch(f"/api/v1/sessions/{session['id']}").status_code == 200
    with fake_app.app_context():
        service = lock_service()
        found = service.list_locks(prefix="job:", limit=100).items
        assert len(found) == 50
        assert {lock.expires_at.isoformat() for lock in found} == {
            "2026-11-30T09:00:25+00:00"
        }
        # Just before the instant all are held; at it, all are stale.
        clock.advance(15 - 0.000001)
        assert service.counts()["stale"] == 0
        clock.advance(0.000001)
        assert service.counts()["stale"] == 50
    # A late heartbeat does not revive them.
    late = api.patch(f"/api/v1/sessions/{session['id']}")
    assert_problem(late, 409)
    with fake_app.app_context():
        assert lock_service().counts()["stale"] == 50


def test_end_releases_every_grant_with_an_event_each(api, fake_app):
    session = start(api)
    for n in range(50):
        assert bind(api, session, f"job:{n}").status_code == 200
    response = api.delete(f"/api/v1/sessions/{session['id']}")
    assert response.status_code == 204
    assert events(fake_app, "released") == 50
    with fake_app.app_context():
        assert lock_service().counts() == {"held": 0, "expiring": 0, "stale": 0}
    assert count(fake_app, select(func.count()).select_from(LockSession)) == 0
    assert_problem(api.get(f"/api/v1/sessions/{session['id']}"), 404)
    # Free again for anyone.
    other = api.with_token("other")
    assert other.post("/api/v1/locks/job:3", json={"owner": "x"}).status_code == 200


def test_a_session_belongs_to_its_token(api):
    session = start(api)
    other = api.with_token("other")
    for method in ("get", "patch", "delete"):
        response = getattr(other, method)(f"/api/v1/sessions/{session['id']}")
        assert_problem(response, 404)
    assert_problem(bind(other, session, "job:1"), 404)
    assert_problem(api.patch("/api/v1/sessions/nope"), 404)


def test_bad_session_acquires_are_refused_and_change_nothing(api, clock, fake_app):
    session = start(api)
    both = bind(api, session, "job:1", ttl=5)
    assert assert_problem(both, 400)["errors"][0]["field"] == "session"
    wrong_owner = bind(api, session, "job:1", owner="w-8")
    assert assert_problem(wrong_owner, 400)["errors"][0]["field"] == "owner"
    bad = api.post("/api/v1/locks/job:1", json={"owner": "w-7", "session": "a/b"})
    assert_problem(bad, 400)
    clock.advance(15)
    assert_problem(bind(api, session, "job:1"), 409)
    assert events(fake_app, "acquired") == 0


def test_a_held_resource_refuses_a_session_grant(api):
    other = api.with_token("other")
    assert other.post("/api/v1/locks/job:1", json={"owner": "x"}).status_code == 200
    session = start(api)
    response = bind(api, session, "job:1")
    assert response.status_code == 409
    assert response.get_json()["lock"]["owner"] == "x"


def test_a_dead_sessions_waiters_get_in_at_its_expiry(api, clock, fake_app):
    """The killed worker never ends its session: at its expiry its grants are
    stale, and the next acquire takes them over."""
    session = start(api, ttl=5)
    assert bind(api, session, "job:1").status_code == 200
    other = api.with_token("other")
    assert other.post("/api/v1/locks/job:1", json={"owner": "x"}).status_code == 409
    clock.advance(5)
    taken = other.post("/api/v1/locks/job:1", json={"owner": "x"})
    assert taken.status_code == 200
    assert events(fake_app, "took_over") == 1
    # The new tenure is bound to no session: it renews as any lock does.
    renewed = other.patch("/api/v1/locks/job:1", json={"owner": "x", "ttl": 60})
    assert renewed.status_code == 200, renewed.get_data(as_text=True)
    # The dead session's end releases nothing of the new holder's.
    assert api.delete(f"/api/v1/sessions/{session['id']}").status_code == 204
    assert api.get("/api/v1/locks/job:1").get_json()["owner"] == "x"
    assert events(fake_app, "released") == 0


def test_a_session_ttl_is_checked(api):
    response = api.post("/api/v1/sessions", json={"owner": "w-7", "ttl": 0})
    assert_problem(response, 400)
    assert_problem(api.post("/api/v1/sessions", json={}), 400)


def test_acquires_heartbeats_and_an_end_race_without_losing_a_grant(app):
    """Real threads on the real clock: grants bound while heartbeats run are all
    renewed together and all released by the end; nothing deadlocks for good."""
    import threading

    with app.app_context():
        service = lock_service()
        session = service.sessions.create("w-7", 30, token="race")
        errors: list[BaseException] = []
        stop = threading.Event()

        def acquire(worker: int) -> None:
            try:
                with app.app_context():
                    for n in range(10):
                        result = service.acquire(
                            f"race:{worker}:{n}",
                            "w-7",
                            session=session.id,
                            token="race",
                        )
                        assert result.acquired
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        def heartbeat() -> None:
            try:
                with app.app_context():
                    while not stop.is_set():
                        service.sessions.heartbeat(session.id, token="race")
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        beating = threading.Thread(target=heartbeat)
        beating.start()
        workers = [threading.Thread(target=acquire, args=(w,)) for w in range(4)]
        for thread in workers:
            thread.start()
        for thread in workers:
            thread.join(60)
        stop.set()
        beating.join(60)
        assert errors == []
        found = service.sessions.get(session.id, token="race")
        assert len(found.locks) == 40
        assert {lock.expires_at for lock in found.locks} == {found.expires_at}
        ended = service.sessions.end(session.id, token="race", actor="race")
        assert len(ended.locks) == 40
        assert service.counts() == {"held": 0, "expiring": 0, "stale": 0}


def test_a_bound_grant_is_renewed_by_its_session_not_on_its_own(api, clock):
    session = start(api)
    assert bind(api, session, "job:1").status_code == 200
    refused = api.patch("/api/v1/locks/job:1", json={"owner": "w-7", "ttl": 600})
    assert "renew the session" in assert_problem(refused, 409)["detail"]
    lock = api.get("/api/v1/locks/job:1").get_json()
    assert lock["expires_at"] == session["expires_at"]
    # Released on its own, it leaves the session; the session goes on.
    assert api.delete("/api/v1/locks/job:1?owner=w-7").status_code == 204
    assert api.patch(f"/api/v1/sessions/{session['id']}").status_code == 200
    assert api.get(f"/api/v1/sessions/{session['id']}").get_json()["locks"] == []


def test_a_plain_reacquire_of_a_bound_grant_is_refused_and_keeps_it_bound(api, clock):
    """Acquiring one's own session-bound grant with a ttl would move its expiry
    off the session's: refused like the renew (on PostgreSQL by the acquire
    function, migration 0018); through the session it is a re-acquire."""
    session = start(api)
    granted = bind(api, session, "job:1")
    assert granted.status_code == 200
    fence = granted.get_json()["lock"]["fence"]
    refused = api.post("/api/v1/locks/job:1", json={"owner": "w-7", "ttl": 600})
    body = assert_problem(refused, 409)
    assert "renew the session" in body["detail"]
    assert session["id"] in body["detail"]
    lock = api.get("/api/v1/locks/job:1").get_json()
    assert lock["expires_at"] == session["expires_at"]
    assert lock["fence"] == fence
    clock.advance(2)
    renewed = api.patch(f"/api/v1/sessions/{session['id']}").get_json()
    assert (
        api.get("/api/v1/locks/job:1").get_json()["expires_at"]
        == (renewed["expires_at"])
    )
    again = bind(api, session, "job:1")
    assert again.status_code == 200
    assert again.get_json()["lock"]["fence"] == fence


def test_purge_stale_removes_sessions_expired_as_long_ago(service, clock, fake_app):
    from datetime import timedelta

    old = service.sessions.create("w-1", 5, token="t")
    assert service.acquire("job:old", "w-1", session=old.id, token="t").acquired
    clock.advance(3600)
    fresh = service.sessions.create("w-2", 5, token="t")
    assert service.purge_stale(timedelta(minutes=30)) == ["job:old"]
    assert count(fake_app, select(func.count()).select_from(LockSession)) == 1
    assert service.sessions.get(fresh.id, token="t").owner == "w-2"


def test_a_session_bound_acquire_waits_in_line_and_binds_when_granted(app):
    with app.app_context():
        service = lock_service()
        assert service.acquire("job:w", "x", ttl=1, token="other").acquired
        session = service.sessions.create("w-7", 30, token="t")
        granted = service.acquire(
            "job:w", "w-7", session=session.id, token="t", wait=10
        )
        assert granted.acquired
        assert granted.lock.expires_at == session.expires_at
        found = service.sessions.get(session.id, token="t")
        assert [lock.resource for lock in found.locks] == ["job:w"]


# -- a session of no token, through the service -------------------------------


@pytest.mark.parametrize(
    ("limit", "mode"), [(1, "exclusive"), (3, "exclusive"), (1, "shared")]
)
def test_a_session_of_no_token_releases_a_grant_bound_by_a_caller_of_none(
    service, limit, mode
):
    """A direct caller of the service: a session made for no token (``""``)
    and a grant bound to it by a caller passing ``token=None``. The grant is
    recorded under the session's token, so it is the session's own: a second
    bind is a re-acquire (same fence), the session lists it and its end
    releases it (an exclusive grant was written with a NULL token, which the
    end did not find, and stayed held until its expiry)."""
    from lockkeeper_core.sessions import Session

    session: Session = service.sessions.create("w-1", 30, token="")

    def bind():
        return service.acquire(
            "nt:1", "w-1", token=None, session=session.id, limit=limit, mode=mode
        )

    first = bind()
    assert first.acquired
    again = bind()
    assert again.acquired
    assert again.lock.fence == first.lock.fence
    found = service.sessions.get(session.id, token="")
    assert [lock.resource for lock in found.locks] == ["nt:1"]
    ended = service.sessions.end(session.id, token="", actor="w-1")
    assert [lock.resource for lock in ended.locks] == ["nt:1"]
    assert service.holders("nt:1").holders == []


def test_a_set_bound_to_a_session_of_no_token_ends_with_it(service):
    from lockkeeper_core.values import Member

    session = service.sessions.create("w-1", 30, token="")
    members = [Member("nt:a", 1, "exclusive"), Member("nt:b", 2, "exclusive")]
    result = service.acquire_set(members, "w-1", token=None, session=session.id)
    assert result.acquired
    ended = service.sessions.end(session.id, token="", actor="w-1")
    assert sorted(lock.resource for lock in ended.locks) == ["nt:a", "nt:b"]
    assert service.holders("nt:a").holders == []
    assert service.holders("nt:b").holders == []
