"""The dashboard through the Flask test client: pages, fragments, actions, roles.

CSRF protection is on (the app's default), so every post carries a real token.
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest
from lockkeeper_core.errors import LockNotFound
from lockkeeper_core.state import Action

from app.audit.service import EventFilter, list_events
from app.dashboard import timeline
from tests.dashboard_helpers import HTMX, csrf_token, poller_version, post, soup

HOSTILE_OWNERS = [
    "<script>alert(1)</script>",
    "\"'><img src=x onerror=alert(1)>",
    'O\'Brien "quoted" & <b>bold</b>',
]


def events_of(app, resource):
    with app.app_context():
        return list_events(EventFilter(resource=resource), limit=500).items


def rows(page):
    return [
        row.select_one("td.resource").get_text(strip=True)
        for row in page.select("#live tbody tr")
        if row.select_one("td.resource")
    ]


# -- overview: page and fragments ---------------------------------------------------


def test_overview_is_a_full_page_with_nav_csrf_meta_and_vendored_htmx(operator):
    response = operator.get("/")
    page = soup(response)
    assert response.status_code == 200
    assert "HX-Request" in response.vary
    assert page.body is not None
    nav = {a["href"] for a in page.select("nav[aria-label=Main] a")}
    assert nav == {"/", "/audit", "/sessions", "/freezes"}
    assert page.find("meta", attrs={"name": "csrf-token"})["content"]
    scripts = [script["src"].partition("?")[0] for script in page.find_all("script")]
    assert "/static/vendor/htmx-4.0.1.min.js" in scripts
    assert all(src.startswith("/static/") for src in scripts)
    assert page.select_one("#locks #live table caption")


def test_poll_gets_the_live_fragment_only_uncached(operator):
    response = operator.get("/?state=stale", headers={**HTMX, "HX-Target": "div#live"})
    page = soup(response)
    assert page.body is None
    assert page.find("html") is None
    live = page.find(id="live")
    assert live is not None
    assert page.find("form") is None  # the search form is outside the polled part
    assert response.headers["Cache-Control"] == "no-store"
    assert "HX-Request" in response.vary
    poller = live.select_one("[hx-trigger]")
    assert poller["hx-sync"] == "this:drop"
    assert poller["hx-trigger"] == "every 5s, locks-changed from:body"
    assert poller["hx-get"] == "/?state=stale&live=1"
    assert (poller["hx-target"], poller["hx-swap"]) == ("#live", "outerMorph")
    assert poller_version(poller)
    assert poller.get("hx-push-url") is None


def test_tab_click_gets_search_and_table_fragment(operator):
    page = soup(
        operator.get("/?state=held", headers={**HTMX, "HX-Target": "section#locks"})
    )
    assert page.body is None
    assert page.find(id="locks").find("form", attrs={"role": "search"})
    assert page.find(id="live")


@pytest.mark.parametrize(
    "headers",
    [
        {**HTMX, "HX-Target": "div#live", "HX-History-Restore-Request": "true"},
        {**HTMX, "HX-Target": "div#live", "HX-Request-Type": "full"},
        {**HTMX, "HX-Target": "div#unknown"},
    ],
)
def test_history_restore_and_full_requests_get_the_whole_page(operator, headers):
    page = soup(operator.get("/?state=stale", headers=headers))
    assert page.body is not None
    assert page.find("nav")


def test_counts_and_tabs_reflect_lock_states(operator, service, clock):
    service.acquire("job:held", "w", ttl=600)
    service.acquire("job:expiring", "w", ttl=10)
    service.acquire("job:stale", "w", ttl=1)
    clock.advance(5)
    page = soup(operator.get("/"))
    counts = {
        li["class"][0].removeprefix("count-"): li.select_one(".count").get_text()
        for li in page.select("ul.counts li")
    }
    assert counts == {"held": "1", "expiring": "1", "stale": "1"}
    assert rows(page) == ["job:expiring", "job:held", "job:stale"]
    stale_row = page.select_one("tr.state-stale")
    assert stale_row.select_one("td.resource").get_text(strip=True) == "job:stale"
    assert stale_row.select_one(".ttl-expired")
    for state, expected in [
        ("held", ["job:held"]),
        ("expiring", ["job:expiring"]),
        ("stale", ["job:stale"]),
    ]:
        tab_page = soup(operator.get(f"/?state={state}"))
        assert rows(tab_page) == expected
        current = tab_page.select_one(".tabs a[aria-current=page]")
        assert current["href"] == f"/?state={state}"


def test_ttl_is_rendered_for_the_countdown_script(operator, service):
    service.acquire("job:1", "w", ttl=90)
    ttl = soup(operator.get("/")).select_one("#live .ttl")
    assert float(ttl["data-ttl"]) == 90
    assert ttl.get_text() == "1 min 30 s"


def test_search_by_prefix_and_owner_keeps_filters_in_the_url(operator, service):
    for resource, owner in [
        ("job:1", "a"),
        ("job:2", "b"),
        ("report:1", "a"),
        ("job_x", "a"),
    ]:
        service.acquire(resource, owner, ttl=100)
    page = soup(operator.get("/?prefix=job:&owner=a"))
    assert rows(page) == ["job:1"]
    form = page.find("form", attrs={"role": "search"})
    assert form["method"] == "get"
    assert form.find("input", attrs={"name": "prefix"})["value"] == "job:"
    assert form.find("input", attrs={"name": "owner"})["value"] == "a"
    for field in form.find_all("input", attrs={"id": True}):
        assert form.find("label", attrs={"for": field["id"]})
    tab = page.select_one(".tabs a[href*='state=stale']")["href"]
    assert parse_qs(urlsplit(tab).query) == {
        "state": ["stale"],
        "prefix": ["job:"],
        "owner": ["a"],
    }
    assert rows(soup(operator.get("/?prefix=job_"))) == ["job_x"]


def test_pagination_walks_every_lock_once_in_order(operator, service):
    names = [f"job:{n:03d}" for n in range(60)]
    for name in names:
        service.acquire(name, "w", ttl=100)
    seen: list[str] = []
    url = "/"
    pages = 0
    while url:
        page = soup(operator.get(url))
        seen.extend(rows(page))
        pages += 1
        link = page.select_one(".pager a[rel=next]")
        url = link["href"] if link else None
        numbers = {a.get_text(): a for a in page.select(".pager .page-links a")}
        assert numbers["1"]["href"] == "/"
        assert numbers[str(pages)].get("aria-current") == "page"
        assert {"1", "2", "3"} <= set(numbers)
    assert seen == names
    assert pages == 3


def test_pause_stops_polling_and_survives_navigation(operator, service):
    service.acquire("job:1", "w", ttl=100)
    page = soup(operator.get("/?live=0"))
    poller = page.select_one("#live [hx-trigger]")
    assert "every" not in poller["hx-trigger"]
    switch = page.select_one(".live a")
    assert switch.get_text() == "Resume"
    assert switch["href"] == "/?live=1"
    # The pause is remembered: the header's Overview link, tabs and lock pages
    # keep it without carrying it in their URLs.
    for url in ("/", "/?state=held", "/locks/job:1"):
        again = soup(operator.get(url))
        assert "every" not in again.select_one(".poller")["hx-trigger"], url
        assert again.select_one(".live a").get_text() == "Resume", url
    # A poll of a live tab elsewhere does not undo it; Resume does.
    operator.get("/?live=1", headers={**HTMX, "HX-Target": "div#live"})
    assert "every" not in soup(operator.get("/")).select_one(".poller")["hx-trigger"]
    playing = soup(operator.get("/?live=1"))
    assert playing.select_one(".live a").get_text() == "Pause"
    assert playing.select_one(".live a")["href"] == "/?live=0"
    assert "every 5s" in soup(operator.get("/")).select_one(".poller")["hx-trigger"]


@pytest.mark.parametrize(
    "query", ["owner=%01bad", "state=sleeping", "cursor=not-a-cursor"]
)
def test_bad_filters_get_a_400_page_with_the_reason(operator, query):
    response = operator.get(f"/?{query}")
    assert response.status_code == 400
    page = soup(response)
    assert page.select(".field-error")
    assert page.find(id="live")


def test_last_refreshed_label_shows_the_service_clock(operator, clock):
    label = soup(operator.get("/")).select_one(".live time")
    assert label["datetime"] == "2026-11-30T09:00:00.000Z"


@pytest.mark.parametrize("owner", HOSTILE_OWNERS)
def test_hostile_owner_names_are_escaped_everywhere(operator, service, owner):
    service.acquire("job:1", owner, ttl=100)
    for url in ["/", "/locks/job:1", "/locks/job:1/release", "/locks/job:1/claim"]:
        response = operator.get(url)
        body = response.get_data(as_text=True)
        assert owner not in body
        page = soup(response)
        assert all(script.get("src") for script in page.find_all("script"))
        assert not page.find_all("img")
        assert owner in page.get_text()


def test_pages_have_no_inline_script_or_style(operator, service):
    service.acquire("job:1", "w", ttl=100)
    for url in ["/", "/locks/job:1", "/locks/job:1/claim"]:
        response = operator.get(url)
        page = soup(response)
        assert "default-src 'self'" in response.headers["Content-Security-Policy"]
        assert not page.find_all("style")
        assert not page.select("[style]")
        assert not [
            tag
            for tag in page.find_all(True)
            if any(attr.startswith(("on", "hx-on")) for attr in tag.attrs)
        ]


def test_every_input_has_a_label(operator, service):
    service.acquire("job:1", "w", ttl=100)
    for url in ["/", "/locks/job:1/release", "/locks/job:1/claim"]:
        page = soup(operator.get(url))
        for field in page.select("main input:not([type=hidden]), main textarea"):
            assert page.find("label", attrs={"for": field["id"]}), (url, field)


# -- roles ---------------------------------------------------------------------------


def test_viewer_sees_locks_but_no_action_controls(viewer, service):
    service.acquire("job:1", "w", ttl=100)
    for url in ["/", "/locks/job:1"]:
        page = soup(viewer.get(url))
        assert "job:1" in page.get_text()
        assert not page.select("a[href*='/release'], a[href*='/claim']")
        assert not page.select("form[method=post][action^='/locks']")


def test_each_row_has_one_actions_menu_whose_links_work_without_javascript(
    operator, service
):
    service.acquire("job:1", "w", ttl=100)
    page = soup(operator.get("/"))
    [cell] = page.select("#live tbody tr td.actions")
    # One disclosure per row, no loose buttons beside it: <details> opens with
    # no script, and each link is a plain GET of the action's own page.
    [menu] = cell.select(":scope > details.row-menu")
    assert menu.select_one(":scope > summary").get_text(" ", strip=True) == (
        "Actions for job:1"
    )
    assert not cell.select(":scope > a, :scope > button")
    links = {a.get_text(strip=True): a["href"] for a in menu.select("li a")}
    assert set(links) == {"Release…job:1", "Claim…job:1"}
    for label, href in links.items():
        response = operator.get(href)
        assert response.status_code == 200, label
        form = soup(response).select_one("form[method=post]")
        assert form is not None, label


@pytest.mark.parametrize("action", ["release", "claim"])
def test_viewer_gets_403_when_posting_an_action(fake_app, viewer, service, action):
    service.acquire("job:1", "w", ttl=100)
    assert viewer.get(f"/locks/job:1/{action}").status_code == 403
    response = post(viewer, f"/locks/job:1/{action}", {"reason": "because"})
    assert response.status_code == 403
    assert service.get("job:1").owner == "w"
    assert [e.action for e in events_of(fake_app, "job:1")] == [Action.ACQUIRED]


def test_anonymous_post_is_sent_to_login_and_changes_nothing(fake_app, service):
    service.acquire("job:1", "w", ttl=100)
    client = fake_app.test_client()
    token = csrf_token(client)
    response = client.post(
        "/locks/job:1/release", data={"csrf_token": token, "reason": "x"}
    )
    assert response.status_code == 302
    assert response.headers["Location"].startswith("/login")
    assert service.get("job:1").owner == "w"


# -- force release -------------------------------------------------------------------


def test_release_confirmation_names_holder_and_fence(operator, service):
    fence = service.acquire("job:1", "worker-7", ttl=100).lock.fence
    page = soup(operator.get("/locks/job:1/release?next=/?state%3Dheld"))
    text = page.get_text(" ", strip=True)
    assert "worker-7" in text
    assert f"fence {fence}" in text
    form = page.find("form", attrs={"action": "/locks/job:1/release"})
    assert form["method"] == "post"
    assert form["hx-post"] == "/locks/job:1/release"
    assert form.find("input", attrs={"name": "csrf_token"})["value"]
    assert form.find("input", attrs={"name": "fence"})["value"] == str(fence)
    assert form.find("input", attrs={"name": "next"})["value"] == "/?state=held"
    assert form.find("textarea", attrs={"name": "reason"})


def test_release_confirmation_as_htmx_fragment(operator, service):
    service.acquire("job:1", "w", ttl=100)
    response = operator.get(
        "/locks/job:1/release", headers={**HTMX, "HX-Target": "div#action-panel"}
    )
    page = soup(response)
    assert page.body is None
    assert page.find("form", attrs={"action": "/locks/job:1/release"})
    assert "HX-Request" in response.vary


def test_release_post_without_csrf_token_is_refused(operator, service):
    service.acquire("job:1", "w", ttl=100)
    response = operator.post("/locks/job:1/release", data={"reason": "x"})
    assert response.status_code == 400
    assert "CSRF" in response.get_data(as_text=True)
    assert service.get("job:1").owner == "w"


def test_release_without_javascript_redirects_back_with_a_message(
    fake_app, operator, service
):
    fence = service.acquire("job:1", "w", ttl=100).lock.fence
    response = post(
        operator,
        "/locks/job:1/release",
        {"reason": "worker hung", "fence": str(fence), "next": "/?state=held"},
    )
    assert response.status_code == 303
    assert response.headers["Location"] == "/?state=held"
    with pytest.raises(LockNotFound):
        service.get("job:1", include_stale=True)
    event = events_of(fake_app, "job:1")[0]
    assert event.action is Action.FORCE_RELEASED
    assert event.actor == "olga"
    assert event.reason == "worker hung"
    page = soup(operator.get("/?state=held"))
    assert (
        f"Released job:1 (was held by w, fence {fence})."
        in page.select_one("#messages").get_text()
    )


def test_release_with_htmx_swaps_a_status_message_and_triggers_refresh(
    fake_app, operator, service
):
    service.acquire("job:1", "w", ttl=100)
    response = post(operator, "/locks/job:1/release", {"reason": "stuck"}, htmx=True)
    assert response.status_code == 200
    assert response.headers["HX-Trigger"] == "locks-changed"
    page = soup(response)
    assert page.body is None
    status = page.find(attrs={"role": "status"})
    assert "Released job:1" in status.get_text()
    assert events_of(fake_app, "job:1")[0].actor == "olga"


def test_release_accepts_the_csrf_token_as_htmx_header(operator, service):
    service.acquire("job:1", "w", ttl=100)
    token = csrf_token(operator, "/")
    response = operator.post(
        "/locks/job:1/release",
        data={"reason": "stuck"},
        headers={**HTMX, "X-CSRFToken": token},
    )
    assert response.status_code == 200
    with pytest.raises(LockNotFound):
        service.get("job:1", include_stale=True)


def test_release_needs_a_reason(fake_app, operator, service):
    service.acquire("job:1", "w", ttl=100)
    response = post(operator, "/locks/job:1/release", {"reason": "  "}, htmx=True)
    assert response.status_code == 400
    page = soup(response)
    assert page.select_one("#reason-error")
    assert page.find("textarea", attrs={"name": "reason"})["aria-invalid"] == "true"
    assert service.get("job:1").owner == "w"
    assert len(events_of(fake_app, "job:1")) == 1


def test_a_usual_reason_picked_is_the_reason_and_typed_details_follow_it(
    fake_app, operator, service
):
    service.acquire("job:1", "w", ttl=100)
    service.acquire("job:2", "w", ttl=100)
    form = soup(operator.get("/locks/job:1/release"))
    usual = [o.get_text() for o in form.select("select[name=reason_choice] option")]
    assert usual[1:] == [
        "Dead holder: its host or process is gone",
        "Stuck holder: no progress",
        "Maintenance",
        "Incident response",
    ]
    # The pick alone, then the pick with details.
    post(operator, "/locks/job:1/release", {"reason_choice": "Maintenance"})
    post(
        operator,
        "/locks/job:2/release",
        {"reason_choice": "Stuck holder: no progress", "reason": " since 02:00 "},
    )
    assert events_of(fake_app, "job:1")[0].reason == "Maintenance"
    assert (
        events_of(fake_app, "job:2")[0].reason
        == "Stuck holder: no progress: since 02:00"
    )


def test_release_after_the_lock_changed_hands_asks_again(operator, service, clock):
    old = service.acquire("job:1", "w1", ttl=1).lock.fence
    clock.advance(2)
    new = service.acquire("job:1", "w2", ttl=100).lock.fence
    response = post(
        operator, "/locks/job:1/release", {"reason": "x", "fence": str(old)}
    )
    assert response.status_code == 409
    text = soup(response).get_text(" ", strip=True)
    assert f"held by w2 with fence {new}" in text
    assert service.get("job:1").owner == "w2"


def test_release_of_free_resource_is_404(operator):
    assert operator.get("/locks/job:9/release").status_code == 404
    response = post(operator, "/locks/job:9/release", {"reason": "x"}, htmx=True)
    assert response.status_code == 404
    assert "not locked" in response.get_data(as_text=True)


def test_release_of_stale_lock_is_allowed(fake_app, operator, service, clock):
    service.acquire("job:1", "w", ttl=1)
    clock.advance(10)
    response = post(operator, "/locks/job:1/release", {"reason": "tidy"})
    assert response.status_code == 303
    assert events_of(fake_app, "job:1")[0].action is Action.FORCE_RELEASED


# -- claim ---------------------------------------------------------------------------


def test_claim_form_defaults_owner_to_the_operator(operator):
    page = soup(operator.get("/locks/job:1/claim"))
    form = page.find("form", attrs={"action": "/locks/job:1/claim"})
    assert form.find("input", attrs={"name": "owner"})["value"] == "operator:olga"
    assert form.find("input", attrs={"name": "ttl"})
    assert not form.find("input", attrs={"name": "force"})


def test_claim_of_free_resource_grants_it_and_records_the_operator(
    fake_app, operator, service
):
    response = post(operator, "/locks/job:1/claim", {"ttl": "120", "owner": ""})
    assert response.status_code == 303
    lock = service.get("job:1")
    assert lock.owner == "operator:olga"
    assert lock.ttl_remaining == 120
    event = events_of(fake_app, "job:1")[0]
    assert (event.action, event.actor) == (Action.CLAIMED, "olga")


def test_claim_of_held_lock_needs_the_force_confirmation(fake_app, operator, service):
    fence = service.acquire("job:1", "worker-7", ttl=100).lock.fence
    form = soup(operator.get("/locks/job:1/claim")).find(
        "form", attrs={"action": "/locks/job:1/claim"}
    )
    force = form.find("input", attrs={"name": "force"})
    assert force["type"] == "checkbox"
    assert form.find("label", attrs={"for": force["id"]})
    assert f"fence {fence}" in form.get_text(" ", strip=True)

    refused = post(
        operator, "/locks/job:1/claim", {"reason": "deploy", "fence": str(fence)}
    )
    assert refused.status_code == 409
    assert "held by worker-7" in soup(refused).select_one("#force-error").get_text()
    assert service.get("job:1").owner == "worker-7"
    assert len(events_of(fake_app, "job:1")) == 1

    taken = post(
        operator,
        "/locks/job:1/claim",
        {"reason": "deploy", "fence": str(fence), "force": "yes", "owner": "me"},
        htmx=True,
    )
    assert taken.status_code == 200
    assert taken.headers["HX-Trigger"] == "locks-changed"
    lock = service.get("job:1")
    assert lock.owner == "me"
    assert lock.fence > fence
    event = events_of(fake_app, "job:1")[0]
    assert (event.action, event.actor, event.reason, event.previous_owner) == (
        Action.FORCE_CLAIMED,
        "olga",
        "deploy",
        "worker-7",
    )


def test_claim_after_the_lock_changed_hands_shows_the_new_holder(
    operator, service, clock
):
    old = service.acquire("job:1", "w1", ttl=1).lock.fence
    clock.advance(2)
    new = service.acquire("job:1", "w2", ttl=100).lock.fence
    response = post(
        operator,
        "/locks/job:1/claim",
        {"reason": "x", "fence": str(old), "force": "yes"},
        htmx=True,
    )
    assert response.status_code == 409
    page = soup(response)
    assert f"held by w2 with fence {new}" in page.get_text(" ", strip=True)
    # The form now confirms the new grant.
    assert page.find("input", attrs={"name": "fence"})["value"] == str(new)
    assert service.get("job:1").owner == "w2"


def test_claim_of_held_lock_needs_a_reason(operator, service):
    service.acquire("job:1", "w", ttl=100)
    response = post(operator, "/locks/job:1/claim", {"force": "yes"})
    assert response.status_code == 400
    assert service.get("job:1").owner == "w"


@pytest.mark.parametrize(
    ("ttl", "message"),
    [
        ("abc", "must be a number of seconds"),
        ("-1", "positive"),
        ("1e9", "at most"),
        ("nan", "finite"),
    ],
)
def test_claim_with_bad_ttl_is_refused_with_the_reason(operator, service, ttl, message):
    response = post(operator, "/locks/job:1/claim", {"ttl": ttl}, htmx=True)
    assert response.status_code == 400
    assert message in soup(response).select_one("#ttl-error").get_text()
    with pytest.raises(LockNotFound):
        service.get("job:1", include_stale=True)


def test_claim_with_control_characters_in_owner_is_refused(operator, service):
    response = post(operator, "/locks/job:1/claim", {"owner": "bad\x01owner"})
    assert response.status_code == 400
    assert soup(response).select_one("#owner-error")
    with pytest.raises(LockNotFound):
        service.get("job:1", include_stale=True)


# -- lock page -----------------------------------------------------------------------


def test_lock_page_shows_row_history_and_timeline(operator, service, clock):
    """Past instants read as the audit's do: relative, exact on hover."""
    service.acquire("job:1", "w1", ttl=5)
    clock.advance(10)
    service.acquire("job:1", "w2", ttl=100)
    clock.advance(1)
    service.renew("job:1", "w2", ttl=100)
    page = soup(operator.get("/locks/job:1"))
    facts = page.select_one("#lock-summary dl").get_text(" ", strip=True)
    assert "w2" in facts
    # acquired_at as every past instant on the dashboard: relative, exact on hover
    assert "Acquired 1 s ago" in facts
    acquired = page.select_one("#lock-summary dl time[data-age]")
    assert acquired["title"] == "2026-11-30T09:00:10.000Z"
    actions = [
        row.select_one("td.action").get_text()
        for row in page.select("#history tbody tr")
    ]
    # Renewals are folded into the grant they extend.
    assert actions == ["took over · renewed 1×, last 0 s ago", "acquired"]
    last = page.select_one("#history .renewals time")
    assert last["title"] == "2026-11-30T09:00:11.000Z"
    when = [row.select_one("td time") for row in page.select("#history tbody tr")]
    assert [t.get_text() for t in when] == ["1 s ago", "11 s ago"]
    assert when[1]["title"] == "2026-11-30T09:00:00.000Z"
    every = soup(operator.get(page.select_one("#history .rows-shown a")["href"]))
    actions = [
        row.select_one("td.action").get_text()
        for row in every.select("#history tbody tr")
    ]
    assert actions == ["renewed", "took over", "acquired"]
    svg = page.select_one("svg.timeline")
    # A group, not an image: its bars are links that zoom to their grant.
    assert svg["role"] == "group"
    assert svg.find("title").get_text() == "Who held job:1 when"
    assert len(svg.select("rect.tenure")) == 2
    assert svg.select("path.marker-took_over")


