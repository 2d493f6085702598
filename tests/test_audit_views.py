"""The /audit page and its exports, through the test client, as a viewer."""

from __future__ import annotations

import csv
import io
import json

import pytest

from app.audit.service import EventFilter, list_events
from tests.dashboard_helpers import soup


@pytest.fixture
def history(service, clock):
    service.acquire("job:1", "w-1", ttl=60, actor="tok-a")
    service.acquire("job:2", 'w, "two"', ttl=60, actor="tok-b")
    clock.advance(45)
    service.release("job:1", "w-1", actor="tok-a")
    service.acquire("report:7", "w-3", ttl=600, actor="tok-a")
    clock.advance(5)
    service.force_release("report:7", actor="alice", reason="line one\nline, two")
    return service


def rows(response):
    return soup(response).select("table.events tbody tr[data-event-id]")


def row_ids(response) -> list[int]:
    return [int(tr["data-event-id"]) for tr in rows(response)]


def test_audit_page_needs_a_login(fake_app):
    response = fake_app.test_client().get("/audit?owner=w-1")
    assert response.status_code == 302
    assert "/login" in response.headers["Location"]


def test_audit_page_lists_events_newest_first_linking_to_lock_pages(viewer, history):
    response = viewer.get("/audit")
    assert response.status_code == 200
    page = soup(response)
    assert page.body is not None
    ids = row_ids(response)
    assert len(ids) == 5
    assert ids == sorted(ids, reverse=True)
    links = [a["href"] for a in page.select("table.events td.resource a")]
    assert links[0] == "/locks/report:7"
    assert "/locks/job:1" in links


def test_audit_page_shows_durations_held_where_the_end_is_known(viewer, history):
    page = soup(viewer.get("/audit?resource=job:1"))
    acquired, released = (
        page.select("tr.action-acquired"),
        page.select("tr.action-released"),
    )
    assert "45 s" in acquired[0].select_one("td.held").get_text()
    assert "until released" in acquired[0].select_one("td.held").get_text()
    assert "w-1's hold of 45 s" in released[0].select_one("td.held").get_text()
    # job:2 is still held: no duration to show.
    held = soup(viewer.get("/audit?resource=job:2")).select_one("tr td.held")
    assert held.get_text(strip=True) == ""


def test_audit_page_shows_each_holder_of_a_semaphore_held_for_its_own_time(
    viewer, service, clock
):
    """Three holders held at once: each grant's row says how long its own
    holder kept it, each release whose hold it ended (before, the next holder's
    grant ended the previous holder's hold: 5 s, 5 s)."""
    for owner in ("p-1", "p-2", "p-3"):
        assert service.acquire("sem:audit", owner, ttl=60, limit=3).acquired
        clock.advance(5)
    clock.advance(5)
    service.release("sem:audit", "p-2")  # held 15 s
    clock.advance(10)
    service.release("sem:audit", "p-1")  # held 30 s
    clock.advance(15)
    service.release("sem:audit", "p-3")  # held 35 s
    page = soup(viewer.get("/audit?resource=sem:audit"))

    def held(action: str) -> dict[str, str]:
        return {
            row.select_one("td.owner").get_text(strip=True): row.select_one(
                "td.held"
            ).get_text(" ", strip=True)
            for row in page.select(f"tr.action-{action}")
        }

    assert held("acquired") == {
        "p-1": "30 s until released",
        "p-2": "15 s until released",
        "p-3": "35 s until released",
    }
    assert held("released") == {
        "p-1": "ended p-1's hold of 30 s",
        "p-2": "ended p-2's hold of 15 s",
        "p-3": "ended p-3's hold of 35 s",
    }


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("owner=w-3", {("report:7", "acquired"), ("report:7", "force released")}),
        ("prefix=job:&action=acquired", {("job:1", "acquired"), ("job:2", "acquired")}),
        ("actor=alice", {("report:7", "force released")}),
        ("resource=job:2", {("job:2", "acquired")}),
        ("since=2026-11-30T09:00:45Z&until=2026-11-30T09:00:50", {
            ("job:1", "released"), ("report:7", "acquired")}),
    ],
)  # fmt: skip
def test_filters_in_the_url_select_the_events(viewer, history, query, expected):
    page = soup(viewer.get(f"/audit?{query}"))
    found = {
        (
            tr.select_one("td.resource").get_text(strip=True),
            tr.select_one("td.action").get_text(strip=True),
        )
        for tr in page.select("tr[data-event-id]")
    }
    assert found == expected


