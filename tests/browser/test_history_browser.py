"""A busy lock's history in Chromium: renewals folded into their grant, so the
grant itself is on page 1 of its lock page and of the audit."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import Site

pytestmark = pytest.mark.browser


def test_a_lock_renewed_200_times_shows_its_acquire_on_page_1(
    operator_page: Page, site: Site
):
    with site.server.service() as locks:
        locks.acquire("job:busy", "worker-1", ttl=60)
        for _ in range(200):
            locks.renew("job:busy", "worker-1", ttl=60)
    page = operator_page

    page.goto(f"{site.url}/locks/job:busy")
    history = page.locator("#history tbody tr")
    expect(history).to_have_count(1)
    expect(history.first).to_contain_text("acquired")
    expect(history.first).to_contain_text("renewed 200×")
    # Every row, as before: page 1 is renewals, the grant pages back.
    page.get_by_role("link", name="Show every row").click()
    expect(history).to_have_count(20)
    expect(page.locator("#history tbody tr.action-acquired")).to_have_count(0)

    page.goto(f"{site.url}/audit")
    rows = page.locator("table.audit-events tbody tr")
    expect(rows).to_have_count(1)
    acquired = rows.filter(has_text="job:busy").first
    expect(acquired.locator("td.action")).to_contain_text("acquired")
    expect(acquired.locator("td.action")).to_contain_text("renewed 200×")
    page.get_by_role("link", name="Show every row").click()
    expect(
        page.locator("table.audit-events tbody tr.action-renewed").first
    ).to_be_visible()
    expect(page.locator("table.audit-events tbody tr.action-acquired")).to_have_count(0)