def test_lock_page_history_says_who_held_it_and_for_how_long(operator, service, clock):
    """Who held job:42 yesterday, and for how long: each grant's row says how
    long it was held and how it ended, with its date beside its age."""
    service.acquire("job:42", "w-1", ttl=600)
    clock.advance(125)
    service.release("job:42", "w-1")
    clock.advance(0.25)
    service.acquire("job:42", "w-2", ttl=600)
    clock.advance(0.0075)
    service.release("job:42", "w-2")
    clock.advance(86400 + 3600)
    rows = soup(operator.get("/locks/job:42")).select("#history tbody tr")
    held = [row.select_one("td.held").get_text(" ", strip=True) for row in rows]
    assert held == [
        "ended w-2's hold of 8 ms",
        "8 ms until released",
        "ended w-1's hold of 2 min 5 s",
        "2 min 5 s until released",
    ]
    when = rows[-1].select_one("td.when").get_text(" ", strip=True)
    assert when == "1 d 1 h ago 2026-11-30 09:00Z"


def test_the_timeline_zooms_to_one_tenure_of_a_week(operator, service, clock):
    """A 2 min hold yesterday is a 2 px sliver of a week's timeline: its bar
    and its history row zoom the drawing to it, which then fills most of the
    plot; "Show the whole range" goes back; a zoom that is not a fence is a
    400 that says so."""
    service.acquire("job:42", "w-0", ttl=60)
    service.release("job:42", "w-0")
    clock.advance(6 * 86400)
    fence = service.acquire("job:42", "w-1", ttl=600).lock.fence
    clock.advance(125)
    service.release("job:42", "w-1")
    clock.advance(86400)
    page = soup(operator.get("/locks/job:42"))
    whole = {
        bar.find("title").get_text().split(":")[0]: float(bar["width"])
        for bar in page.select("svg.timeline rect.tenure")
    }
    assert whole["w-1, fence " + str(fence)] <= 3
    link = page.select_one(f"svg.timeline a.zoom[href*='zoom={fence}']")
    row_link = page.select_one(f"#history a.zoom-link[href*='zoom={fence}']")
    assert link["href"] == row_link["href"]

    zoomed = soup(operator.get(link["href"]))
    assert f"fence {fence}" in zoomed.find(id="timeline-zoom").get_text()
    bars = zoomed.select("svg.timeline rect.tenure")
    assert len(bars) == 1, "the other grants lie outside the zoomed range"
    plot = timeline.WIDTH - timeline.LABEL_WIDTH - timeline.RIGHT_PAD
    assert float(bars[0]["width"]) >= 0.8 * plot
    assert zoomed.select_one("svg.timeline a.zoom") is None
    back = zoomed.find(id="timeline-zoom").find("a")["href"]
    assert "zoom" not in back
    assert soup(operator.get(back)).find(id="timeline-zoom") is None
    # Polls keep the zoom.
    assert f"zoom={fence}" in zoomed.select_one("[hx-get*='live=']")["hx-get"]

    refused = operator.get("/locks/job:42?zoom=yesterday")
    assert refused.status_code == 400
    assert "zoom must be the fence" in refused.get_data(as_text=True)
    unknown = soup(operator.get("/locks/job:42?zoom=999999"))
    assert unknown.find(id="timeline-zoom") is None  # the whole range


