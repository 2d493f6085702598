"""Session-bound semaphore holders and shared grants on every database: a
heartbeat renews them (and their resource's places_until), expiry makes them
stale at the session's instant, an end releases them with one event each; a
session-bound exclusive acquire of a resource held by holders gets the answer an
unbound one gets."""

from __future__ import annotations

import json
import threading
import time

import pytest
from lockkeeper_core.errors import SessionExpired
from lockkeeper_core.models import LockEvent, LockHolder
from lockkeeper_core.state import Action
from lockkeeper_core.statements.common import locks
from lockkeeper_core.values import Ask
from sqlalchemy import func, select

from app.extensions import db, lock_service
from tests.row_waits import DEADLINE, RowHolder, run_blocked
from tests.test_api_locks import assert_problem
from tests.test_lock_sessions import bind, start

pytestmark = pytest.mark.usefixtures("backend")


def holder_rows(app, resource):
    """(owner, session_id, expires_at) of the resource's holder rows, and its
    places_until."""
    with app.app_context(), db.engine.connect() as conn:
        rows = conn.execute(
            select(LockHolder.owner, LockHolder.session_id, LockHolder.expires_at)
            .where(LockHolder.resource == resource)
            .order_by(LockHolder.owner)
        ).all()
        until = conn.scalar(
            select(locks.c.places_until).where(locks.c.resource == resource)
        )
    return [tuple(row) for row in rows], until


def released(app):
    with app.app_context(), db.engine.connect() as conn:
        return conn.execute(
            select(LockEvent.resource, LockEvent.mode)
            .where(LockEvent.action == "released")
            .order_by(LockEvent.resource)
        ).all()


def test_bound_holders_heartbeat_expire_and_end(api, clock, fake_app):
    other = api.with_token("other")
    assert (
        other.post(
            "/api/v1/locks/sem:1", json={"owner": "x", "ttl": 60, "limit": 2}
        ).status_code
        == 200
    )
    session = start(api, ttl=15)
    holder = bind(api, session, "sem:1", limit=2)
    assert holder.status_code == 200, holder.get_data(as_text=True)
    lock = holder.get_json()["lock"]
    assert (lock["limit"], lock["holders"], lock["expires_at"]) == (
        2,
        2,
        session["expires_at"],
    )
    shared = bind(api, session, "rw:1", mode="shared")
    assert shared.status_code == 200, shared.get_data(as_text=True)
    assert shared.get_json()["lock"]["mode"] == "shared"
    rows, _ = holder_rows(fake_app, "rw:1")
    assert rows[0][1] == session["id"]
    read = api.get(f"/api/v1/sessions/{session['id']}").get_json()
    assert [lock["resource"] for lock in read["locks"]] == ["rw:1", "sem:1"]

    # A heartbeat renews the holders and their resource's places_until.
    clock.advance(10)
    beat = api.patch(f"/api/v1/sessions/{session['id']}").get_json()
    rows, until = holder_rows(fake_app, "rw:1")
    assert len(rows) == 1
    assert rows[0][2] == until
    assert until.isoformat().startswith("2026-11-30T09:00:25")
    assert beat["expires_at"] == "2026-11-30T09:00:25.000000Z"
    holders = api.get("/api/v1/locks/sem:1/holders").get_json()["holders"]
    assert {h["owner"]: h["expires_at"] for h in holders}["w-7"] == beat["expires_at"]
    # places_until stays the latest expiry (the other holder's, 09:01:00).
    _, until = holder_rows(fake_app, "sem:1")
    assert until.isoformat().startswith("2026-11-30T09:01:00")
    # A writer is refused while the shared grant lives.
    writer = other.post("/api/v1/locks/rw:1", json={"owner": "y", "ttl": 30})
    assert writer.status_code == 409
    assert writer.get_json()["lock"]["owner"] == "w-7"

    # At the session's expiry its holders are stale at once.
    clock.advance(15)
    assert [
        h["owner"] for h in api.get("/api/v1/locks/sem:1/holders").get_json()["holders"]
    ] == ["x"]
    taken = other.post("/api/v1/locks/rw:1", json={"owner": "y", "ttl": 30})
    assert taken.status_code == 200, taken.get_data(as_text=True)
    assert_problem(api.patch(f"/api/v1/sessions/{session['id']}"), 409)


