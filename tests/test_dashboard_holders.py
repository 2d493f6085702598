"""The lock page of a resource held by holders (a semaphore's, or shared grants)
says what holds it ("3 of 4 places", "2 readers") and lists every live holder:
owner, token, time left, fence and time held, each with its own force-release
(a reason, the fence seen) and, bound to a session, its own "End session…"; no
claim is offered on a full semaphore; on every database."""

from __future__ import annotations

import pytest
from lockkeeper_core.state import Action

from tests.dashboard_helpers import post, soup
from tests.test_holders import events_of

pytestmark = pytest.mark.usefixtures("backend")


def holder_rows(page):
    return [
        [cell.get_text(" ", strip=True) for cell in row.find_all("td")][:5]
        for row in page.select("#holders-table tbody tr")
    ]


def test_the_lock_page_lists_a_semaphores_holders(operator, service, clock):
    fences = []
    for owner, ttl in (("w-1", 30), ("w-2", 60), ("w-3", 45)):
        result = service.acquire("sem:build", owner, ttl=ttl, limit=4, token="ci")
        assert result.acquired
        fences.append(result.lock.fence)
        clock.advance(1)
    clock.advance(10)
    page = soup(operator.get("/locks/sem:build"))
    assert page.find(id="holders-used").get_text(strip=True) == "3 of 4 places"
    assert page.find(id="holders-mode") is None
    assert page.find(id="holders-full") is None
    # The summary names no holder as *the* owner: it says what holds it.
    summary = page.find(id="lock-summary")
    assert summary.find(id="lock-held-by").get_text(strip=True) == "3 of 4 places"
    assert "Owner" not in [dt.get_text() for dt in summary.find_all("dt")]
    assert summary.find(id="lock-claim"), "a free place can be claimed"
    # The one that ends first first; time left as every coming instant; time
    # held since each one's own grant.
    assert holder_rows(page) == [
        ["w-1", "ci", "17 s", str(fences[0]), "13 s"],
        ["w-3", "ci", "34 s", str(fences[2]), "11 s"],
        ["w-2", "ci", "48 s", str(fences[1]), "12 s"],
    ]
    remaining = page.select_one(f"#holder-{fences[1]} .ttl")
    assert remaining["data-ttl"] == "48.000"
    assert remaining["title"].startswith("expires 2026-")
    held = page.select_one(f"#holder-{fences[1]} td.held-for time")
    assert held["data-age"] == "12.000"


def test_a_full_semaphore_offers_no_claim(operator, service):
    for owner in ("w-1", "w-2"):
        assert service.acquire("sem:full", owner, ttl=30, limit=2).acquired
    page = soup(operator.get("/locks/sem:full"))
    assert page.find(id="holders-used").get_text(strip=True) == "2 of 2 places"
    assert page.find(id="holders-full")
    assert page.find(id="lock-claim") is None
    assert "all 2 places are held" in page.find(id="lock-claim-full").get_text()
    # The claim form, reached anyway, says so before anyone fills it in.
    form = soup(operator.get("/locks/sem:full/claim"))
    assert "All 2 of its places are held" in form.get_text(" ", strip=True)


def test_a_session_bound_holder_can_have_its_session_ended_from_its_row(
    operator, service
):
    session = service.sessions.create("w-1", 30, token="ci")
    bound = service.acquire(
        "sem:s", "w-1", token="ci", limit=3, session=session.id
    ).lock
    free = service.acquire("sem:s", "w-2", ttl=30, limit=3).lock
    page = soup(operator.get("/locks/sem:s"))
    link = page.find(id=f"holder-{bound.fence}-end-session")
    assert link["href"].startswith(f"/sessions/{session.id}/end")
    assert "(session)" in page.select_one(f"#holder-{bound.fence} td.held-for").text
    assert page.find(id=f"holder-{free.fence}-end-session") is None
    form = soup(operator.get(link["href"]))
    assert form.find("textarea", attrs={"name": "reason"})