def test_lock_page_shows_the_last_run_a_release_reported(operator, service, clock):
    """``lockkeeper exec`` releases with how its command ended; the lock page
    says how the last such run went, even after later plain releases."""
    assert soup(operator.get("/locks/job:run")).select_one("#last-run") is None
    service.acquire("job:run", "w1", ttl=30)
    clock.advance(5)
    run = {"exit_status": 3, "duration": 4.25, "host": "batch-07"}
    service.release("job:run", "w1", details={"run": run})
    clock.advance(60)
    service.acquire("job:run", "w2", ttl=30)
    service.release("job:run", "w2")  # no run reported: the last run stays
    page = soup(operator.get("/locks/job:run"))
    last = page.select_one("#last-run")
    text = last.get_text(" ", strip=True)
    assert "exit 3" in text
    assert "batch-07" in text
    assert "w1" in text
    assert "1 min ago" in text
    assert last.select_one("strong")["class"] == ["run-failed"]


def test_lock_page_history_pages_newest_first_without_gaps(operator, service, clock):
    service.acquire("job:1", "w", ttl=100)
    for _ in range(44):
        clock.advance(1)
        service.renew("job:1", "w", ttl=100)
    seen = []
    url = "/locks/job:1?rows=all"
    while url:
        page = soup(operator.get(url, headers={**HTMX, "HX-Target": "div#lock-live"}))
        assert page.body is None
        seen.extend(
            row.select_one("time")["datetime"]
            for row in page.select("#history tbody tr")
        )
        link = page.select_one("#history .pager a[rel=next]")
        url = link["href"] if link else None
    assert len(seen) == 45
    assert seen == sorted(seen, reverse=True)
    assert len(set(seen)) == 45


