"""Freezes and the bulk release of stale locks on the dashboard (test client,
CSRF on): forms, confirmations, banners, htmx fragments, roles."""

from __future__ import annotations

import pytest
from lockkeeper_core.errors import LockNotFound, ResourceFrozen

from tests.dashboard_helpers import post, soup


def banner_text(client, url="/") -> str:
    section = soup(client.get(url)).find(id="freezes")
    return section.get_text(" ", strip=True)


# -- freezes ------------------------------------------------------------------------


def test_freeze_form_is_a_confirmation_with_a_csrf_token(operator):
    page = soup(operator.get("/freezes/new?prefix=billing:"))
    form = page.find("form", attrs={"action": "/freezes/new"})
    assert form.find("input", attrs={"name": "csrf_token"})
    assert form.find("input", attrs={"name": "prefix"})["value"] == "billing:"
    assert form.find("textarea", attrs={"name": "reason"})
    usual = form.select("select[name=reason_choice] option")
    assert [o.get_text() for o in usual][1:3] == ["Maintenance", "Incident response"]


def test_freeze_without_javascript_redirects_and_the_overview_shows_the_banner(
    operator, service
):
    response = post(
        operator,
        "/freezes/new",
        {"prefix": "billing:", "reason": "ledger migration", "for": "2h", "next": "/"},
    )
    assert response.status_code == 303
    assert response.headers["Location"] == "/"
    text = banner_text(operator)
    assert "billing:" in text
    assert "ledger migration" in text
    assert "olga" in text
    with pytest.raises(ResourceFrozen):
        service.acquire("billing:1", "w-1")
    # The lock page of a covered resource shows it; another does not.
    assert "ledger migration" in banner_text(operator, "/locks/billing:1")
    assert "Frozen" not in banner_text(operator, "/locks/report:1")


def test_freeze_with_htmx_swaps_the_result_and_refreshes_the_banner(operator, service):
    response = post(
        operator, "/freezes/new", {"prefix": "job:", "reason": "deploy"}, htmx=True
    )
    assert response.status_code == 200
    assert response.headers["HX-Trigger"] == "locks-changed"
    assert "Froze job:" in soup(response).get_text()
    fragment = operator.get(
        "/freezes", headers={"HX-Request": "true", "HX-Target": "section#freezes"}
    )
    assert fragment.headers["Cache-Control"] == "no-store"
    assert "deploy" in soup(fragment).find(id="freezes").get_text()
    assert not soup(fragment).find("html")


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"prefix": "billing:", "reason": ""}, "reason"),
        ({"prefix": "has space", "reason": "x"}, "prefix"),
        ({"prefix": "billing:", "reason": "x", "for": "soon"}, "for"),
    ],
)
def test_bad_freeze_input_is_a_400_form_with_the_message(
    operator, service, data, field
):
    response = post(operator, "/freezes/new", data, htmx=True)
    assert response.status_code == 400
    assert soup(response).find(id=f"{field}-error")
    assert service.list_freezes() == []


def test_unfreeze_from_the_banner(operator, service):
    service.freeze("billing:", actor="olga", reason="migration")
    link = soup(operator.get("/")).select_one("#freezes a[href*=unfreeze]")
    assert link is not None
    form_page = soup(operator.get(link["href"]))
    assert "migration" in form_page.get_text()
    response = post(
        operator, "/freezes/billing:/unfreeze", {"reason": "done", "next": "/"}
    )
    assert response.status_code == 303
    assert service.list_freezes() == []
    assert service.acquire("billing:1", "w-1").acquired


def test_viewer_sees_the_banner_but_cannot_freeze(viewer, service):
    service.freeze("billing:", actor="olga", reason="migration")
    assert "migration" in banner_text(viewer)
    assert "Unfreeze" not in banner_text(viewer)
    assert viewer.get("/freezes/new").status_code == 403
    response = post(viewer, "/freezes/new", {"prefix": "a:", "reason": "x"})
    assert response.status_code == 403
    response = post(viewer, "/freezes/billing:/unfreeze", {"reason": "x"})
    assert response.status_code == 403
    assert [f.prefix for f in service.list_freezes()] == ["billing:"]


# -- bulk release of stale locks ------------------------------------------------------