def test_shared_holders_say_they_are_readers(viewer, service):
    for owner in ("r-1", "r-2"):
        assert service.acquire("cache", owner, ttl=30, mode="shared").acquired
    page = soup(viewer.get("/locks/cache"))
    assert page.find(id="holders-used").get_text(strip=True) == "2 readers"
    assert page.find(id="holders-mode").get_text(strip=True) == "(shared)"
    assert page.find(id="lock-held-by").get_text(strip=True) == "2 readers (shared)"
    rows = holder_rows(page)
    assert [row[0] for row in rows] == ["r-1", "r-2"]
    assert {row[1] for row in rows} == {"none"}


def test_an_exclusive_lock_shows_no_holders_list(operator, service):
    assert service.acquire("job:1", "w-1", ttl=30).acquired
    page = soup(operator.get("/locks/job:1"))
    assert page.find(id="lock-holders") is None
    assert page.find(id="lock-release")
    assert page.find(id="lock-state")


def test_one_holder_force_released_by_its_own_button(operator, service):
    fences = [
        service.acquire("sem:op", f"w-{n}", ttl=30, limit=3).lock.fence
        for n in (1, 2, 3)
    ]
    page = soup(operator.get("/locks/sem:op"))
    # No whole-lock force-release beside the holders' own: the holders are
    # not one grant (force_release answered "already released" for them).
    assert page.find(id="lock-release") is None
    link = page.find(id=f"holder-{fences[1]}-release")
    form = soup(operator.get(link["href"]))
    assert form.find("textarea", attrs={"name": "reason"})
    assert form.find("select", attrs={"name": "reason_choice"}).find_all("option")
    assert "w-2" in form.get_text(" ", strip=True)
    action = form.find("textarea").find_parent("form")["action"]
    refused = post(operator, action, {"reason": " "})
    assert refused.status_code == 400
    assert len(service.holders("sem:op").holders) == 3
    done = post(operator, action, {"reason": "wedged", "next": "/locks/sem:op"})
    assert done.status_code == 303
    assert [h.owner for h in service.holders("sem:op").holders] == ["w-1", "w-3"]
    forced = [e for e in events_of("sem:op") if e.action == Action.FORCE_RELEASED]
    assert [(e.owner, e.fence, e.actor, e.reason) for e in forced] == [
        ("w-2", fences[1], "olga", "wedged")
    ]
    # The same fence again: refused, named, nothing changes.
    again = post(operator, action, {"reason": "again"}, htmx=True)
    assert again.status_code == 409
    message = soup(again).get_text(" ", strip=True)
    assert f"fence {fences[1]} any more" in message
    assert f"fence {fences[0]}" in message
    assert len(service.holders("sem:op").holders) == 2
    assert operator.get(link["href"]).status_code == 404


def test_a_viewer_has_no_per_holder_release(viewer, service):
    fence = service.acquire("sem:v", "w-1", ttl=30, limit=2).lock.fence
    page = soup(viewer.get("/locks/sem:v"))
    assert page.find(id=f"holder-{fence}-release") is None
    url = f"/locks/sem:v/holders/{fence}/release"
    assert viewer.get(url).status_code == 403
    assert post(viewer, url, {"reason": "x"}).status_code == 403
    assert len(service.holders("sem:v").holders) == 1


def test_the_audit_filters_by_mode(viewer, service):
    for owner in ("r-1", "r-2"):
        assert service.acquire("rw:audit", owner, ttl=30, mode="shared").acquired
    assert service.acquire("job:audit", "w-1", ttl=30).acquired
    service.freeze("frozen:", actor="olga", reason="maintenance")

    def shown(query):
        page = soup(viewer.get(f"/audit?{query}"))
        return sorted(
            (
                tr.select_one("td.resource").get_text(strip=True),
                tr.select_one("td.action").get_text(strip=True),
            )
            for tr in page.select("tr[data-event-id]")
        )

    assert shown("mode=shared") == [("rw:audit", "acquired")] * 2
    assert shown("mode=exclusive") == [("job:audit", "acquired")]
    assert len(shown("")) == 4  # any mode, the freeze too
    page = soup(viewer.get("/audit?mode=shared"))
    assert page.select_one("#f-mode option[selected]")["value"] == "shared"
    refused = viewer.get("/audit?mode=both")
    assert refused.status_code == 400
    assert "exclusive or shared" in soup(refused).get_text(" ", strip=True)


