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
    from app.extensions import lock_service

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


def test_a_search_matching_ten_locks_does_not_scroll_sideways_at_390_px(
    operator_page: Page, site: Site
):
    """The bulk actions kept a desktop right margin on a phone: 397 px wide."""
    for n in range(10):
        site.acquire(f"job:{n}", f"web-1:{n}:x", ttl=600)
    page = operator_page
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(site.url + "/?prefix=job:")
    expect(page.get_by_role("link", name="Release the 10 matching…")).to_be_visible()
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, width


def audit_history(site: Site) -> None:
    from app.extensions import lock_service

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


def test_a_semaphores_lock_page_at_390_px_reads_without_sideways_scroll(
    operator_page: Page, site: Site
):
    """Holders, the line and the history are cards on a phone, and the
    timeline keeps legible letters in a region of its own that a keyboard can
    scroll: the page itself never scrolls sideways, and axe finds nothing
    serious (its tables were 747 px in 324 px, with 5 unreachable regions)."""
    from axe_playwright_python.sync_playwright import Axe

    from app.extensions import lock_service

    with site.server.app.app_context():
        service = lock_service()
        for n in range(3):
            owner = f"batch-07.example.internal:{n}:abcdef0123456789"
            assert service.acquire("sem:nightly", owner, ttl=600, limit=3).acquired
        service.queue.join(
            "sem:nightly",
            "batch-08.example.internal:1:x",
            None,
            60,
            limit=3,
            mode="exclusive",
        )
    page = operator_page
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(site.url + "/locks/sem:nightly")
    expect(page.locator("#holders-table tbody tr")).to_have_count(3)
    expect(page.locator("#queue-table td.wants")).to_have_text(["a place of 3"])
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    card = page.locator("#holders-table tbody tr").first
    for cell in ("owner", "remaining", "fence", "held-for", "actions"):
        box = card.locator(f"td.{cell}").bounding_box()
        assert box is not None, cell
        assert box["x"] >= 0, (cell, box)
        assert box["x"] + box["width"] <= 390, (cell, box)
    label = page.locator("svg.timeline text").first
    size = label.evaluate("t => t.getBoundingClientRect().height")
    assert size >= 10, f"timeline letters {size} px high"
    results = Axe().run(page)
    bad = [
        f"{v['id']} ({v['impact']}): {v['nodes'][0]['target']}"
        for v in results.response["violations"]
        if v["impact"] in ("serious", "critical")
    ]
    assert bad == []


@pytest.mark.parametrize("width", [1440, 1920])
def test_by_host_release_buttons_read_whole_at_desktop_widths(
    operator_page: Page, site: Site, width: int
):
    """By host: each row's release says what it releases ("Release its 137
    locks…", a label that read as cut off as "Release its 137…"), whole
    inside its cell and the table, the page not scrolling sideways."""
    from app.extensions import lock_service

    with site.server.app.app_context():
        service = lock_service()
        for n in range(137):
            service.acquire(f"batch:{n}", f"host-00:{n % 7}:dead", ttl=600)
        owner = "compactor-7@storage-node-12.eu-west.internal"
        service.acquire("compact:1", owner, ttl=600)
    page = operator_page
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(site.url + "/?group=host")
    # Its name says whose: "Release its 137 locks of host-00 …".
    named = re.compile(r"^Release its 137 locks of host-00 ?…$")
    button = page.get_by_role("link", name=named)
    expect(button).to_be_visible()
    shown = button.evaluate(
        "a => [...a.childNodes].filter(n => n.nodeType === 3)"
        ".map(n => n.textContent).join('')"
    )
    assert shown == "Release its 137 locks…"
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    for link in page.locator("#groups-table td.actions a").all():
        fits = link.evaluate(
            """a => {
                const box = a.getBoundingClientRect();
                const cell = a.closest('td').getBoundingClientRect();
                const table = a.closest('table').getBoundingClientRect();
                return a.scrollWidth <= a.clientWidth + 1
                    && box.right <= cell.right + 0.5 && box.right <= table.right
                    && box.height < 2.2 * parseFloat(getComputedStyle(a).fontSize);
            }"""
        )
        assert fits, link.inner_text()
