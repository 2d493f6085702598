"""Room for the locks: freezes as one line, in a real browser at desktop and
phone sizes."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import Site

pytestmark = pytest.mark.browser


def freeze_three(site: Site) -> None:
    from app.locks.service import lock_service

    with site.server.app.app_context():
        service = lock_service()
        for prefix, hours in (("billing:", 2), ("report:", 1), ("sync:", None)):
            service.freeze(
                prefix,
                actor="olivia",
                reason=f"maintenance of {prefix}",
                duration=timedelta(hours=hours) if hours else None,
            )


def rows_on_screen(page: Page) -> int:
    return page.evaluate(
        """() => [...document.querySelectorAll('#locks-table tbody tr')]
              .filter(r => r.getBoundingClientRect().bottom <= innerHeight).length"""
    )


def test_three_freezes_leave_fifteen_rows_visible_at_1440_by_900(
    operator_page: Page, site: Site
):
    for n in range(30):
        site.acquire(f"job:{n}", f"web-1:{n}:x", ttl=600)
    freeze_three(site)
    page = operator_page
    page.set_viewport_size({"width": 1440, "height": 900})
    page.reload()
    expect(page.locator("#freezes summary")).to_contain_text(
        re.compile(r"3 prefixes frozen\s+— the first ends in (59 min|1 h)")
    )
    expect(page.locator("#freezes .freeze-banner").first).to_be_hidden()
    assert rows_on_screen(page) >= 15
    page.locator("#freezes summary").click()
    expect(page.locator("#freezes .freeze-banner")).to_have_count(3)
    expect(
        page.locator("nav[aria-label=Main] a", has_text="Freezes")
    ).to_have_attribute("href", "/freezes")


def test_three_freezes_leave_the_first_lock_on_a_phone_first_screen(
    operator_page: Page, site: Site
):
    site.acquire("job:1", "web-1:1:x", ttl=600)
    freeze_three(site)
    page = operator_page
    page.set_viewport_size({"width": 390, "height": 844})
    page.reload()
    first = page.locator("#locks-table tbody tr").first
    expect(first).to_be_visible()
    box = first.bounding_box()
    assert box is not None
    assert box["y"] + box["height"] <= 844


def audit_history(site: Site) -> None:
    from app.locks.service import lock_service

    with site.server.app.app_context():
        service = lock_service()
        for n in range(6):
            resource = f"report:{n}:" + "x" * 40
            service.acquire(resource, f"batch-07.example.internal:{n}:abcdef", ttl=60)
            service.force_release(
                resource,
                actor="olivia",
                reason="the nightly batch host went away during the outage; "
                "its locks were released so the retry can run",
            )


def test_the_audit_at_390_px_shows_action_owner_actor_and_reason_without_scrolling(
    operator_page: Page, site: Site
):
    audit_history(site)
    page = operator_page
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(site.url + "/audit")
    card = page.locator("table.audit-events tbody tr").first
    for cell in ("action", "owner", "actor", "reason"):
        box = card.locator(f"td.{cell}").first.bounding_box()
        assert box is not None, cell
        assert box["x"] >= 0, cell
        assert box["x"] + box["width"] <= 390, cell
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    assert card.locator("td.when time").get_attribute("title")  # the exact instant


def test_the_audit_at_1920_px_gives_reason_room_and_never_scrolls_sideways(
    operator_page: Page, site: Site
):
    audit_history(site)
    page = operator_page
    page.set_viewport_size({"width": 1920, "height": 1080})
    page.goto(site.url + "/audit")
    assert page.evaluate("document.documentElement.scrollWidth") <= 1920
    reason = page.locator("table.audit-events tbody tr td.reason").first
    box = reason.bounding_box()
    assert box is not None
    assert box["width"] >= 250
    assert box["height"] <= 80  # three lines at most
    page.get_by_role("link", name="15 min").click()
    expect(page).to_have_url(re.compile(r"since="))
    expect(page.locator("table.audit-events tbody tr")).to_have_count(12)