def test_stale_tab_offers_bulk_release_with_the_count(operator, service, clock):
    for i in range(3):
        service.acquire(f"job:{i}", "w-1", ttl=1)
    service.acquire("report:1", "w-1", ttl=1)
    service.acquire("job:held", "w-1", ttl=600)
    clock.advance(2)
    held_tab = soup(operator.get("/?state=held"))
    assert held_tab.find("a", string="Release all stale…") is None
    link = soup(operator.get("/?state=stale&prefix=job:")).find(
        "a", string="Release all stale…"
    )
    confirmation = soup(operator.get(link["href"]))
    assert "Force release 3 stale locks?" in confirmation.get_text(" ", strip=True)
    response = post(
        operator,
        "/stale/release",
        {"prefix": "job:", "owner": "", "reason": "after the outage"},
        htmx=True,
    )
    assert response.status_code == 200
    assert "Force-released 3 stale lock(s)." in soup(response).get_text()
    assert response.headers["HX-Trigger"] == "locks-changed"
    for i in range(3):
        with pytest.raises(LockNotFound):
            service.get(f"job:{i}", include_stale=True)
    assert service.get("report:1", include_stale=True).owner == "w-1"
    assert service.get("job:held").owner == "w-1"


def test_bulk_release_needs_an_operator(viewer, service, clock):
    service.acquire("job:1", "w-1", ttl=1)
    clock.advance(2)
    assert viewer.get("/stale/release").status_code == 403
    assert post(viewer, "/stale/release", {"reason": "x"}).status_code == 403
    assert service.count_stale() == 1


def test_bulk_release_needs_a_reason(operator, service, clock):
    service.acquire("job:1", "w-1", ttl=1)
    clock.advance(2)
    response = post(operator, "/stale/release", {"reason": ""}, htmx=True)
    assert response.status_code == 400
    assert soup(response).find(id="reason-error")
    assert service.count_stale() == 1


# -- releasing many: selected rows, or every lock a view matches ---------------------


def test_release_selected_rows_leaves_a_lock_that_changed_hands_and_reports_it(
    operator, service, clock
):
    for n in range(3):
        service.acquire(f"job:{n}", f"batch-07:{n}:x", ttl=5)
    clock.advance(10)  # all three stale
    page = soup(operator.get("/?state=stale"))
    boxes = page.select("#locks-table input[type=checkbox][form=bulk-form]")
    assert len(boxes) == 3
    chosen = [box["value"] for box in boxes]
    query = "&".join(f"lock={value}" for value in chosen)
    confirm = soup(operator.get(f"/release-many?{query}&next=/"))
    assert confirm.find("h2").get_text() == "Force release 3 locks?"
    shown = [i["value"] for i in confirm.select("form input[name=lock]")]
    assert shown == chosen
    # Meanwhile job:1 is taken over by a live worker.
    service.acquire("job:1", "web-2:1:y", ttl=600)
    response = post(
        operator,
        "/release-many",
        {"lock": shown, "reason": "batch-07 died", "confirm_count": "3", "next": "/"},
    )
    assert response.status_code == 303
    text = soup(operator.get("/")).select_one("#messages").get_text()
    assert "Force-released 2 locks." in text
    assert "Left alone 1 that changed hands: job:1 (now held by web-2:1:y" in text
    assert service.get("job:1").owner == "web-2:1:y"
    for name in ("job:0", "job:2"):
        with pytest.raises(LockNotFound):
            service.get(name, include_stale=True)
    from app.audit.service import EventFilter, list_events

    events = list_events(EventFilter(action="force_released")).items
    assert sorted(e.resource for e in events) == ["job:0", "job:2"]
    assert {e.reason for e in events} == {"batch-07 died"}


def test_release_the_matching_names_the_count_of_the_view_and_a_host(operator, service):
    for n in range(26):
        service.acquire(f"job:{n}", f"batch-07:{n}:x", ttl=3600)
    service.acquire("job:other", "web-1:1:y", ttl=3600)
    page = soup(operator.get("/?owner=batch-07"))
    link = page.select_one("#bulk-form + a")
    assert link.get_text() == "Release the 26 matching…"
    confirm = soup(operator.get(link["href"]))
    assert confirm.find("h2").get_text() == "Force release 26 locks?"
    hosts = soup(operator.get("/?group=host"))
    [batch] = [
        a for a in hosts.select("#groups-table td.actions a") if "batch-07" in a.text
    ]
    confirm = soup(operator.get(batch["href"]))
    assert confirm.find("h2").get_text() == "Force release 26 locks?"
    assert len(confirm.select("form input[name=lock]")) == 26