def test_filters_are_shown_back_in_the_form(viewer, history):
    page = soup(
        viewer.get("/audit?prefix=job:&action=released&since=2026-11-30T09:00Z")
    )
    assert page.select_one("#f-prefix")["value"] == "job:"
    assert page.select_one("#f-action option[selected]")["value"] == "released"
    assert page.select_one("#f-since")["value"] == "2026-11-30T09:00Z"
    assert page.select_one("#f-since-read").get_text() == "from 2026-11-30 09:00:00Z"


@pytest.mark.parametrize(
    "query",
    [
        "action=stolen",
        "resource=has%20space",
        "owner=%00",
        "since=someday",
        "since=2026-12-01T00:00Z&until=2026-11-01T00:00Z",
        "limit=many",
        "limit=0",
        # int() takes these; no client means them as a number of rows.
        "limit=%D9%A1%D9%A2",
        "limit=%2B12",
        "limit=1_2",
        "cursor=garbage",
    ],
)
def test_bad_filters_get_a_400_page_naming_the_problem(viewer, history, query):
    response = viewer.get(f"/audit?{query}")
    assert response.status_code == 400
    page = soup(response)
    assert page.select_one("#audit-results [role=alert]") is not None
    assert rows(response) == []


def test_pages_follow_the_keyset_without_gaps_or_repeats(viewer, service):
    for n in range(7):  # all at the same instant: ties in occurred_at
        service.acquire(f"tie:{n}", "w-1", ttl=30)
    seen, url = [], "/audit?limit=3"
    while url:
        response = viewer.get(url)
        assert response.status_code == 200
        seen.extend(row_ids(response))
        link = soup(response).select_one(".pager a[rel=next]")
        url = link["href"] if link else None
    everything = [e.id for e in list_events(EventFilter(), limit=500).items]
    assert seen == everything


RESULTS = {"HX-Request": "true", "HX-Target": "section#audit-results"}


def test_htmx_aiming_at_the_results_gets_the_fragment_and_vary(viewer, history):
    response = viewer.get("/audit?owner=w-1", headers=RESULTS)
    assert response.status_code == 200
    assert {"HX-Request", "HX-Target"} <= set(response.vary)
    assert response.headers["Cache-Control"] == "no-store"
    fragment = soup(response)
    assert fragment.body is None
    assert fragment.select_one("section#audit-results") is not None
    assert len(rows(response)) == 2


def test_bad_filters_in_the_fragment_are_a_400_naming_the_field(viewer, history):
    response = viewer.get("/audit?since=someday", headers=RESULTS)
    assert response.status_code == 400
    fragment = soup(response)
    assert fragment.body is None
    assert "since" in fragment.select_one("[role=alert]").get_text()


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"HX-Request": "true"},
        {"HX-Request": "true", "HX-Target": "main#content"},
        {**RESULTS, "HX-History-Restore-Request": "true"},
        {**RESULTS, "HX-Request-Type": "full"},
    ],
    ids=["browser", "no-target", "other-target", "history-restore", "full"],
)
def test_anything_else_gets_the_whole_page_with_vary(viewer, history, headers):
    response = viewer.get("/audit?owner=w-1", headers=headers)
    assert response.status_code == 200
    assert "HX-Request" in response.vary
    assert "no-store" not in response.headers.get("Cache-Control", "")
    page = soup(response)
    assert page.body is not None
    assert page.select_one("form.audit-filters") is not None
    assert len(rows(response)) == 2