def test_a_lock_renewed_200_times_shows_its_acquire_on_page_one(
    operator, service, clock
):
    service.acquire("job:1", "w", ttl=100)
    for _ in range(200):
        clock.advance(1)
        service.renew("job:1", "w", ttl=100)
    page = soup(operator.get("/locks/job:1"))
    [row] = page.select("#history tbody tr")
    assert row.select_one("td.action").get_text() == (
        "acquired · renewed 200×, last 0 s ago"
    )
    audit = soup(operator.get("/audit?resource=job:1"))
    [row] = audit.select("#audit-results tbody tr")
    assert "acquired · renewed 200×" in row.get_text()


def test_lock_page_of_free_resource_offers_a_claim(operator):
    page = soup(operator.get("/locks/job:free"))
    assert "Not locked" in page.select_one("#lock-summary").get_text()
    assert page.select_one("#lock-summary a[href='/locks/job:free/claim']")
    assert page.select_one("#history .empty")


@pytest.mark.parametrize("name", ["bad%20name", ".", "..", "%2E%2E"])
def test_lock_page_for_an_impossible_name_is_400(operator, name):
    for path in (f"/locks/{name}", f"/locks/{name}/claim", f"/locks/{name}/release"):
        response = operator.get(path)
        assert response.status_code == 400, path
        assert "not a lock name" in response.get_data(as_text=True)


