"""The dashboard's second round in Chromium: offline and back, a poll that keeps
focus and selection, the live lock page, the confirmation dialog, sorting, owner
search and grouping, a phone's width, and axe-core on every page in both schemes.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from axe_playwright_python.sync_playwright import Axe
from playwright.sync_api import Page, expect
from werkzeug.serving import make_server

from app.dashboard.forms import LOCKS_CHANGED
from tests.browser.conftest import (
    OPERATOR,
    OPERATOR_PASSWORD,
    BrowserProblems,
    Site,
    row_action,
)

pytestmark = pytest.mark.browser

POLL_WAIT_MS = 15_000
# First failed poll: at most one interval (5 s) plus the poll timeout (4 s).
OFFLINE_WAIT_MS = 12_000


def log_in(page: Page, url: str) -> None:
    page.set_default_timeout(10_000)
    page.goto(url + "/")
    page.get_by_label("Username").fill(OPERATOR)
    page.get_by_label("Password").fill(OPERATOR_PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.get_by_role("heading", name="Locks").wait_for()


def lock_row(page: Page, resource: str):
    return page.locator("#live table.locks tbody tr").filter(
        has=page.get_by_role("link", name=resource, exact=True)
    )


# -- a server this test can stop and start again on the same port ----------------


class RestartableServer:
    def __init__(self, app) -> None:
        self.app = app
        self.port = 0
        self._server = None
        self._thread = None

    def start(self) -> None:
        self._server = make_server("127.0.0.1", self.port, self.app, threaded=True)
        self.port = self._server.server_port
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}
        )
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
            self._server = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextmanager
def restartable(make_app) -> Iterator[tuple[RestartableServer, httpx.Client]]:
    from app.auth.service import create_token, create_user

    app = make_app()
    with app.app_context():
        create_user(OPERATOR, OPERATOR_PASSWORD, "operator")
        token = create_token("restartable")
    server = RestartableServer(app)
    server.start()
    try:
        with httpx.Client(
            base_url=server.url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        ) as api:
            yield server, api
    finally:
        server.stop()


def test_offline_banner_within_one_poll_and_recovery_shown(
    page: Page, make_app, problems: BrowserProblems
):
    with restartable(make_app) as (server, api):
        api.post("/api/v1/locks/job:1", json={"owner": "w-1", "ttl": 300})
        log_in(page, server.url)
        release = row_action(lock_row(page, "job:1"), "Release…")
        expect(release).to_be_visible()
        banner = page.locator("#connection")
        expect(banner).to_be_hidden()
        table_at = page.locator("#locks-table").bounding_box()

        server.stop()
        expect(banner).to_be_visible(timeout=OFFLINE_WAIT_MS)
        expect(banner).to_contain_text("Offline")
        # The banner lies over the page: nothing under the pointer moves.
        assert page.locator("#locks-table").bounding_box() == table_at
        expect(page.locator("#live .live")).to_contain_text("Offline since")
        expect(release).to_have_attribute("aria-disabled", "true")
        release.click(force=True)  # does nothing while offline
        expect(page.locator("#action-dialog")).to_be_hidden()

        server.start()
        expect(banner).to_contain_text("Reconnected", timeout=POLL_WAIT_MS)
        expect(page.locator("#live .live")).to_contain_text("Live, every 5 s")
        expect(release).not_to_have_attribute("aria-disabled", "true")
        # A server that accepts connections but never answers: the poll's own
        # timeout (4 s) turns the page offline, without waiting for TCP.
        server.stop()
        hung = socket.create_server(("127.0.0.1", server.port))
        try:
            expect(banner).to_contain_text("no answer in time", timeout=OFFLINE_WAIT_MS)
        finally:
            hung.close()
        server.start()
        expect(banner).to_contain_text("Reconnected", timeout=POLL_WAIT_MS)

        # The failed polls were the point of this test; nothing else went wrong.
        assert problems.lines
        refused = (
            "ERR_CONNECTION_REFUSED",
            "Failed to fetch",
            "ERR_EMPTY_RESPONSE",
            "ERR_CONNECTION_RESET",
            "ERR_ABORTED",
            "timeout",
        )
        assert all(any(sign in line for sign in refused) for line in problems.lines), (
            problems.lines
        )
        problems.lines.clear()


def test_slow_charts_are_waited_for_not_taken_for_a_lost_connection(
    operator_page: Page, site: Site
):
    """On a busy service the charts take seconds to count while the table's
    polls are answered at once: they come late, and the page stays online."""
    app = site.server.app
    answer = app.wsgi_app

    def slow_charts(environ, start_response):
        if environ["PATH_INFO"] == "/activity":
            time.sleep(5.5)  # longer than a poll's timeout (4 s)
        return answer(environ, start_response)

    app.wsgi_app = slow_charts
    page = operator_page
    page.reload()
    expect(page.locator("#activity svg").first).to_be_visible(timeout=POLL_WAIT_MS)
    expect(page.locator("#connection")).to_be_hidden()
    expect(page.locator("html.offline")).to_have_count(0)


def test_polls_keep_focus_and_selection(operator_page: Page, site: Site):
    for n in range(3):
        site.acquire(f"job:{n}", f"worker-{n}", ttl=600)
    page = operator_page
    page.reload()
    button = row_action(lock_row(page, "job:1"), "Claim…")
    button.focus()
    page.evaluate("document.activeElement.__kept = true")
    # Select an owner's text, as an operator copying it would.
    page.evaluate(
        """() => {
          const cell = document.querySelector('#live tbody tr:nth-child(3) td.owner');
          const range = document.createRange();
          range.selectNodeContents(cell);
          getSelection().removeAllRanges();
          getSelection().addRange(range);
        }"""
    )
    for poll in ("job:a", "job:b"):  # two polls that change the table
        site.acquire(poll, "worker-new", ttl=600)
        expect(lock_row(page, poll)).to_have_count(1, timeout=POLL_WAIT_MS)
    assert page.evaluate("document.activeElement.__kept === true")
    assert page.evaluate("document.activeElement.id") == button.get_attribute("id")
    assert page.evaluate("getSelection().toString()") == "worker-2"


def test_rows_hold_their_order_while_the_pointer_is_on_the_table(
    operator_page: Page, site: Site
):
    """Ordered by time left, the first lock renewed for longer belongs last:
    while the pointer rests on the table, the poll updates its time left in
    place and the rows keep their order, with a note that says so; "Re-sort
    now" puts it last."""
    for n, name in enumerate("abcde"):
        site.acquire(f"job:{name}", "w", ttl=100 * (n + 1))
    page = operator_page
    page.goto(site.url + "/?sort=remaining")

    def names():
        return page.locator("#locks-table tbody tr[id] td.resource").all_inner_texts()

    assert names() == [f"job:{name}" for name in "abcde"]
    lock_row(page, "job:c").locator("td.resource").hover()
    site.acquire("job:a", "w", ttl=3000)
    note = page.locator("#order-held")
    expect(note).to_contain_text("5 rows would move", timeout=POLL_WAIT_MS)
    assert names() == [f"job:{name}" for name in "abcde"]
    expect(lock_row(page, "job:a").locator(".ttl")).to_contain_text("49 min")
    note.get_by_role("button", name="Re-sort now").click()
    expect(note).to_have_count(0)
    assert names() == [f"job:{name}" for name in "bcdea"]