def test_export_links_carry_the_page_filters(viewer, history):
    page = soup(viewer.get("/audit?prefix=job:&owner=w-1"))
    link = page.select_one(".exports a[href*='export.csv']")["href"]
    assert link.startswith("/audit/export.csv?")
    assert "prefix=job:" in link
    assert "owner=w-1" in link


def test_csv_export_streams_the_filtered_set_as_an_attachment(viewer, history):
    response = viewer.get("/audit/export.csv?prefix=job:")
    assert response.status_code == 200
    assert response.is_streamed
    assert response.mimetype == "text/csv"
    assert response.headers["Content-Disposition"].startswith("attachment;")
    assert ".csv" in response.headers["Content-Disposition"]
    exported = list(csv.DictReader(io.StringIO(response.get_data(as_text=True))))
    page_ids = row_ids(viewer.get("/audit?prefix=job:"))
    assert [int(r["id"]) for r in exported] == page_ids
    assert 'w, "two"' in {r["owner"] for r in exported}


def test_jsonl_export_has_one_object_per_line_with_the_awkward_reason(viewer, history):
    response = viewer.get("/audit/export.jsonl?actor=alice")
    assert response.status_code == 200
    assert response.headers["Content-Disposition"].endswith('.jsonl"')
    lines = response.get_data(as_text=True).splitlines()
    assert [json.loads(line)["reason"] for line in lines] == ["line one\nline, two"]


def test_unfiltered_export_has_every_event(viewer, history):
    response = viewer.get("/audit/export.jsonl")
    assert len(response.get_data(as_text=True).splitlines()) == 5


def test_export_with_bad_filters_is_a_400_not_a_partial_file(viewer, history):
    response = viewer.get("/audit/export.csv?since=not-a-time")
    assert response.status_code == 400
    assert "since" in response.get_data(as_text=True)
    assert "Content-Disposition" not in response.headers


def test_export_needs_a_login(fake_app):
    response = fake_app.test_client().get("/audit/export.csv")
    assert response.status_code == 302


@pytest.fixture
def renewed(service, clock):
    service.acquire("job:9", "w-9", ttl=60, actor="tok-a")
    for _ in range(3):
        clock.advance(5)
        service.renew("job:9", "w-9", ttl=60, actor="tok-a")
    service.release("job:9", "w-9", actor="tok-a")
    return service


def actions_of(response) -> list[str]:
    return [tr.select_one("td.action").get_text() for tr in rows(response)]


def test_audit_shows_ownership_changes_with_renewals_folded_by_default(viewer, renewed):
    response = viewer.get("/audit")
    assert actions_of(response) == [
        "released",
        "acquired · renewed 3×, last 0 s ago",
    ]
    last = soup(response).select_one(".renewals time")
    assert last["title"] == "2026-11-30T09:00:15.000Z"
    every = soup(response).select_one("#audit-results .rows-shown a")["href"]
    assert actions_of(viewer.get(every)) == [
        "released",
        "renewed",
        "renewed",
        "renewed",
        "acquired",
    ]


def test_audit_action_filter_takes_several_actions_and_a_not(viewer, renewed):
    both = viewer.get("/audit?action=acquired&action=released")
    assert actions_of(both) == ["released", "acquired"]
    but_renewals = viewer.get("/audit?action=renewed&except=1")
    assert [a.split(" ·")[0] for a in actions_of(but_renewals)] == [
        "released",
        "acquired",
    ]
    only = viewer.get("/audit?action=renewed")
    assert actions_of(only) == ["renewed"] * 3
    assert viewer.get("/audit?action=renewed&action=nope").status_code == 400


def test_audit_export_keeps_every_row_unless_actions_are_chosen(viewer, renewed):
    every = viewer.get("/audit/export.jsonl").get_data(as_text=True).splitlines()
    assert len(every) == 5
    chosen = viewer.get("/audit/export.jsonl?action=renewed&except=1")
    assert len(chosen.get_data(as_text=True).splitlines()) == 2


