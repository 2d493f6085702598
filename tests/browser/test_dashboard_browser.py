"""The dashboard in a real browser: polling, countdown, pause, actions, audit, CSV.

Each test drives Chromium against its own live server; locks change underneath
through the JSON API, as workers would change them.
"""

from __future__ import annotations

import csv
import io
import re
import time

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import OPERATOR, BrowserProblems, Site, row_action

pytestmark = pytest.mark.browser

# The overview polls every 5 s (app/dashboard/views.py POLL_SECONDS).
POLL_WAIT_MS = 15_000


def lock_row(page: Page, resource: str):
    return page.locator("#live table.locks tbody tr").filter(
        has=page.get_by_role("link", name=resource, exact=True)
    )


def mark_document(page: Page) -> None:
    """Tag the current document; a reload or navigation would lose the tag."""
    page.evaluate("window.__lockkeeperTestMark = 'unchanged'")


def assert_same_document(page: Page) -> None:
    assert page.evaluate("window.__lockkeeperTestMark") == "unchanged"


def seconds_shown(text: str) -> float:
    """The countdown's text ("1 min 58 s", "42 s") in seconds."""
    total = 0.0
    for amount, unit in re.findall(r"(\d+)\s*(d|h|min|s)\b", text):
        total += int(amount) * {"d": 86400, "h": 3600, "min": 60, "s": 1}[unit]
    assert total or text.strip() == "0 s", f"not a countdown: {text!r}"
    return total


def test_login_shows_the_overview_and_logout_ends_the_session(
    operator_page: Page, site: Site
):
    page = operator_page
    expect(page.locator(".whoami")).to_contain_text(OPERATOR)
    expect(page.locator(".counts")).to_contain_text("held")

    page.get_by_role("button", name="Log out").click()

    expect(page.get_by_role("heading", name="Log in")).to_be_visible()
    expect(page.get_by_text("You have been logged out.")).to_be_visible()
    page.goto(site.url + "/")
    expect(page).to_have_url(re.compile(r"/login"))


def test_lock_acquired_through_the_api_appears_by_polling_and_counts_down(
    operator_page: Page, site: Site
):
    page = operator_page
    mark_document(page)
    expect(lock_row(page, "job:poll")).to_have_count(0)

    site.acquire("job:poll", "worker-7", ttl=120)

    row = lock_row(page, "job:poll")
    expect(row).to_have_count(1, timeout=POLL_WAIT_MS)
    expect(row.locator(".owner")).to_have_text("worker-7")
    expect(row.locator(".badge")).to_have_text("held")
    assert_same_document(page)

    countdown = row.locator(".ttl")
    first = seconds_shown(countdown.inner_text())
    assert 100 < first <= 120
    page.wait_for_timeout(2_500)
    later = seconds_shown(row.locator(".ttl").inner_text())
    assert first - 4 <= later < first


def test_paused_overview_stops_polling_until_resumed(operator_page: Page, site: Site):
    page = operator_page
    page.get_by_role("link", name="Pause").click()
    expect(page.locator("#live .live")).to_contain_text("Paused.")
    expect(page).to_have_url(re.compile(r"live=0"))
    mark_document(page)

    polls: list[str] = []
    page.on(
        "request",
        lambda request: (
            polls.append(request.url) if request.headers.get("hx-request") else None
        ),
    )
    site.acquire("job:paused", "worker-1", ttl=120)
    page.wait_for_timeout(6_500)  # longer than one poll interval

    assert polls == []
    expect(lock_row(page, "job:paused")).to_have_count(0)

    page.get_by_role("link", name="Resume").click()
    expect(lock_row(page, "job:paused")).to_have_count(1)
    assert polls, "the listener saw no htmx request at all: it proves nothing"
    expect(page.locator("#live .live")).to_contain_text("Live")
    assert_same_document(page)