def test_lock_page_is_live_and_shows_an_action_at_once(operator_page: Page, site: Site):
    site.acquire("job:live", "worker-1", ttl=600)
    page = operator_page
    page.goto(site.url + "/locks/job:live")
    expect(page.locator("#lock-state")).to_contain_text("held")

    # A worker releases: the page follows by polling.
    site.release("job:live", "worker-1")
    expect(page.locator("#lock-state")).to_contain_text(
        "Not locked", timeout=POLL_WAIT_MS
    )
    expect(page.locator("#history tbody tr").first).to_contain_text("released")

    site.acquire("job:live", "worker-2", ttl=600)
    expect(page.locator("#lock-summary")).to_contain_text(
        "worker-2", timeout=POLL_WAIT_MS
    )

    # The operator acts: the dialog opens with focus on its first field (the
    # usual reasons, then the reason's text), and the page shows the new
    # state before the next poll could.
    opener = page.get_by_role("link", name="Force release…")
    opener.click()
    dialog = page.locator("#action-dialog")
    expect(dialog).to_be_visible()
    expect(dialog.get_by_label("Why")).to_be_focused()
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    expect(opener).to_be_focused()

    opener.press("Enter")
    expect(dialog.get_by_label("Why")).to_be_focused()
    page.keyboard.press("Tab")
    expect(dialog.get_by_label("Reason")).to_be_focused()
    page.keyboard.type("worker-2 is gone")
    with page.expect_response(lambda r: r.request.method == "POST") as posted:
        dialog.get_by_role("button", name=re.compile("^Release")).click()
    # The action's answer tells the page to refresh at once (not at its next
    # poll); how soon that lands depends on the machine, so it is waited for.
    assert posted.value.headers.get("hx-trigger") == LOCKS_CHANGED
    expect(page.locator("#lock-state")).to_contain_text(
        "Not locked", timeout=POLL_WAIT_MS
    )
    expect(page.locator("#history tbody tr").first).to_contain_text(
        "force released", timeout=POLL_WAIT_MS
    )
    expect(page.locator("#messages")).to_contain_text("Released job:live")


