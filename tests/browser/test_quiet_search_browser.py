"""A search of the overview that nothing changes: its counters count what it
shows, its polls are 204s while locks elsewhere change, and a minute of it
open costs under 10 KB. The server runs on a clock the test moves."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import BrowserProblems, Site, leave_for_blank
from tests.clock import FakeClock

pytestmark = pytest.mark.browser

IDLE_BUDGET = 10 * 1024
POLL_SECONDS = 5  # app/dashboard/views.py POLL_SECONDS
CHARTS_POLL_SECONDS = 60  # ACTIVITY_POLL_SECONDS


@pytest.fixture
def site_clock() -> FakeClock:
    return FakeClock(datetime.now(UTC))


def test_a_searchs_counters_count_its_rows_and_its_idle_poll_is_a_204(
    operator_page: Page, site: Site, site_clock: FakeClock
):
    for n in range(4):
        site.acquire(f"job:dead-{n}", f"web-{n}:1:a", ttl=1)
    site.acquire("billing:dead", "db-1:1:a", ttl=1)
    site.acquire("billing:soon", "db-2:1:a", ttl=9)  # 4 s of its 9 s left: expiring
    site_clock.advance(5)  # those ran out: stale
    for n in range(2):
        site.acquire(f"billing:{n}", f"db-{n}:1:a", ttl=3600)
    for n in range(20):
        site.acquire(f"job:{n}", f"web-{n % 3}:{n}:b", ttl=3600 if n % 2 else 10)
    page = operator_page
    page.goto(f"{site.url}/?prefix=billing:")

    badges = page.locator("#locks-table tbody tr td.state .badge")
    expect(badges).to_have_count(4)
    shown = badges.all_inner_texts()
    assert sorted(shown) == ["expiring", "held", "held", "stale"]
    for state in ("held", "expiring", "stale"):
        expect(page.locator(f"#count-{state} .count")).to_have_text(
            str(shown.count(state))
        )
        expect(page.locator(f"#tab-{state} .tab-count")).to_have_text(
            f"({shown.count(state)})"
        )
    expect(page.locator("#tab-all .tab-count")).to_have_text("(4)")
    expect(page.locator("#tab-contended .tab-count")).to_have_text("(0)")
    expect(page.locator("#counts-scope")).to_have_text(
        "matching the search, of 28 locks in all"
    )

    # Locks elsewhere change; the search's next poll has nothing new to say.
    site.acquire("job:new", "web-9:1:c", ttl=3600)
    site.release("job:1", "web-1:1:b")
    with page.expect_response(
        lambda r: "prefix=billing" in r.url and "live=1" in r.url, timeout=15_000
    ) as poll:
        pass
    assert poll.value.status == 204
    expect(page.locator("#tab-all .tab-count")).to_have_text("(4)")


def test_a_quiet_filtered_overview_costs_under_10_kb_a_minute(
    operator_page: Page, site: Site, site_clock: FakeClock, problems: BrowserProblems
):
    """The page and the server share a clock the test moves: a minute of the
    page's timers (twelve table polls, one poll of the charts) runs in a few
    seconds, the server's time moving with it, each poll awaited. Meanwhile,
    locks outside the search come and go (every 5 s), so the charts change and
    are drawn again once; the three searched locks do not change, so every
    poll of the table is a 204. Bytes: each response's headers and body as
    received (compressed), from Chromium's own accounting."""
    page = operator_page
    # The overview the login opened would poll on the real clock meanwhile.
    leave_for_blank(page, problems)
    for n in range(3):
        site.acquire(f"billing:{n}", f"db-{n}:1:a", ttl=3600)
    for n in range(30):
        site.acquire(f"job:{n}", f"web-{n % 3}:{n}:b", ttl=3600)
    in_flight: set = set()
    received: list[tuple[str, int, int]] = []
    counting = False

    def sent(request) -> None:
        in_flight.add(request)

    def done(request) -> None:
        in_flight.discard(request)
        if counting and request.failure:  # no sizes; the problems fixture fails it
            received.append((request.url, request.failure, 0))
        elif counting:
            sizes = request.sizes()
            body = max(sizes["responseBodySize"], 0)
            status = request.response().status
            received.append((request.url, status, sizes["responseHeadersSize"] + body))

    def settle(until) -> None:
        """Let the page's requests finish, polling to a deadline."""
        deadline = time.monotonic() + 10
        while in_flight or not until():
            assert time.monotonic() < deadline, (in_flight, received)
            page.wait_for_timeout(20)  # Playwright delivers the events meanwhile

    page.on("request", sent)
    page.on("requestfinished", done)
    page.on("requestfailed", done)
    page.clock.install()
    with page.expect_response(lambda r: "/activity" in r.url):
        page.goto(f"{site.url}/?prefix=billing:")
    expect(page.locator("#locks-table tbody tr")).to_have_count(3)
    # The charts are in (their minute's timer runs) before time stops: htmx
    # swaps on a timer of the page's clock too.
    expect(page.locator("#activity svg").first).to_be_visible()
    # From here the page's time moves only when the test moves it.
    page.clock.pause_at(datetime.now(UTC) + timedelta(seconds=1))
    settle(lambda: True)

    counting = True
    for step in range(CHARTS_POLL_SECONDS // POLL_SECONDS):
        site.acquire(f"job:elsewhere-{step}", "web-9:1:c", ttl=3600)
        site.release(f"job:{step}", f"web-{step % 3}:{step}:b")
        site_clock.advance(POLL_SECONDS)
        polls = len(received)
        # A jump: the step's timers fire at its end, the polls among them,
        # and the page's clock stands still until they are answered. (Run
        # through instead, a poll due early in the step had its own 4 s
        # timeout fire before the server could answer it.)
        page.clock.fast_forward(POLL_SECONDS * 1000)
        settle(lambda polls=polls: len(received) > polls)
    # The minute's charts poll fires on the same timer step as a table poll
    # and may be sent after that poll's answer came: wait for it as well.
    settle(lambda: any("/activity" in url for url, _, _ in received))
    counting = False
    for line in received:
        print(line)
    total = sum(size for _, _, size in received)
    print(f"bytes in an idle minute: {total}")
    table_polls = [s for url, s, _ in received if "prefix=billing" in url]
    charts_polls = [s for url, s, _ in received if "/activity" in url]
    assert table_polls == [204] * 12
    assert charts_polls == [200]  # drawn again: locks elsewhere came and went
    assert len(received) == 13
    assert total <= IDLE_BUDGET