def test_force_release_asks_for_confirmation_and_updates_the_row_in_place(
    operator_page: Page, site: Site
):
    site.acquire("job:stuck", "worker-9", ttl=600)
    page = operator_page
    page.reload()
    mark_document(page)
    row = lock_row(page, "job:stuck")
    expect(row).to_have_count(1)

    row_action(row, "Release…").click()
    panel = page.locator("#action-panel")
    expect(panel.get_by_role("heading")).to_contain_text("Force release job:stuck")
    expect(panel).to_contain_text("worker-9")
    panel.get_by_label("Reason").fill("worker-9 hung on a dead NFS mount")
    panel.get_by_role("button", name=re.compile("^Release")).click()

    # The result goes to the page's message area; the dialog closes and focus
    # returns to the row's button.
    expect(page.locator("#messages .message-success")).to_contain_text(
        "Released job:stuck"
    )
    expect(page.locator("#action-dialog")).not_to_be_visible()
    expect(lock_row(page, "job:stuck")).to_have_count(0)
    expect(page.locator("#live .count-held .count")).to_have_text("0")
    assert_same_document(page)
    [latest, *_] = site.events("job:stuck")
    assert latest["action"] == "force_released"
    assert latest["actor"] == OPERATOR
    assert latest["reason"] == "worker-9 hung on a dead NFS mount"


def test_claiming_a_stale_lock_gives_it_to_the_operator(
    operator_page: Page, site: Site
):
    site.acquire("job:orphan", "worker-dead", ttl=0.5)
    time.sleep(1)
    page = operator_page
    page.reload()
    mark_document(page)
    row = lock_row(page, "job:orphan")
    expect(row.locator(".badge")).to_have_text("stale")

    row_action(row, "Claim…").click()
    panel = page.locator("#action-panel")
    expect(panel).to_contain_text("has expired")
    expect(panel.get_by_label("Owner")).to_have_value(f"operator:{OPERATOR}")
    panel.get_by_label("TTL in seconds").fill("300")
    panel.get_by_label(re.compile("^Reason")).fill("finish the nightly run by hand")
    panel.get_by_role("button", name="Claim").click()

    expect(page.locator("#messages .message-success")).to_be_visible()
    row = lock_row(page, "job:orphan")
    expect(row.locator(".owner")).to_have_text(f"operator:{OPERATOR}")
    expect(row.locator(".badge")).to_have_text("held")
    assert_same_document(page)
    [latest, *_] = site.events("job:orphan")
    assert latest["action"] == "claimed"
    assert latest["previous_owner"] == "worker-dead"


def test_audit_filter_narrows_the_events_and_the_csv_export(
    operator_page: Page, site: Site, problems: BrowserProblems
):
    site.acquire("report:may", "worker-1")
    site.release("report:may", "worker-1")
    site.acquire("job:other", "worker-2")
    page = operator_page

    page.get_by_role("link", name="Audit").click()
    expect(page.get_by_role("heading", name="Audit log")).to_be_visible()
    events = page.locator("#audit-results table.events tbody tr")
    expect(events).to_have_count(3)
    mark_document(page)

    page.get_by_label("Resource prefix").fill("report:")
    page.get_by_role("button", name="Filter").click()

    expect(page).to_have_url(re.compile(r"prefix=report"))
    expect(events).to_have_count(2)
    expect(events.locator(".resource")).to_have_text(["report:may", "report:may"])
    assert_same_document(page)

    # A download ends the request from the page's point of view.
    problems.allowed_aborts.append(re.compile(r"/audit/export\.csv"))
    with page.expect_download() as download_info:
        page.locator("#audit-results").get_by_role("link", name="CSV").click()
    download = download_info.value
    assert download.suggested_filename.endswith(".csv")
    rows = list(csv.DictReader(io.StringIO(open(download.path()).read())))
    assert [(r["resource"], r["action"]) for r in rows] == [
        ("report:may", "released"),
        ("report:may", "acquired"),
    ]


def test_the_harness_fails_on_csp_violations_and_script_errors(
    operator_page: Page, problems: BrowserProblems
):
    page = operator_page
    page.evaluate(
        """() => {
          const script = document.createElement("script");
          script.textContent = "window.inlineRan = true";
          document.body.append(script);
          setTimeout(() => { throw new Error("boom from a timer"); }, 0);
        }"""
    )
    page.wait_for_timeout(500)

    assert page.evaluate("window.inlineRan") is None  # CSP blocked it
    seen = "\n".join(problems.lines)
    assert "CSP violation: script-src" in seen
    assert "boom from a timer" in seen
    problems.lines.clear()  # seen on purpose: don't fail this test at teardown