def test_sorting_owner_search_and_grouping(operator_page: Page, site: Site):
    site.acquire("job:a", "web1:1:x", ttl=600)
    site.acquire("job:b", "web1:2:y", ttl=60)
    site.acquire("job:c", "db7:1:z", ttl=300)
    page = operator_page
    page.reload()
    resources = page.locator("#live tbody td.resource")
    # Urgent first by default: the least time left first.
    expect(resources).to_have_text(["job:b", "job:c", "job:a"])
    page.get_by_role("link", name="Resource").click()
    expect(resources).to_have_text(["job:a", "job:b", "job:c"])

    page.get_by_role("link", name="Remaining").click()
    expect(resources).to_have_text(["job:b", "job:c", "job:a"])
    expect(page).to_have_url(re.compile(r"sort=remaining"))
    page.get_by_role("link", name=re.compile("^Remaining")).click()
    expect(resources).to_have_text(["job:a", "job:c", "job:b"])

    page.get_by_label("Owner contains").fill("WEB1")
    page.get_by_role("button", name="Search").click()
    expect(resources).to_have_text(["job:a", "job:b"])

    page.get_by_role("link", name="By host").click()
    groups = page.locator("#groups-table tbody tr")
    expect(groups).to_have_count(1)
    expect(groups.first).to_contain_text("web1")
    page.get_by_label("Owner contains").fill("")
    page.get_by_role("button", name="Search").click()
    expect(groups).to_have_count(2)
    expect(page).to_have_url(re.compile(r"group=host"))


def test_phone_width_keeps_state_remaining_and_actions_in_view(
    operator_page: Page, site: Site
):
    long_name = "job:" + "very-long-resource-name-" * 8
    site.acquire(long_name, "worker-" + "x" * 120, ttl=600)
    site.acquire("job:short", "w", ttl=5)
    page = operator_page
    page.set_viewport_size({"width": 390, "height": 844})
    for url in ("/", f"/locks/{long_name}", "/audit"):
        page.goto(site.url + url)
        overflow = page.evaluate(
            "document.documentElement.scrollWidth - window.innerWidth"
        )
        assert overflow <= 0, f"{url} overflows by {overflow}px"
    page.goto(site.url + "/")
    for resource in (long_name, "job:short"):
        row = lock_row(page, resource)
        row.locator("details.row-menu summary").click()
        for part in (
            ".badge",
            ".ttl",
            "summary",
            "a:has-text('Release…')",
            "a:has-text('Claim…')",
        ):
            box = row.locator(part).bounding_box()
            assert box is not None, part
            assert box["x"] >= 0, (resource, part)
            assert box["x"] + box["width"] <= 390, (resource, part)
    cell = lock_row(page, long_name).locator("td.resource a")
    assert cell.get_attribute("title") == long_name


