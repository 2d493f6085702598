"""The lock page shows a grant's session; an operator ends it with a reason (every
grant force-released, one event each), on every database."""

from __future__ import annotations

import pytest
from lockkeeper_core.models import LockEvent
from sqlalchemy import select

from app.extensions import db
from tests.dashboard_helpers import post, soup

pytestmark = pytest.mark.usefixtures("backend")


@pytest.fixture
def bound(service, clock):
    session = service.sessions.create("w-7", 15, token="worker")
    for resource in ("job:1", "job:2", "job:3"):
        assert service.acquire(
            resource, "w-7", session=session.id, token="worker"
        ).acquired
    clock.advance(4)
    return session


def test_the_lock_page_shows_the_grants_session(operator, bound):
    page = soup(operator.get("/locks/job:2"))
    shown = page.find(id="lock-session").get_text(" ", strip=True)
    assert "w-7" in shown
    assert "worker" in shown
    assert "4 s ago" in shown or "4s ago" in shown or "seconds ago" in shown, shown
    # The expiry as every coming instant: a countdown, the exact time on hover.
    assert "expires in 11 s" in shown
    assert page.select_one("#lock-session .ttl")["title"].startswith("2026-11-30")
    assert page.find(id="session-end")


def test_a_lock_of_no_session_shows_none(operator, service):
    service.acquire("job:9", "w-1", ttl=30)
    page = soup(operator.get("/locks/job:9"))
    assert page.find(id="lock-session") is None
    assert page.find(id="session-end") is None


def test_an_operator_ends_the_session_with_a_reason(operator, bound, service, fake_app):
    form = soup(operator.get(f"/sessions/{bound.id}/end?resource=job:2"))
    assert form.find("textarea", attrs={"name": "reason"})
    assert form.find("select", attrs={"name": "reason_choice"}).find_all("option")
    refused = post(operator, f"/sessions/{bound.id}/end", {"reason": ""})
    assert refused.status_code == 400
    assert service.counts()["stale"] == 0
    assert sum(service.counts().values()) == 3
    done = post(
        operator,
        f"/sessions/{bound.id}/end",
        {"reason": "worker wedged", "resource": "job:2", "next": "/locks/job:2"},
    )
    assert done.status_code == 303
    assert service.counts() == {"held": 0, "expiring": 0, "stale": 0}
    with db.engine.connect() as conn:
        rows = conn.execute(
            select(LockEvent.resource, LockEvent.actor, LockEvent.reason)
            .where(LockEvent.action == "force_released")
            .order_by(LockEvent.resource)
        ).all()
    assert [tuple(row) for row in rows] == [
        (f"job:{n}", "olga", "worker wedged") for n in (1, 2, 3)
    ]
    again = post(operator, f"/sessions/{bound.id}/end", {"reason": "again"})
    assert again.status_code == 404


def test_a_viewer_cannot_end_a_session(viewer, bound, service):
    assert viewer.get(f"/sessions/{bound.id}/end").status_code == 403
    assert post(viewer, f"/sessions/{bound.id}/end", {"reason": "x"}).status_code == 403
    assert service.counts()["stale"] == 0
    assert sum(service.counts().values()) == 3


def test_the_sessions_page_finds_an_overdue_session_and_ends_it(
    operator, service, clock, bound
):
    """A worker stopped sending heartbeats 40 s ago on a 15 s session: the page
    lists it first, overdue by 1.7 × ttl with its 3 bound locks; the live one
    after it. "End session…" ends it (CSRF, operator, reason, audit) and the
    row goes; the overview marks session-bound rows."""
    clock.advance(40 - 4)  # the bound session's last heartbeat: 40 s ago
    live = service.sessions.create("w-8", 60, token="worker")
    assert service.acquire("job:live", "w-8", session=live.id, token="worker").acquired
    page = soup(operator.get("/sessions"))
    rows = page.select("#sessions-table tbody tr")
    assert [row["id"] for row in rows] == [f"session-{bound.id}", f"session-{live.id}"]
    stuck = rows[0].get_text(" ", strip=True)
    assert "w-7" in stuck
    assert "worker" in stuck
    assert "overdue by 1.7 × ttl" in stuck
    assert "40 s ago" in stuck
    assert rows[0].select_one("td.number").get_text(strip=True) == "3"
    assert "overdue" not in rows[1].get_text(" ", strip=True)
    overview = soup(operator.get("/"))
    marks = overview.select("#locks-table .session-mark")
    assert len(marks) == 4  # job:1-3 (stale) and job:live
    assert marks[0]["href"].startswith("/sessions#session-")

    end = rows[0].select_one("a[id$='-end']")
    form = soup(operator.get(end["href"]))
    assert form.find("textarea", attrs={"name": "reason"})
    done = post(
        operator,
        f"/sessions/{bound.id}/end",
        {"reason": "worker wedged", "next": "/sessions"},
        htmx=True,
    )
    assert done.status_code == 200
    assert "Ended the session of w-7: it had expired" in soup(done).get_text()
    after = soup(
        operator.get(
            "/sessions", headers={"HX-Request": "true", "HX-Target": "sessions"}
        )
    )
    assert [row["id"] for row in after.select("#sessions-table tbody tr")] == [
        f"session-{live.id}"
    ]
    # Its grants ended as of its expiry, one event each; the locks are free.
    assert service.counts() == {"held": 1, "expiring": 0, "stale": 0}
    with db.engine.connect() as conn:
        ends = conn.execute(
            select(LockEvent.resource, LockEvent.occurred_at).where(
                LockEvent.action == "released"
            )
        ).all()
    assert sorted(resource for resource, _ in ends) == ["job:1", "job:2", "job:3"]
    assert {at for _, at in ends} == {bound.expires_at}


def test_ending_a_live_session_from_its_page_releases_its_locks(
    operator, service, bound
):
    page = soup(operator.get("/sessions"))
    end = page.select_one(f"#session-{bound.id}-end")
    assert end.get_text(" ", strip=True) == "End session… of w-7"
    done = post(
        operator,
        f"/sessions/{bound.id}/end",
        {"reason": "worker wedged", "next": "/sessions"},
        htmx=True,
    )
    assert "Ended the session of w-7: released 3 locks." in soup(done).get_text()
    assert service.counts() == {"held": 0, "expiring": 0, "stale": 0}
    with db.engine.connect() as conn:
        actors = conn.execute(
            select(LockEvent.actor, LockEvent.reason).where(
                LockEvent.action == "force_released"
            )
        ).all()
    assert {tuple(a) for a in actors} == {("olga", "worker wedged")}


def test_a_viewer_sees_the_sessions_but_no_end(viewer, bound):
    page = soup(viewer.get("/sessions"))
    assert len(page.select("#sessions-table tbody tr")) == 1
    assert not page.select("a[id$='-end']")
