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


def test_the_audit_fits_1440_px_with_when_and_held_side_by_side(
    operator_page: Page, site: Site
):
    """Operator-length names, a take-over and a reason: the audit at 1440 px
    scrolls no way but down, and each grant's When and Held are on screen
    together (they were 1,200 px apart in a table 1,603 px wide)."""
    owner = "batch-07.prod.eu-west-1:48213:nightly-reconcile"
    with site.server.service() as locks:
        for n in range(3):
            locks.acquire(f"reports:region:eu-west-1:nightly:{n}", owner, ttl=60)
            locks.release(f"reports:region:eu-west-1:nightly:{n}", owner)
        locks.acquire("job:42", owner, ttl=0.5)
    page = operator_page
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto(f"{site.url}/audit")
    expect(page.locator("table.audit-events tbody tr")).to_have_count(7)
    widths = page.evaluate(
        "() => [document.documentElement.scrollWidth, window.innerWidth]"
    )
    assert widths[0] <= widths[1], widths
    for header in ("When", "Held"):
        box = page.get_by_role("columnheader", name=header).bounding_box()
        assert box is not None
        assert box["x"] + box["width"] <= 1440, (header, box)
    grant = page.locator("table.audit-events tbody tr.action-acquired")
    expect(grant.filter(has_text="nightly:2").locator("td.held")).to_contain_text(
        "until released"
    )