def test_overview_fits_1280_px_with_each_rows_actions_in_reach(
    operator_page: Page, site: Site
):
    # Names, owners and tokens as long as real ones get: the columns that
    # ellipsize must, and the actions column must stay on screen.
    for n in range(3):
        site.acquire(
            f"batch:nightly-reindex-{n}:" + "segment-" * 6,
            f"worker-{n}.build-farm.example.internal:" + "pid-4242-" * 4,
            ttl=600,
        )
    page = operator_page
    page.set_viewport_size({"width": 1280, "height": 800})
    page.reload()
    table = page.locator("#locks-table")
    expect(table.locator("tbody tr")).to_have_count(3)
    overflow = page.evaluate(
        """() => {
          const scroller = document.querySelector('#live .table-scroll');
          return {
            table: scroller.scrollWidth - scroller.clientWidth,
            page: document.documentElement.scrollWidth - window.innerWidth,
          };
        }"""
    )
    assert overflow == {"table": 0, "page": 0}, overflow
    for row in table.locator("tbody tr").all():
        summary = row.locator("details.row-menu summary")
        expect(summary).to_have_count(1)
        summary.click()
        for name in ("Release…", "Claim…"):
            link = row.get_by_role("link", name=name)
            expect(link).to_be_visible()
            box = link.bounding_box()
            assert box is not None, name
            assert box["x"] + box["width"] <= 1280, (name, box)
    after = page.evaluate(
        "document.querySelector('#live .table-scroll').scrollWidth"
        " - document.querySelector('#live .table-scroll').clientWidth"
    )
    assert after == 0, f"an open menu widens the table by {after}px"


def test_an_open_row_menu_stays_open_through_a_poll(operator_page: Page, site: Site):
    site.acquire("job:menu", "worker-1", ttl=600)
    page = operator_page
    page.reload()
    row = lock_row(page, "job:menu")
    row_action(row, "Release…")
    site.acquire("job:other", "worker-2", ttl=600)  # a poll that changes the table
    expect(lock_row(page, "job:other")).to_have_count(1, timeout=POLL_WAIT_MS)
    expect(row.locator("details.row-menu")).to_have_attribute("open", "")
    expect(row.get_by_role("link", name="Release…")).to_be_visible()


def test_audit_tails_new_events_in_place_but_not_while_the_reader_scrolled(
    operator_page: Page, site: Site
):
    for n in range(40):  # a page long enough to scroll
        site.acquire(f"job:old-{n}", "worker-1", ttl=600)
    page = operator_page
    page.goto(site.url + "/audit")
    mark_document = "window.__tailMark = 'kept'"
    page.evaluate(mark_document)
    rows = page.locator("#audit-results tbody tr")
    site.acquire("job:new-1", "worker-2", ttl=600)
    expect(rows.first.locator("td.resource")).to_have_text(
        "job:new-1", timeout=POLL_WAIT_MS
    )
    assert page.evaluate("window.__tailMark") == "kept", "no reload"
    assert "/audit" in page.url
    assert "live" not in page.url, "polls are not pushed to history"

    # Scrolled down to older rows: the tail holds still.
    page.mouse.wheel(0, 2000)
    page.wait_for_function("window.scrollY > 100")
    polls: list[str] = []
    page.on("request", lambda r: polls.append(r.url) if "/audit" in r.url else None)
    site.acquire("job:new-2", "worker-2", ttl=600)
    page.wait_for_timeout(6_500)  # longer than one poll interval
    assert polls == [], "a scrolled reader's tail polls nothing"
    expect(rows.first.locator("td.resource")).to_have_text("job:new-1")
    # Back at the top, the next poll brings the new event in.
    page.evaluate("window.scrollTo(0, 0)")
    expect(rows.first.locator("td.resource")).to_have_text(
        "job:new-2", timeout=POLL_WAIT_MS
    )


