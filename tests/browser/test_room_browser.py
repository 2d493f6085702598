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