def test_audit_page_shows_the_token_of_each_event(viewer, service):
    """The actor is who acted (an operator, a token); the token is whose grant
    it was: an operator's force-release names the token that lost the lock."""
    service.acquire("job:9", "w-9", ttl=60, actor="deploy-bot", token="deploy-bot")
    service.force_release("job:9", actor="alice", reason="stuck")
    cells = [
        tr.select_one("td.actor").get_text(" ", strip=True)
        for tr in rows(viewer.get("/audit"))
    ]
    # The token where it is another name than the actor's, not a repeat.
    assert cells == ["alice · token deploy-bot", "deploy-bot"]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("since=-20s", {"released", "acquired", "force released"}),
        ("since=20%20s%20ago", {"released", "acquired", "force released"}),
        ("since=2026-11-30%2009:00:45&until=2026-11-30T09:00:50", {
            "released", "acquired"}),
        ("since=2026-11-30", {"acquired", "released", "force released"}),
        ("since=yesterday&until=today", set()),
        ("since=today&until=now", {"acquired", "released", "force released"}),
        ("since=-1h&until=2026-11-30T09:00:01Z", {"acquired"}),
    ],
)  # fmt: skip
def test_from_and_until_read_what_people_type(viewer, history, clock, query, expected):
    """yesterday, today, now, -20s, "20 s ago", a date, a time without seconds
    or offset (UTC): each read, and the page says what it read."""
    clock.advance(10)  # now 09:01:00, the events at 09:00:00, :45 and :50
    response = viewer.get(f"/audit?rows=all&{query}")
    assert response.status_code == 200, soup(response).select_one("[role=alert]")
    assert {tr.select_one("td.action").get_text() for tr in rows(response)} == expected
    assert soup(response).select_one("#f-since-read") is not None


def test_a_from_that_cannot_be_read_says_what_it_takes(viewer, history):
    response = viewer.get("/audit?since=last%20tuesday")
    assert response.status_code == 400
    error = soup(response).select_one("#since-error").get_text()
    assert error == (
        "must be a date and time, not 'last tuesday': type yesterday, -24h, "
        "2026-11-29 or 2026-11-29 09:00 (UTC)"
    )
    assert soup(response).select_one("#f-since")["value"] == "last tuesday"


def test_quick_ranges_go_back_a_week_and_to_yesterday(viewer, history):
    links = {
        a.get_text(): a["href"]
        for a in soup(viewer.get("/audit")).select(".quick-ranges a")
    }
    assert list(links) == ["15 min", "1 h", "24 h", "7 d", "yesterday"]
    assert "since=2026-11-23T09:00:50Z" in links["7 d"]
    assert "since=yesterday&until=today" in links["yesterday"]


def test_held_for_reads_as_a_duration_never_a_float():
    from datetime import timedelta

    from app.dashboard.audit import held_for

    assert held_for(timedelta(seconds=0.00703)) == "7 ms"
    assert held_for(timedelta(seconds=0.25)) == "250 ms"
    assert held_for(timedelta(seconds=2.54)) == "2.5 s"
    assert held_for(timedelta(seconds=45.2)) == "45 s"
    assert held_for(timedelta(seconds=200)) == "3 min 20 s"


def test_an_event_past_a_day_shows_its_date_beside_how_long_ago(viewer, history, clock):
    clock.advance(2 * 86400)
    [newest, *_] = rows(viewer.get("/audit"))
    when = newest.select_one("td.when").get_text(" ", strip=True)
    assert when.endswith("ago 2026-11-30 09:00Z"), when


def test_the_owner_column_names_a_previous_owner_only_where_it_differs(
    viewer, service, clock
):
    service.acquire("job:t", "w-1", ttl=5)
    clock.advance(10)
    service.acquire("job:t", "w-2", ttl=60)  # a take-over of a stale lock
    service.release("job:t", "w-2")
    owners = [
        tr.select_one("td.owner").get_text(" ", strip=True)
        for tr in rows(viewer.get("/audit"))
    ]
    assert owners == ["w-2", "w-2 was w-1", "w-1"]