def test_lock_page_polls_and_refreshes_after_actions(operator, service):
    service.acquire("job:1", "w", ttl=100)
    response = operator.get(
        "/locks/job:1", headers={**HTMX, "HX-Target": "div#lock-live"}
    )
    page = soup(response)
    assert page.body is None
    assert page.select_one("#lock-live #lock-summary")
    assert page.select_one("#lock-live #history")
    assert page.select_one("#lock-live svg.timeline")
    poller = page.select_one("#lock-live .poller")
    assert poller["hx-trigger"] == "every 5s, locks-changed from:body"
    assert (poller["hx-target"], poller["hx-swap"]) == ("#lock-live", "outerMorph")
    assert poller["hx-get"] == "/locks/job:1?live=1"


def test_error_page_for_htmx_is_a_fragment(operator):
    response = operator.get("/locks/job:9/release", headers=HTMX)
    assert response.status_code == 404
    assert soup(response).body is None


def test_one_format_for_each_kind_of_instant(operator, service, clock):
    """Past instants read "… ago", coming ones "in …" as a countdown; the
    exact instant is on hover; no page prints a bare timestamp for either."""
    service.acquire("job:1", "w1", ttl=100)
    service.queue.join("job:1", "w2", None, 60, mode="exclusive", limit=1)
    service.freeze("job:", actor="olga", reason="migration", duration=None)
    clock.advance(3)
    lock_page = soup(operator.get("/locks/job:1"))
    gives_up = lock_page.select_one("#lock-queue tbody td.optional .ttl")
    assert gives_up["title"].endswith("Z")
    assert gives_up.get_text().endswith(" s")
    assert "Expires" not in lock_page.select_one("#lock-summary").get_text()
    claim = soup(operator.get("/locks/job:1/claim")).get_text(" ", strip=True)
    assert "for another 1 min 37 s" in claim
    unfreeze = soup(operator.get("/freezes/job:/unfreeze")).get_text(" ", strip=True)
    assert "Frozen by olga 3 s ago" in unfreeze
    for page in (lock_page, soup(operator.get("/audit")), soup(operator.get("/"))):
        for time in page.select("time"):
            assert time.get_text() != time.get("datetime"), time