def test_an_end_releases_bound_holders_with_an_event_each(api, fake_app):
    session = start(api, ttl=15)
    for n in range(3):
        assert bind(api, session, f"sem:{n}", limit=3).status_code == 200
    assert bind(api, session, "rw:1", mode="shared").status_code == 200
    other = api.with_token("other")
    writer = other.post("/api/v1/locks/rw:1", json={"owner": "y", "ttl": 30})
    assert writer.status_code == 409
    assert api.delete(f"/api/v1/sessions/{session['id']}").status_code == 204
    assert [tuple(row) for row in released(fake_app)] == [
        ("rw:1", "shared"),
        ("sem:0", "exclusive"),
        ("sem:1", "exclusive"),
        ("sem:2", "exclusive"),
    ]
    for resource in ("rw:1", "sem:0"):
        rows, until = holder_rows(fake_app, resource)
        assert (rows, until) == ([], None)
    # The writer gets in.
    writer = other.post("/api/v1/locks/rw:1", json={"owner": "y", "ttl": 30})
    assert writer.status_code == 200, writer.get_data(as_text=True)


def test_a_bound_place_is_taken_again_through_its_session(api, clock, fake_app):
    session = start(api, ttl=15)
    assert bind(api, session, "sem:1", limit=2).status_code == 200
    clock.advance(5)
    again = bind(api, session, "sem:1", limit=2)
    assert again.status_code == 200
    assert again.get_json()["lock"]["expires_at"] == session["expires_at"]
    assert again.get_json()["lock"]["acquired_at"] == "2026-11-30T09:00:05.000000Z"
    rows, _ = holder_rows(fake_app, "sem:1")
    assert [row[1] for row in rows] == [session["id"]]


def test_a_session_acquire_of_a_resource_held_by_holders(api):
    """The answer an unbound acquire gets: 409 naming the grant that ends
    first, or a limit mismatch; not a retried race and a 503."""
    other = api.with_token("other")
    assert (
        other.post(
            "/api/v1/locks/rw:1", json={"owner": "r", "ttl": 30, "mode": "shared"}
        ).status_code
        == 200
    )
    assert (
        other.post(
            "/api/v1/locks/sem:1", json={"owner": "s", "ttl": 30, "limit": 3}
        ).status_code
        == 200
    )
    session = start(api)
    refused = bind(api, session, "rw:1")
    assert refused.status_code == 409, refused.get_data(as_text=True)
    assert refused.get_json()["lock"]["owner"] == "r"
    mismatch = bind(api, session, "sem:1")
    assert mismatch.status_code == 409
    body = mismatch.get_json()
    assert body["type"].endswith("limit-mismatch")
    assert (body["limit"], body["lock"]["owner"]) == (3, "s")
    assert (
        bind(api, session, "sem:1", limit=4)
        .get_json()["type"]
        .endswith("limit-mismatch")
    )


def test_the_sessions_sole_shared_grant_is_promoted_bound(api, fake_app):
    session = start(api)
    assert bind(api, session, "rw:1", mode="shared").status_code == 200
    promoted = bind(api, session, "rw:1")
    assert promoted.status_code == 200, promoted.get_data(as_text=True)
    lock = promoted.get_json()["lock"]
    assert (lock["mode"], lock["expires_at"]) == ("exclusive", session["expires_at"])
    read = api.get(f"/api/v1/sessions/{session['id']}").get_json()
    assert [lock["resource"] for lock in read["locks"]] == ["rw:1"]
    assert api.delete(f"/api/v1/sessions/{session['id']}").status_code == 204
    assert api.get("/api/v1/locks/rw:1").status_code in (200, 404)
    assert len(released(fake_app)) == 1


def test_every_session_bound_grant_names_its_session_on_its_event(api, fake_app):
    """Its heartbeats write no event: the grant's event says it is bound, so
    its history reads its end from the session (a holder, a shared grant, a
    promotion beside its from_mode, an exclusive grant and its re-acquire);
    an unbound grant's event names none."""
    session = start(api)
    assert bind(api, session, "sem:n", limit=2).status_code == 200
    assert bind(api, session, "rw:n", mode="shared").status_code == 200
    assert bind(api, session, "rw:n").status_code == 200  # promoted
    assert bind(api, session, "job:n").status_code == 200
    assert bind(api, session, "job:n").status_code == 200  # re-acquired
    plain = api.post("/api/v1/locks/job:plain", json={"owner": "w-7", "ttl": 30})
    assert plain.status_code == 200
    with fake_app.app_context(), db.engine.connect() as conn:
        rows = conn.execute(
            select(
                LockEvent.resource, LockEvent.action, LockEvent.details, LockEvent.fence
            ).order_by(LockEvent.id)
        ).all()
    bound = {"session": session["id"]}
    shared_fence = rows[1].fence
    assert [(r.resource, r.action, json.loads(r.details or "null")) for r in rows] == [
        ("sem:n", "acquired", bound),
        ("rw:n", "acquired", bound),
        (
            "rw:n",
            "acquired",
            {**bound, "from_mode": "shared", "from_fence": shared_fence},
        ),
        ("job:n", "acquired", bound),
        ("job:n", "reacquired", bound),
        ("job:plain", "acquired", None),
    ]


