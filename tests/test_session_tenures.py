"""The history of a session-bound grant, on every database: its event names
its session, and its heartbeat (which writes no event) moves its expiry, so
the audit page and the timeline read its end from its session: held while the
session lives, ran out at the session's expiry once it ended, and, once the
session's row is gone, ran out when the event that ended it recorded (a
take-over, an operator's force-release or claim, a grant that cleared it, the
session's end or purge)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from lockkeeper_core.errors import LockChanged
from lockkeeper_core.models import DistributedLock as LockRow
from lockkeeper_core.models import LockHolder
from lockkeeper_core.state import Action
from sqlalchemy import func, select

from app.audit.service import EventFilter, list_events, tenures
from app.audit.tenures import ENDINGS, GRANTS
from app.extensions import lock_service
from tests.dashboard_helpers import soup
from tests.test_lock_sessions import bind, count, start

pytestmark = pytest.mark.usefixtures("backend")


def page_of(app, resource):
    with app.app_context():
        page = list_events(EventFilter(resource=resource))
        return page, tenures(page.items)


def bar_titles(viewer, resource, owner):
    page = soup(viewer.get(f"/locks/{resource}"))
    return [
        bar.find("title").get_text()
        for bar in page.select("svg.timeline rect.tenure")
        if bar.find("title").get_text().startswith(f"{owner},")
    ]


def test_a_session_bound_holder_is_held_while_its_session_lives_and_ends_with_it(
    api, viewer, clock, fake_app
):
    other = api.with_token("other")
    session = start(api, ttl=15)
    bound = bind(api, session, "sem:s", limit=3)
    assert bound.status_code == 200, bound.get_data(as_text=True)
    for _ in range(2):
        clock.advance(10)
        assert api.patch(f"/api/v1/sessions/{session['id']}").status_code == 200
    # At 20 s, past the 15 s the grant's event recorded, another holder.
    taken = other.post(
        "/api/v1/locks/sem:s", json={"owner": "x", "ttl": 600, "limit": 3}
    )
    assert taken.status_code == 200
    page, found = page_of(fake_app, "sem:s")
    grant = next(e for e in page.items if e.owner == "w-7")
    assert grant.details == {"session": session["id"]}
    # Still held: it did not run out at 15 s ("held for 15 s until it expired").
    assert grant.id not in found.started
    assert bar_titles(viewer, "sem:s", "w-7")[0].endswith("(held)")

    # No heartbeat after 20 s: the session ends at 35 s; a holder at 50 s.
    clock.advance(30)
    later = other.post(
        "/api/v1/locks/sem:s", json={"owner": "y", "ttl": 600, "limit": 3}
    )
    assert later.status_code == 200
    page, found = page_of(fake_app, "sem:s")
    ran_out = found.started[grant.id]
    assert (ran_out.held_for, ran_out.ended_by) == (timedelta(seconds=35), "expired")
    [title] = bar_titles(viewer, "sem:s", "w-7")
    assert "09:00:35" in title
    assert title.endswith("(expired)")

    # The session's row purged: the grant at 50 s that cleared the expired
    # holder recorded that it ran out at its session's expiry (not the 15 s
    # its grant's event said, nor "time unknown").
    with fake_app.app_context():
        clock.advance(86400 * 8)
        lock_service().purge_stale(timedelta(days=7))
    page, found = page_of(fake_app, "sem:s")
    ran_out = found.started[grant.id]
    assert (ran_out.held_for, ran_out.ended_by) == (timedelta(seconds=35), "expired")
    [recorded] = [e for e in page.items if e.id == ran_out.end_id]
    assert (recorded.action, recorded.details) == (
        Action.RELEASED,
        {"session": session["id"], "session_expired": True},
    )
    [title] = bar_titles(viewer, "sem:s", "w-7")
    assert "09:00:35" in title
    assert title.endswith("(expired)")
    html = soup(viewer.get("/audit?resource=sem:s"))
    held = html.select_one(f"#event-{grant.id} td.held").get_text(" ", strip=True)
    assert "time unknown" not in held


def test_a_session_bound_exclusive_grant_released_by_its_session_end(
    api, viewer, clock, fake_app
):
    session = start(api, ttl=15)
    assert bind(api, session, "job:s").status_code == 200
    clock.advance(10)
    assert api.patch(f"/api/v1/sessions/{session['id']}").status_code == 200
    clock.advance(10)  # 20 s: past the 15 s its event recorded
    page, found = page_of(fake_app, "job:s")
    [grant] = page.items
    assert grant.details == {"session": session["id"]}
    assert bar_titles(viewer, "job:s", "w-7")[0].endswith("(held)")
    clock.advance(2)
    assert api.delete(f"/api/v1/sessions/{session['id']}").status_code == 204
    page, found = page_of(fake_app, "job:s")
    ended = found.started[grant.id]
    assert (ended.held_for, ended.ended_by) == (timedelta(seconds=22), "released")
    released = next(e for e in page.items if e.action is Action.RELEASED)
    assert found.ended[released.id] == ended


def test_a_late_end_records_when_its_expired_sessions_grants_ran_out(
    api, viewer, clock, fake_app
):
    """Ended after it expired, the session's row is gone: the grants still
    bound to it ran out at its expiry (moved by its heartbeat), and the
    history says so, not "time unknown"."""
    session = start(api, ttl=15)
    assert bind(api, session, "job:late").status_code == 200
    assert bind(api, session, "sem:late", limit=3).status_code == 200
    clock.advance(10)
    assert api.patch(f"/api/v1/sessions/{session['id']}").status_code == 200
    clock.advance(40)  # 50 s: the session ran out at 25 s
    assert api.delete(f"/api/v1/sessions/{session['id']}").status_code == 204
    for resource in ("job:late", "sem:late"):
        page, found = page_of(fake_app, resource)
        grant = next(e for e in page.items if e.action is Action.ACQUIRED)
        ran_out = found.started[grant.id]
        assert (ran_out.held_for, ran_out.ended_by) == (
            timedelta(seconds=25),
            "expired",
        ), resource
        [recorded] = [e for e in page.items if e.id == ran_out.end_id]
        assert recorded.action is Action.RELEASED
        assert recorded.occurred_at == grant.occurred_at + timedelta(seconds=25)
        assert recorded.actor is None
        assert recorded.details == {"session": session["id"], "session_expired": True}
        [title] = bar_titles(viewer, resource, "w-7")
        assert "09:00:25" in title
        assert title.endswith("(expired)")
    # Ended as of the expiry, not revived: the row free, the holder gone; a
    # later force-release finds nothing to end a second time.
    owner = select(LockRow.owner).where(LockRow.resource == "job:late")
    assert count(fake_app, owner) is None
    holders = select(func.count()).where(LockHolder.resource == "sem:late")
    assert count(fake_app, holders) == 0
    page, found = page_of(fake_app, "job:late")
    assert [e.action for e in page.items].count(Action.RELEASED) == 1


def test_a_purged_sessions_grants_still_on_record_ran_out_at_its_expiry(
    api, clock, fake_app
):
    session = start(api, ttl=15)
    assert bind(api, session, "job:purged").status_code == 200
    assert bind(api, session, "sem:purged", limit=3).status_code == 200
    clock.advance(10)
    assert api.patch(f"/api/v1/sessions/{session['id']}").status_code == 200
    with fake_app.app_context():
        clock.advance(86400 * 8)
        assert lock_service().purge_stale(timedelta(days=7)) == ["job:purged"]
        assert lock_service().sessions.live() == 0
    for resource in ("job:purged", "sem:purged"):
        page, found = page_of(fake_app, resource)
        grant = next(e for e in page.items if e.action is Action.ACQUIRED)
        ran_out = found.started[grant.id]
        assert (ran_out.held_for, ran_out.ended_by) == (
            timedelta(seconds=25),
            "expired",
        ), resource
        assert ran_out.end_id is not None
    # A second purge finds nothing more to record.
    with fake_app.app_context():
        assert lock_service().purge_stale(timedelta(days=7)) == []
    page, _ = page_of(fake_app, "job:purged")
    assert [e.action for e in page.items].count(Action.RELEASED) == 1


def test_a_purged_sessions_rows_go_in_the_transaction_that_records_their_end(
    api, clock, fake_app
):
    """Deleting an expired session records its grants' ends and deletes
    their rows at once: a stale row left for the stale purge's next
    transaction could be taken over in between, ending the same tenure a
    second time (``released`` at the session's expiry, then ``taken_over``)."""
    session = start(api, ttl=15)
    assert bind(api, session, "job:between").status_code == 200
    with fake_app.app_context():
        clock.advance(86400 * 8)
        service = lock_service()
        cutoff = service.now() - timedelta(days=7)
        # The session's transaction alone, as if the purge stopped after it.
        assert service.sessions.purge_expired(cutoff, 100) == ["job:between"]
        owner = select(LockRow.owner).where(LockRow.resource == "job:between")
        assert count(fake_app, owner) is None
        assert service.acquire("job:between", "next", ttl=60, token="t").acquired
    page, found = page_of(fake_app, "job:between")
    ends = [e.action for e in page.items if e.action in ENDINGS]
    assert ends == [Action.RELEASED]
    grant = next(e for e in page.items if e.owner == "w-7" and e.action in GRANTS)
    assert found.started[grant.id].ended_by == "expired"


def test_a_purge_removes_a_sessions_holder_beside_a_live_one(api, clock, fake_app):
    """A session's expired holder on a resource whose row a purge keeps
    (another holder lives past the cutoff) goes with its session's row: its
    end is recorded once, and a later force-release finds nothing to end."""
    other = api.with_token("other")
    session = start(api, ttl=15)
    bound = bind(api, session, "sem:left", limit=3)
    assert bound.status_code == 200, bound.get_data(as_text=True)
    fence = bound.get_json()["lock"]["fence"]
    live = other.post(
        "/api/v1/locks/sem:left", json={"owner": "x", "ttl": 600, "limit": 3}
    )
    assert live.status_code == 200
    with fake_app.app_context():
        clock.advance(120)
        lock_service().purge_stale(timedelta(minutes=1))
        holders = select(func.count()).where(LockHolder.fence == fence)
        assert count(fake_app, holders) == 0
        with pytest.raises(LockChanged):
            lock_service().force_release_holder(
                "sem:left", fence, actor="alice", reason="left behind"
            )
    page, found = page_of(fake_app, "sem:left")
    ends = [e for e in page.items if e.fence == fence and e.action in ENDINGS]
    assert [e.action for e in ends] == [Action.RELEASED]
    grant = next(e for e in page.items if e.fence == fence and e.action in GRANTS)
    assert found.started[grant.id].ended_by == "expired"


def holders_of(app, resource):
    return count(
        app,
        select(func.count())
        .select_from(LockHolder)
        .where(LockHolder.resource == resource),
    )


def ran_out_unseen(api, clock, resource, **extra):
    """A grant bound to a session whose heartbeat at 10 s moved its expiry to
    25 s (no event says so); returns the session and the grant's fence, at
    30 s."""
    session = start(api, ttl=15)
    bound = bind(api, session, resource, **extra)
    assert bound.status_code == 200, bound.get_data(as_text=True)
    clock.advance(10)
    assert api.patch(f"/api/v1/sessions/{session['id']}").status_code == 200
    clock.advance(20)
    return session, bound.get_json()["lock"]["fence"]


def assert_ran_out_at_25_s_once_purged(app, clock, resource, ended_by):
    with app.app_context():
        clock.advance(86400 * 8)
        lock_service().purge_stale(timedelta(days=7))
    page, found = page_of(app, resource)
    grant = next(e for e in page.items if e.owner == "w-7" and e.action in GRANTS)
    ran_out = found.started[grant.id]
    assert (ran_out.held_for, ran_out.ended_by) == (timedelta(seconds=25), "expired")
    [end] = [e for e in page.items if e.id == ran_out.end_id]
    assert end.action is ended_by


def test_an_operators_force_release_records_when_a_session_bound_grant_ran_out(
    api, clock, fake_app
):
    ran_out_unseen(api, clock, "job:forced")
    with fake_app.app_context():
        lock_service().force_release("job:forced", actor="alice", reason="stuck")
    assert_ran_out_at_25_s_once_purged(
        fake_app, clock, "job:forced", Action.FORCE_RELEASED
    )


def test_an_operators_release_of_stale_locks_records_when_they_ran_out(
    api, clock, fake_app
):
    ran_out_unseen(api, clock, "job:stale")
    with fake_app.app_context():
        lock_service().release_stale(actor="alice", reason="sweep", prefix="job:")
    assert_ran_out_at_25_s_once_purged(
        fake_app, clock, "job:stale", Action.FORCE_RELEASED
    )


def test_an_operators_claim_records_when_a_session_bound_grant_ran_out(
    api, clock, fake_app
):
    ran_out_unseen(api, clock, "job:claimed")
    with fake_app.app_context():
        lock_service().claim("job:claimed", "ops", 600, actor="alice", reason="mine")
    assert_ran_out_at_25_s_once_purged(fake_app, clock, "job:claimed", Action.CLAIMED)


def test_an_operators_force_release_of_a_session_bound_holder_records_its_expiry(
    api, clock, fake_app
):
    _, fence = ran_out_unseen(api, clock, "sem:forced", limit=3)
    with fake_app.app_context():
        lock_service().force_release_holder(
            "sem:forced", fence, actor="alice", reason="stuck"
        )
    assert_ran_out_at_25_s_once_purged(
        fake_app, clock, "sem:forced", Action.FORCE_RELEASED
    )


@pytest.mark.parametrize("shared", [False, True], ids=["place", "shared"])
def test_an_exclusive_grant_over_run_out_holders_records_when_they_ran_out(
    api, clock, fake_app, shared
):
    """A resource a session's holder (or shared grant) held, run out, granted
    exclusive: the grant clears the holder's row and records, before its own
    event, that it ran out at its session's expiry; the session's late end
    finds nothing left to record."""
    extra = {"mode": "shared"} if shared else {"limit": 3}
    session, fence = ran_out_unseen(api, clock, "job:was-sem", **extra)
    taken = api.with_token("other").post(
        "/api/v1/locks/job:was-sem", json={"owner": "x", "ttl": 600}
    )
    assert taken.status_code == 200, taken.get_data(as_text=True)
    assert holders_of(fake_app, "job:was-sem") == 0
    assert api.delete(f"/api/v1/sessions/{session['id']}").status_code == 204
    page, _ = page_of(fake_app, "job:was-sem")
    ends = [e for e in page.items if e.fence == fence and e.action in ENDINGS]
    assert [e.action for e in ends] == [Action.RELEASED]
    grant = next(e for e in page.items if e.owner == "x")
    assert ends[0].id < grant.id
    assert_ran_out_at_25_s_once_purged(fake_app, clock, "job:was-sem", Action.RELEASED)


def test_an_operators_claim_over_run_out_holders_records_when_they_ran_out(
    api, clock, fake_app
):
    ran_out_unseen(api, clock, "job:claimed-sem", limit=3)
    with fake_app.app_context():
        lock_service().claim(
            "job:claimed-sem", "ops", 600, actor="alice", reason="mine"
        )
    assert holders_of(fake_app, "job:claimed-sem") == 0
    assert_ran_out_at_25_s_once_purged(
        fake_app, clock, "job:claimed-sem", Action.RELEASED
    )
