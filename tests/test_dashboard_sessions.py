"""The lock page shows a grant's session; an operator ends it with a reason (every
grant force-released, one event each), on every database."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from app.extensions import db
from app.locks.models import LockEvent
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