# Each colour scheme at a desktop width, and the narrow layout (the stylesheet's
# one breakpoint is 720 px: wider desktops lay out as 1280 does).
@pytest.mark.parametrize(
    ("scheme", "width"), [("light", 1280), ("dark", 1280), ("light", 390)]
)
def test_axe_finds_no_serious_violation_on_any_page(
    operator_page: Page, site: Site, scheme: str, width: int
):
    site.acquire("job:held", "worker-1", ttl=600)
    site.acquire("job:expiring", "worker-2", ttl=10)
    site.acquire("job:stale", "worker-3", ttl=0.2)
    from app.extensions import lock_service

    with site.server.app.app_context():
        service = lock_service()
        for n in range(2):
            service.acquire("sem:pool", f"host-{n}:1:p", ttl=600, limit=3)
            service.acquire("cfg:main", f"host-{n}:1:r", ttl=600, mode="shared")
        session = service.sessions.create("host-7:1:s", 600, token="w")
        service.acquire("leader:main", "host-7:1:s", session=session.id, token="w")
        # Waiting lines of each kind: a writer behind the readers, a reader
        # behind it, a semaphore's holder.
        service.queue.join(
            "cfg:main", "host-8:1:w", None, 600, mode="exclusive", limit=1
        )
        service.queue.join("cfg:main", "host-8:2:r", None, 600, mode="shared", limit=1)
        service.queue.join(
            "sem:pool", "host-9:1:p", None, 600, limit=3, mode="exclusive"
        )
    page = operator_page
    page.set_viewport_size({"width": width, "height": 900})
    page.emulate_media(color_scheme=scheme)
    axe = Axe()
    found = {}

    def check(label: str) -> None:
        results = axe.run(page)
        bad = [
            f"{v['id']} ({v['impact']}): {v['nodes'][0]['target']}"
            for v in results.response["violations"]
            if v["impact"] in ("serious", "critical")
        ]
        if bad:
            found[label] = bad

    for url in (
        "/",
        "/?prefix=job:",
        "/?state=stale&sort=expires",
        "/?group=host",
        "/?group=prefix",
        "/locks/job:held",
        "/locks/sem:pool",
        "/locks/cfg:main",
        "/locks/leader:main",
        "/locks/job:held/release",
        "/locks/job:stale/claim",
        "/audit",
        "/audit?rows=all",
        "/freezes",
        "/freezes/new",
        "/activity",
        "/release-many?matching=1&prefix=job:",
        "/sessions",
    ):
        page.goto(site.url + url)
        check(url)
    page.goto(site.url + "/")
    row_action(lock_row(page, "job:held"), "Release…").click()
    expect(page.locator("#action-dialog")).to_be_visible()
    check("release dialog")
    page.keyboard.press("Escape")
    page.keyboard.press("f")
    expect(page.locator("#action-dialog")).to_be_visible()
    check("freeze dialog")
    page.keyboard.press("Escape")
    page.get_by_role("button", name="Log out").click()
    page.get_by_role("heading", name="Log in").wait_for()
    check("/login")
    assert not found, found


def test_charts_left_partly_uncounted_fill_in_within_seconds(
    page: Page, site: Site, problems: BrowserProblems, monkeypatch
):
    """A first drawing with nothing stored counts only its budget of events and
    leaves the older part of the range to a background count: the page says so,
    polls every few seconds meanwhile, and shows the whole range once it is
    stored, without a reload and well before the minute's poll."""
    from datetime import UTC, datetime, timedelta

    from lockkeeper_core.models import LockEvent

    from app.audit import rollup
    from app.dashboard import charts
    from app.extensions import db

    now = datetime.now(UTC)
    with site.server.app.app_context():
        for minutes in range(2, 40, 2):  # one grant every other minute
            at = now - timedelta(minutes=minutes)
            db.session.add(
                LockEvent(
                    resource=f"job:{minutes}",
                    action="acquired",
                    owner="w",
                    fence=1,
                    acquired_at=at,
                    expires_at=at + timedelta(minutes=1),
                    occurred_at=at,
                )
            )
            db.session.flush()
        db.session.commit()
    monkeypatch.setattr(rollup, "EVENTS_PER_DRAWING", 3)
    # The background count waits until the page has shown that it counts.
    shown_counting = threading.Event()
    count_in_background = charts._count_in_background

    def after_the_page_saw_it(*args):
        shown_counting.wait(timeout=30)
        count_in_background(*args)

    monkeypatch.setattr(charts, "_count_in_background", after_the_page_saw_it)
    log_in(page, site.url)
    counting = page.locator("#activity-counting")
    expect(counting).to_be_visible()
    expect(page.locator("#activity rect.uncounted")).to_have_count(2)
    shown_counting.set()
    # One counting poll (5 s) and the background count, far from the 60 s poll.
    expect(counting).to_be_hidden(timeout=POLL_WAIT_MS)
    expect(page.locator("#activity rect.uncounted")).to_have_count(0)
    expect(page.locator("#activity rect.event-bar")).to_have_count(19)
    assert "every 60s" in page.locator("#activity .poller").get_attribute("hx-trigger")