def test_the_timeline_draws_a_semaphores_holders_side_by_side(viewer, service, clock):
    # Three holders held at once, renewed in turn: one bar per holder, each in a
    # lane of its own, every one of them still held (none cut short by the
    # others' grants or renewals, as one holder's history would read them).
    for owner in ("w-1", "w-2", "w-3"):
        assert service.acquire("sem:draw", owner, ttl=60, limit=3).acquired
        clock.advance(2)
    for owner in ("w-1", "w-2", "w-3"):
        assert service.renew("sem:draw", owner, ttl=60)
        clock.advance(1)
    page = soup(viewer.get("/locks/sem:draw"))
    bars = page.select("svg.timeline rect.tenure")
    assert len(bars) == 3
    assert len({bar["y"] for bar in bars}) == 3
    titles = [bar.find("title").get_text() for bar in bars]
    assert all(title.endswith("(held)") for title in titles), titles


def hold_holders(service):
    """A semaphore of 3 with 2 holders and a shared lock with 2 readers."""
    for owner, ttl in (("host-a:1", 60), ("host-b:2", 90)):
        assert service.acquire("sem:pool", owner, ttl=ttl, limit=3).acquired
    for owner in ("reader-1", "reader-2"):
        assert service.acquire("rw:cfg", owner, ttl=40, mode="shared").acquired


def overview_rows(page):
    return {
        row.select_one("td.resource").get_text(strip=True): row
        for row in page.select("#locks-table tbody tr")
    }


def test_the_overview_shows_a_resource_held_by_holders_as_one_row(operator, service):
    hold_holders(service)
    assert service.acquire("job:1", "w-1", ttl=30).acquired
    page = soup(operator.get("/"))
    rows = overview_rows(page)
    assert set(rows) == {"sem:pool", "rw:cfg", "job:1"}
    pool = rows["sem:pool"]
    assert pool.select_one(".places").get_text(strip=True) == "2 / 3"
    assert pool.select_one(".places")["href"] == "/locks/sem:pool#lock-holders"
    # Its grant that ends first: owner and time left.
    assert pool.select_one("td.owner").get_text(" ", strip=True) == (
        "host-a:1 and 1 more"
    )
    assert pool.select_one(".ttl")["data-ttl"] == "60.000"
    assert rows["rw:cfg"].select_one(".places").get_text(strip=True) == "2 shared"
    # No whole-lock release for them; the exclusive lock keeps its own.
    for resource in ("sem:pool", "rw:cfg"):
        assert rows[resource].select_one("input[name=lock]") is None
        assert rows[resource].find(id=lambda i: i and i.endswith("-release")) is None
        assert rows[resource].find(id=lambda i: i and i.endswith("-holders"))
    assert rows["job:1"].select_one(".places") is None
    assert rows["job:1"].select_one("input[name=lock]") is not None
    assert page.find(id="count-held").select_one(".count").get_text() == "3"
    assert page.find(id="tab-all").select_one(".tab-count").get_text() == "(3)"


def test_the_overview_finds_a_resource_by_any_holders_owner(viewer, service):
    hold_holders(service)
    page = soup(viewer.get("/?owner=host-b"))
    assert list(overview_rows(page)) == ["sem:pool"]
    assert page.find(id="count-held").select_one(".count").get_text() == "1"
    assert page.find(id="tab-held").select_one(".tab-count").get_text() == "(1)"


def test_the_groupings_count_holders(viewer, service):
    hold_holders(service)
    assert service.acquire("sem:pool", "host-a:7", ttl=60, limit=3).acquired

    def groups(view):
        page = soup(viewer.get(f"/?group={view}"))
        return {
            # Its All column (a last seen follows on the owner and host views).
            row.find("td").get_text(" ", strip=True): row.select("td.number")[
                -1
            ].get_text(strip=True)
            for row in page.select("#groups-table tbody tr")
        }

    # One resource per prefix; each holder counts for its owner and host.
    assert groups("prefix") == {"rw:": "1", "sem:": "1"}
    assert groups("host") == {
        "host-a": "2",
        "host-b": "1",
        "reader-1": "1",
        "reader-2": "1",
    }
    assert groups("owner") == {
        "host-a:1": "1",
        "host-a:7": "1",
        "host-b:2": "1",
        "reader-1": "1",
        "reader-2": "1",
    }
