"""Finding the lock that matters, in Chromium: the urgent order by default, the
Contended tab, the natural order of names and numbered pages, by keyboard."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import Site

pytestmark = pytest.mark.browser


def wait_in_line(site: Site, resource: str, count: int = 1) -> None:
    """Places in ``resource``'s line, as waiting acquires leave them."""
    from app.extensions import lock_service

    with site.server.app.app_context():
        for n in range(count):
            lock_service().queue.join(
                resource, f"waiter-{n}", None, 120, mode="exclusive", limit=1
            )


def test_contended_first_then_numbered_pages_in_natural_order(
    operator_page: Page, site: Site
):
    for n in (20001, 4100, 9):
        site.acquire(f"job:{n}", "web1:1:a", ttl=600)
    site.acquire("job:soon", "web1:1:a", ttl=30)
    wait_in_line(site, "job:20001", 2)
    page = operator_page
    page.reload()
    resources = page.locator("#live tbody td.resource")
    # Contended, then the least time left; the waiters are on the row.
    expect(resources).to_have_text(["job:20001", "job:soon", "job:4100", "job:9"])
    expect(page.locator("#live tbody tr").first).to_contain_text("2 waiting")

    page.get_by_role("link", name=re.compile(r"^Contended")).click()
    expect(page).to_have_url(re.compile(r"state=contended"))
    expect(page.locator("#tab-contended")).to_have_attribute("aria-current", "page")
    expect(resources).to_have_text(["job:20001"])
    expect(page.locator("#tab-contended .tab-count")).to_have_text("(1)")

    page.get_by_role("link", name=re.compile(r"^All")).click()
    # Each swap lands before the next click (a link of the page before would
    # keep its tab).
    expect(page.locator("#tab-all")).to_have_attribute("aria-current", "page")
    expect(resources).to_have_count(4)
    page.get_by_role("link", name="By name").click()
    expect(page).to_have_url(re.compile(r"sort=resource"))
    expect(resources).to_have_text(["job:9", "job:4100", "job:20001", "job:soon"])

    for n in range(60):
        site.acquire(f"batch:{n}", "db7:2:b", ttl=600)
    page.get_by_label("Resource starts with").fill("batch:")
    page.get_by_label("Resource starts with").press("Enter")
    expect(page).to_have_url(re.compile(r"prefix=batch"))
    expect(resources.first).to_have_text("batch:0")
    pager = page.get_by_role("navigation", name="Pages of locks")
    pager.get_by_role("link", name="3", exact=True).focus()
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile(r"page=3"))
    expect(resources).to_have_text([f"batch:{n}" for n in range(50, 60)])
    expect(pager.locator("[aria-current=page]")).to_have_text("3")
    pager.get_by_role("link", name="100", exact=True).click()
    expect(resources).to_have_count(60)
    expect(resources.last).to_have_text("batch:59")