def test_release_many_needs_a_reason_and_real_rows(operator, service):
    service.acquire("job:1", "w", ttl=60)
    lock = service.get("job:1")
    no_reason = post(operator, "/release-many", {"lock": f"{lock.fence}:job:1"})
    assert no_reason.status_code == 400
    assert service.get("job:1").owner == "w"
    bad = post(operator, "/release-many", {"lock": "x:job:1", "reason": "r"})
    assert bad.status_code == 400
    assert operator.get("/release-many").status_code == 200  # nothing chosen


def test_an_unfiltered_tab_offers_no_release_of_all_and_refuses_one(operator, service):
    """The Held tab alone is not a set chosen on purpose: no "Release the N
    matching…" on it (one dialog and one reason released every held lock),
    and asking for it anyway is a 400 that names what narrows, releasing
    nothing. Selected rows stay the way to release a few of the tab."""
    for n in range(3):
        service.acquire(f"job:{n}", f"w-{n}", ttl=600)
    for tab in ("/", "/?state=held"):
        page = soup(operator.get(tab))
        assert page.select_one("#bulk-form button") is not None
        assert not page.select("#live a[href*='matching=1']"), tab
    refused = operator.get("/release-many?matching=1&state=held")
    assert refused.status_code == 400
    page = soup(refused)
    assert page.find("h2").get_text() == "Nothing to release yet"
    assert "search for a prefix or an owner" in page.select_one("#locks-error").text
    assert not page.select("form input[name=lock]")
    searched = soup(operator.get("/?state=held&prefix=job:"))
    [link] = searched.select("#live a[href*='matching=1']")
    assert link.get_text() == "Release the 3 matching…"
    assert "danger" in link["class"]


def test_more_matching_than_one_confirmation_names_says_how_to_narrow(
    operator, service, monkeypatch
):
    """Above the limit the overview says to narrow the search instead of
    offering a dialog that could only say "Force release 0 locks?"."""
    from app.dashboard import forms

    monkeypatch.setattr(forms, "BULK_LIMIT", 3)
    for n in range(4):
        service.acquire(f"job:{n}", f"w-{n}", ttl=600)
    page = soup(operator.get("/?prefix=job:"))
    assert not page.select("#live a[href*='matching=1']")
    note = page.select_one(".bulk-note").get_text()
    assert note == "4 match: narrow the search to 3 or fewer to release them together."
    refused = soup(operator.get("/release-many?matching=1&prefix=job:"))
    assert refused.find("h2").get_text() == "Nothing to release yet"
    assert "more than 3 locks match: narrow the search" in refused.text
    assert refused.find("a", string="Back to the locks") is not None


def test_a_bulk_release_is_confirmed_by_typing_its_count(operator, service):
    """More than one grant: the count typed, or a 400 that changes nothing."""
    chosen = []
    for n in range(2):
        service.acquire(f"job:{n}", f"w-{n}", ttl=600)
        chosen.append(f"{service.get(f'job:{n}').fence}:job:{n}")
    confirm = soup(
        operator.get("/release-many?" + "&".join(f"lock={c}" for c in chosen))
    )
    assert confirm.select_one("label[for=confirm-count]").text == "Type 2 to confirm"
    for typed in (None, "", "3", "two"):
        form = {"lock": chosen, "reason": "r"}
        if typed is not None:
            form["confirm_count"] = typed
        response = post(operator, "/release-many", form, htmx=True)
        assert response.status_code == 400, typed
        error = soup(response).select_one("#confirm_count-error").get_text()
        assert error == "type 2, the number released, to confirm"
        assert service.get("job:0").owner == "w-0"
    form = {"lock": chosen, "reason": "r", "confirm_count": " 2 "}
    response = post(operator, "/release-many", form, htmx=True)
    assert "Force-released 2 locks." in soup(response).get_text(" ", strip=True)
    with pytest.raises(LockNotFound):
        service.get("job:0")