def test_a_waiter_gets_the_place_a_session_end_frees(app):
    """Real clock and threads: a writer waiting behind a session's shared grant
    is granted when the session ends."""
    with app.app_context():
        service = lock_service()
        session = service.sessions.create("w-7", 30, token="t")
        assert service.acquire(
            "rw:w", "w-7", session=session.id, token="t", mode="shared"
        ).acquired
        results = []
        waiting = threading.Event()

        def writer():
            with app.app_context():
                waiting.set()
                results.append(
                    service.acquire("rw:w", "y", ttl=30, token="other", wait=20)
                )

        thread = threading.Thread(target=writer)
        thread.start()
        assert waiting.wait(10)
        deadline = time.monotonic() + 10
        while service.get("rw:w").waiters == 0 and time.monotonic() < deadline:
            time.sleep(0.02)  # polls to a deadline for the writer in line
        assert service.get("rw:w").waiters == 1
        service.sessions.end(session.id, token="t", actor="w-7")
        thread.join(20)
        assert results
        assert results[0].acquired
        assert results[0].lock.owner == "y"
        with db.engine.connect() as conn:
            assert conn.scalar(select(func.count()).select_from(LockHolder)) == 0


def test_a_bound_holder_is_not_renewed_or_taken_again_on_its_own(api, fake_app):
    """Renewed only through its session: a plain re-acquire (with a ttl) or a
    PATCH of a bound holder is a 409 naming the session, and changes nothing."""
    session = start(api, ttl=15)
    for resource, extra in (("sem:1", {"limit": 2}), ("rw:1", {"mode": "shared"})):
        assert bind(api, session, resource, **extra).status_code == 200
        again = api.post(
            f"/api/v1/locks/{resource}", json={"owner": "w-7", "ttl": 600, **extra}
        )
        detail = assert_problem(again, 409)["detail"]
        assert session["id"] in detail
        assert "renew the session" in detail
        renewed = api.patch(
            f"/api/v1/locks/{resource}", json={"owner": "w-7", "ttl": 600}
        )
        assert session["id"] in assert_problem(renewed, 409)["detail"]
        rows, until = holder_rows(fake_app, resource)
        assert [row[1] for row in rows] == [session["id"]]
        assert rows[0][2] == until
        lock = api.get(f"/api/v1/locks/{resource}").get_json()
        assert lock["expires_at"] == session["expires_at"]
    read = api.get(f"/api/v1/sessions/{session['id']}").get_json()
    assert [lock["resource"] for lock in read["locks"]] == ["rw:1", "sem:1"]


def test_the_lock_json_names_its_session_when_bound(api, clock):
    from lockkeeper_client.grants import LockGrant

    session = start(api)
    granted = bind(api, session, "job:1").get_json()["lock"]
    assert granted["session"] == session["id"]
    holder = bind(api, session, "sem:1", limit=2).get_json()["lock"]
    assert holder["session"] == session["id"]
    clock.advance(5)
    assert api.patch(f"/api/v1/sessions/{session['id']}").status_code == 200
    assert api.get("/api/v1/locks/job:1").get_json()["session"] == session["id"]
    read = api.get(f"/api/v1/sessions/{session['id']}").get_json()
    assert {lock["session"] for lock in read["locks"]} == {session["id"]}
    plain = api.post("/api/v1/locks/job:2", json={"owner": "w-7", "ttl": 30})
    assert "session" not in plain.get_json()["lock"]
    assert "session" not in api.get("/api/v1/locks/job:2").get_json()
    # Released on its own, the grant leaves the session: the row is free.
    assert api.delete("/api/v1/locks/job:1?owner=w-7").status_code == 204
    again = api.post("/api/v1/locks/job:1", json={"owner": "w-7", "ttl": 30})
    assert "session" not in again.get_json()["lock"]
    # The client's LockGrant carries it; older servers send none.
    assert LockGrant.from_json(granted).session == session["id"]
    assert LockGrant.from_json(plain.get_json()["lock"]).session is None


