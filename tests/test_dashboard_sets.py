"""The dashboard groups a set's grants: the lock page and the history link to
the set's page, which lists its members; an operator releases the set as one
(one transaction, one event each naming the set and the reason), on every
database."""

from __future__ import annotations

import pytest
from lockkeeper_core.models import SHARED, LockEvent
from lockkeeper_core.values import Member
from sqlalchemy import select

from app.extensions import db
from tests.dashboard_helpers import post, soup

pytestmark = pytest.mark.usefixtures("backend")

MEMBERS = [Member("acct:1"), Member("acct:2", 1, SHARED), Member("pool:x", 3)]


@pytest.fixture
def taken(service):
    held = service.acquire_set(MEMBERS, "mover-1", ttl=300, token="worker")
    assert held.acquired
    return held


def test_a_members_lock_page_links_to_its_set(operator, taken):
    fences = {lock.resource: lock.fence for lock in taken.locks}
    for resource in ("acct:1", "acct:2", "pool:x"):
        page = soup(operator.get(f"/locks/{resource}"))
        line = page.find(id=f"lock-set-{fences[resource]}")
        assert line is not None, resource
        link = line.find("a", href=f"/sets/{taken.set_id}")
        assert link is not None, resource
        assert line.find(id=f"lock-set-{fences[resource]}-release")
        # Its history says which events were the set's.
        (event_link,) = page.select("#history a.set-link")
        assert event_link["href"] == f"/sets/{taken.set_id}"


def test_a_lock_taken_alone_shows_no_set(operator, service):
    service.acquire("acct:9", "w-1", ttl=30)
    page = soup(operator.get("/locks/acct:9"))
    assert page.find(id="lock-sets") is None
    assert page.select("#history a.set-link") == []


def test_the_set_page_lists_its_members_held_or_not(viewer, taken, service):
    service.release("acct:1", "mover-1", token="worker")
    page = soup(viewer.get(f"/sets/{taken.set_id}"))
    rows = page.select("#set-members-table tbody tr")
    shown = [
        (row.select_one("td").get_text(strip=True), "held" in row["class"])
        for row in rows
    ]
    assert shown == [("acct:1", False), ("acct:2", True), ("pool:x", True)]
    assert "2 of 3" in page.find(id="set-members-heading").get_text()
    # A viewer reads it and is offered no action.
    assert page.find(id="set-release") is None
    assert viewer.get(f"/sets/{taken.set_id}/release").status_code == 403
    assert (
        post(viewer, f"/sets/{taken.set_id}/release", {"reason": "x"}).status_code
        == 403
    )
    assert len(service.holders("pool:x").holders) == 1


def test_an_unknown_or_malformed_set_is_a_404(operator):
    assert operator.get("/sets/nosuchset").status_code == 404
    assert operator.get("/sets/not%20an%20id").status_code == 404
    assert post(operator, "/sets/nosuchset/release", {"reason": "x"}).status_code == 404


def test_an_operator_releases_the_set_as_one(operator, taken, service):
    page = soup(operator.get(f"/sets/{taken.set_id}"))
    assert page.find(id="set-release")
    form = soup(operator.get(f"/sets/{taken.set_id}/release"))
    assert len(form.select("#release-set-list li")) == 3
    assert form.find("textarea", attrs={"name": "reason"})
    refused = post(operator, f"/sets/{taken.set_id}/release", {"reason": ""})
    assert refused.status_code == 400
    assert len(service.holders("pool:x").holders) == 1
    done = post(
        operator,
        f"/sets/{taken.set_id}/release",
        {"reason": "mover wedged", "next": "/locks/acct:1"},
    )
    assert done.status_code == 303
    assert done.headers["Location"].endswith("/locks/acct:1")
    for resource in ("acct:1", "acct:2", "pool:x"):
        assert service.holders(resource).holders == []
    with db.engine.connect() as conn:
        rows = conn.execute(
            select(
                LockEvent.resource, LockEvent.actor, LockEvent.reason, LockEvent.set_id
            )
            .where(LockEvent.action == "force_released")
            .order_by(LockEvent.resource)
        ).all()
    assert [tuple(row) for row in rows] == [
        (resource, "olga", "mover wedged", taken.set_id)
        for resource in ("acct:1", "acct:2", "pool:x")
    ]
    # Nothing left to release: the page offers nothing, the form says so.
    assert soup(operator.get(f"/sets/{taken.set_id}")).find(id="set-release") is None
    again = soup(operator.get(f"/sets/{taken.set_id}/release"))
    assert again.find(id="release-set-list") is None


def test_the_release_through_htmx_answers_in_place(operator, taken, service):
    done = post(
        operator,
        f"/sets/{taken.set_id}/release",
        {"reason": "mover wedged"},
        htmx=True,
    )
    assert done.status_code == 200
    assert "Force-released the set: 3 locks" in done.get_data(as_text=True)
    assert done.headers["HX-Trigger"] == "locks-changed"
