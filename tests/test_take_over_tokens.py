"""A take-over names the holder it took, owner and token, on every database:
one owner's grants under two tokens are told apart in the history."""

from __future__ import annotations

from datetime import timedelta

import pytest
from lockkeeper_core.state import Action

from app.audit.service import EventFilter, list_events, tenures
from app.extensions import lock_service
from tests.test_lock_sessions import bind, start

pytestmark = pytest.mark.usefixtures("backend")


def history(app, resource, action=None):
    with app.app_context():
        page = list_events(EventFilter(resource=resource, action=action))
        return page.items, tenures(page.items)


def only(items, action):
    [found] = [e for e in items if e.action is action]
    return found


def test_an_exclusive_take_over_names_the_token_it_took(api, clock, fake_app):
    assert (
        api.post("/api/v1/locks/job:t", json={"owner": "w", "ttl": 10}).status_code
        == 200
    )
    clock.advance(20)
    other = api.with_token("other")
    assert (
        other.post("/api/v1/locks/job:t", json={"owner": "x", "ttl": 10}).status_code
        == 200
    )
    items, _ = history(fake_app, "job:t")
    taken = only(items, Action.TOOK_OVER)
    assert (taken.previous_owner, taken.details) == ("w", {"previous_token": "worker"})


def test_a_take_over_of_a_grant_with_no_token_names_none(service, clock, fake_app):
    assert service.acquire("job:n", "w", 10).acquired
    clock.advance(20)
    assert service.acquire("job:n", "x", 10, token="worker").acquired
    items, _ = history(fake_app, "job:n")
    assert only(items, Action.TOOK_OVER).details == {"previous_token": ""}


def test_a_take_over_of_a_holder_ends_that_tokens_grant_not_its_owners_other(
    api, clock, fake_app
):
    """One owner, two tokens, two holders that both ran out: the holder taken
    over is the one that ended first (token "worker"); its take-over recorded
    the end of that grant, not of the other token's, on any page."""
    other = api.with_token("other")
    holder = {"owner": "w", "limit": 2}
    assert (
        api.post("/api/v1/locks/sem:t", json={**holder, "ttl": 10}).status_code == 200
    )
    assert (
        other.post("/api/v1/locks/sem:t", json={**holder, "ttl": 15}).status_code == 200
    )
    clock.advance(20)
    third = api.with_token("third")
    assert (
        third.post("/api/v1/locks/sem:t", json={**holder, "owner": "x"}).status_code
        == 200
    )
    items, found = history(fake_app, "sem:t")
    taken = only(items, Action.TOOK_OVER)
    assert (taken.previous_owner, taken.details) == ("w", {"previous_token": "worker"})
    by_token = {e.token: e for e in items if e.action is Action.ACQUIRED}
    mine, theirs = (
        found.started[by_token["worker"].id],
        found.started[by_token["other"].id],
    )
    assert (mine.ended_by, mine.held_for, mine.end_id) == (
        "expired",
        timedelta(seconds=10),
        taken.id,
    )
    assert (theirs.ended_by, theirs.held_for, theirs.end_id) == (
        "expired",
        timedelta(seconds=15),
        None,
    )
    assert found.ended[taken.id] == mine
    # The take-over alone on a page: its row still names the grant it ended
    # (the newer of the owner's two is the other token's).
    items, found = history(fake_app, "sem:t", action="took_over")
    assert [e.id for e in items] == [taken.id]
    assert (found.ended[taken.id].token, found.ended[taken.id].fence) == (
        "worker",
        by_token["worker"].fence,
    )


def test_a_take_over_records_the_end_of_a_session_bound_grant(api, clock, fake_app):
    """Its session gone, a session-bound grant's end is the take-over that
    names it, which recorded when it ran out: its session's expiry (moved by
    a heartbeat that wrote no event), not the expiry its grant's event
    recorded, nor "time unknown"."""
    session = start(api, ttl=15)
    assert bind(api, session, "job:s").status_code == 200
    clock.advance(10)
    assert api.patch(f"/api/v1/sessions/{session['id']}").status_code == 200
    clock.advance(20)  # 30 s: the session ran out at 25 s
    other = api.with_token("other")
    assert (
        other.post("/api/v1/locks/job:s", json={"owner": "x", "ttl": 10}).status_code
        == 200
    )
    with fake_app.app_context():
        clock.advance(86400 * 8)
        lock_service().purge_stale(timedelta(days=7))
    items, found = history(fake_app, "job:s")
    grant, taken = only(items, Action.ACQUIRED), only(items, Action.TOOK_OVER)
    ran_out_at = grant.occurred_at + timedelta(seconds=25)
    assert taken.details == {
        "previous_token": "worker",
        "previous_expires_at": ran_out_at.isoformat(timespec="microseconds"),
    }
    ran_out = found.started[grant.id]
    assert (ran_out.ended_by, ran_out.held_until, ran_out.end_id) == (
        "expired",
        ran_out_at,
        taken.id,
    )
    assert found.ended[taken.id] == ran_out


def test_a_take_over_of_a_session_bound_holder_records_when_it_ran_out(
    api, clock, fake_app
):
    session = start(api, ttl=15)
    assert bind(api, session, "sem:s", limit=2).status_code == 200
    other = api.with_token("other")
    holder = {"owner": "x", "ttl": 600, "limit": 2}
    assert other.post("/api/v1/locks/sem:s", json=holder).status_code == 200
    clock.advance(10)
    assert api.patch(f"/api/v1/sessions/{session['id']}").status_code == 200
    clock.advance(20)  # 30 s: the session ran out at 25 s; the semaphore is full
    third = api.with_token("third")
    assert (
        third.post("/api/v1/locks/sem:s", json={**holder, "owner": "y"}).status_code
        == 200
    )
    with fake_app.app_context():
        clock.advance(86400 * 8)
        lock_service().purge_stale(timedelta(days=7))
    items, found = history(fake_app, "sem:s")
    taken = only(items, Action.TOOK_OVER)
    assert taken.previous_owner == "w-7"
    grant = next(e for e in items if e.owner == "w-7")
    ran_out = found.started[grant.id]
    assert (ran_out.ended_by, ran_out.held_for, ran_out.end_id) == (
        "expired",
        timedelta(seconds=25),
        taken.id,
    )