def test_a_bound_exclusive_grant_is_not_demoted_on_its_own(api, fake_app):
    """A demotion is a re-acquire: of a session-bound exclusive grant, without
    the session, it is the 409 naming the session that a plain re-acquire
    gets, and the grant stays exclusive and bound. Through the session, it is
    demoted and stays bound."""
    session = start(api, ttl=15)
    assert bind(api, session, "rw:1").status_code == 200
    demoted = api.post(
        "/api/v1/locks/rw:1", json={"owner": "w-7", "ttl": 600, "mode": "shared"}
    )
    detail = assert_problem(demoted, 409)["detail"]
    assert session["id"] in detail
    lock = api.get("/api/v1/locks/rw:1").get_json()
    assert (lock["mode"], lock["expires_at"]) == ("exclusive", session["expires_at"])
    read = api.get(f"/api/v1/sessions/{session['id']}").get_json()
    assert [lock["resource"] for lock in read["locks"]] == ["rw:1"]

    through_session = bind(api, session, "rw:1", mode="shared")
    assert through_session.status_code == 200, through_session.get_data(as_text=True)
    lock = through_session.get_json()["lock"]
    assert (lock["mode"], lock["expires_at"]) == ("shared", session["expires_at"])
    read = api.get(f"/api/v1/sessions/{session['id']}").get_json()
    assert [lock["resource"] for lock in read["locks"]] == ["rw:1"]


def test_a_bound_exclusive_grant_where_a_semaphore_ran_out_sets_the_limit_to_1(
    api, clock
):
    """Once a semaphore's holders have all run out the resource is free, and the
    next grant sets its kind: a session's exclusive grant too, not a holder of
    the old limit that would let another holder in beside it."""
    other = api.with_token("other")
    semaphore = {"owner": "x", "ttl": 5, "limit": 2}
    assert other.post("/api/v1/locks/sem:was", json=semaphore).status_code == 200
    clock.advance(10)
    session = start(api, ttl=15)
    assert bind(api, session, "sem:was").status_code == 200
    found = api.get("/api/v1/locks/sem:was/holders").get_json()
    assert (found["limit"], found["mode"]) == (1, "exclusive")
    refused = other.post("/api/v1/locks/sem:was", json={"owner": "y", "ttl": 5})
    assert refused.status_code == 409


@pytest.mark.backends("postgresql", "mariadb")
def test_a_heartbeat_that_waited_past_its_sessions_expiry_renews_nothing(app):
    """A heartbeat waiting for the row of its session's holder while the
    session runs out, and the holder is taken over meanwhile (the taker holds
    the row, reads a later clock and finds the session expired): the heartbeat
    reads its clock once it holds that row, so it is refused, rather than
    answering a new expiry for a session whose holder is gone (the fault run's
    session-bound workload believed three holders of a semaphore of 2). The
    database's own clock throughout: a fake one is read before any lock."""
    resource = "sem:beat"
    with app.app_context():
        service = lock_service()
        service.acquire(resource, "other", ttl=600, token="t", limit=2)
        # The heartbeat must be waiting for the row before the session runs
        # out: a loaded machine gets a longer session.
        for ttl in (1.0, 2.0, 4.0, 8.0):
            session = service.sessions.create("o", ttl, token="t")
            try:
                bound = service.acquire(
                    resource, "o", session=session.id, token="t", limit=2
                )
            except SessionExpired:
                continue  # it ran out before its bind (seen at 1 s under load)
            assert bound.acquired
            with RowHolder(service, resource) as held:
                beat = run_blocked(
                    service,
                    lambda id_=session.id: service.sessions.heartbeat(id_, token="t"),
                )
                if service.now() >= session.expires_at:
                    continue  # it reached the row too late to show anything
                deadline = time.monotonic() + DEADLINE
                while service.now() <= session.expires_at:
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
                taken = held.finish(
                    lambda conn: service.core.transactional.acquire_holder(
                        conn, Ask(resource, "taker", "t", 60, limit=2), None
                    )
                )
                assert (taken.done, taken.action) == (True, Action.TOOK_OVER)
                with pytest.raises(SessionExpired):
                    beat.result(timeout=DEADLINE)
                break
        else:
            raise AssertionError("no heartbeat waited before its session ran out")
        owners, _ = holder_rows(app, resource)
        assert sorted(owner for owner, _, _ in owners) == ["other", "taker"]
