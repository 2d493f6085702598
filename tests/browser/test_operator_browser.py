"""Freezes and the bulk release of stale locks in a real browser."""

from __future__ import annotations

import re
import time

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import OPERATOR, Site, row_action

# "By host"'s release of batch-07's locks, by its name.
RELEASE_BATCH_07 = re.compile(r"^Release its 26 locks of batch-07 ?…$")

pytestmark = pytest.mark.browser


def test_freezing_a_prefix_shows_the_banner_and_the_api_refuses_new_grants(
    operator_page: Page, site: Site
):
    page = operator_page
    page.reload()
    page.get_by_role("link", name="Freeze a prefix…").click()
    panel = page.locator("#action-panel")
    expect(panel.get_by_role("heading")).to_contain_text("Freeze a prefix?")
    panel.get_by_role("textbox", name="Prefix").fill("billing:")
    panel.get_by_label("For how long").fill("2h")
    panel.get_by_label("Reason").fill("ledger migration")
    panel.get_by_role("button", name="Freeze new grants").click()

    expect(page.locator("#messages .message-success")).to_contain_text("Froze billing:")
    summary = page.locator("#freezes summary")
    expect(summary).to_contain_text(
        re.compile(r"1 prefix frozen\s+— ends in (1 h 59 min|2 h)")
    )
    summary.click()
    banner = page.locator("#freezes .freeze-banner")
    expect(banner).to_contain_text("billing:")
    expect(banner).to_contain_text("ledger migration")
    expect(banner).to_contain_text(OPERATOR)
    refused = site.api.post("/api/v1/locks/billing:1", json={"owner": "worker-1"})
    assert refused.status_code == 423
    assert refused.json()["freeze"]["reason"] == "ledger migration"


def test_releasing_all_stale_locks_from_the_stale_tab(operator_page: Page, site: Site):
    for i in range(3):
        site.acquire(f"job:dead-{i}", "worker-dead", ttl=0.5)
    site.acquire("job:alive", "worker-ok", ttl=600)
    time.sleep(1)
    page = operator_page
    page.goto(f"{site.url}/?state=stale")
    page.get_by_role("link", name="Release all stale…").click()
    panel = page.locator("#action-panel")
    expect(panel.get_by_role("heading")).to_contain_text("Force release 3 stale locks?")
    panel.get_by_label("Reason").fill("workers died in the outage")
    panel.get_by_role("button", name="Release 3 stale locks").click()

    expect(page.locator("#messages .message-success")).to_contain_text(
        "Force-released 3 stale lock(s)."
    )
    expect(page.locator("#live .count-stale .count")).to_have_text("0")
    expect(page.locator("#live .count-held .count")).to_have_text("1")
    for i in range(3):
        [latest, *_] = site.events(f"job:dead-{i}")
        assert latest["action"] == "force_released"
        assert latest["reason"] == "workers died in the outage"


def test_a_dead_hosts_26_locks_released_in_five_actions_one_event_each(
    operator_page: Page, site: Site
):
    for i in range(26):
        site.acquire(f"job:b{i}", f"batch-07:{i}:x", ttl=3600)
    site.acquire("job:alive", "web-1:1:y", ttl=3600)
    page = operator_page
    page.reload()
    # 1: By host. 2: the host's release. 3: the reason. 4: the count typed.
    # 5: confirm.
    page.get_by_role("link", name="By host").click()
    page.get_by_role(
        "link", name=re.compile(r"^Release its 26 locks of batch-07 ?…$")
    ).click()
    panel = page.locator("#action-panel")
    expect(panel.get_by_role("heading")).to_contain_text("Force release 26 locks?")
    panel.get_by_label("Reason").fill("batch-07 is dead")
    panel.get_by_label("Type 26 to confirm").fill("26")
    panel.get_by_role("button", name="Release 26 locks").click()
    expect(page.locator("#messages .message-success")).to_contain_text(
        "Force-released 26 locks."
    )
    for i in (0, 13, 25):
        [latest, *_] = site.events(f"job:b{i}")
        assert latest["action"] == "force_released"
        assert latest["reason"] == "batch-07 is dead"
    assert len(site.events("job:b7")) == 2  # acquired, force_released
    [alive] = site.events("job:alive")
    assert alive["action"] == "acquired"


def test_a_bulk_release_leaves_alone_a_lock_that_changed_hands_during_its_confirmation(
    operator_page: Page, site: Site
):
    """The dialog names 26 locks of batch-07 with the fences shown; before the
    operator confirms, one of them is released by its worker and taken by
    another. That one is left alone and reported; the 25 others go."""
    for i in range(26):
        site.acquire(f"job:b{i}", f"batch-07:{i}:x", ttl=3600)
    page = operator_page
    page.reload()
    page.get_by_role("link", name="By host").click()
    page.get_by_role(
        "link", name=re.compile(r"^Release its 26 locks of batch-07 ?…$")
    ).click()
    panel = page.locator("#action-panel")
    expect(panel.get_by_role("heading")).to_contain_text("Force release 26 locks?")

    site.release("job:b5", "batch-07:5:x")
    taken = site.acquire("job:b5", "web-2:1:z", ttl=3600)
    panel.get_by_label("Reason").fill("batch-07 is dead")
    panel.get_by_label("Type 26 to confirm").fill("26")
    panel.get_by_role("button", name="Release 26 locks").click()

    message = page.locator("#messages .message-success")
    expect(message).to_contain_text("Force-released 25 locks.")
    expect(message).to_contain_text(
        f"Left alone 1 that changed hands: job:b5 (now held by web-2:1:z, "
        f"fence {taken['fence']})."
    )
    [latest, *_] = site.events("job:b5")
    assert (latest["action"], latest["owner"]) == ("acquired", "web-2:1:z")
    for i in (0, 4, 6, 25):
        [latest, *_] = site.events(f"job:b{i}")
        assert latest["action"] == "force_released"
    assert (
        sum(
            e["action"] == "force_released"
            for i in range(26)
            for e in site.events(f"job:b{i}")
        )
        == 25
    )


def test_focus_after_a_release_is_on_the_next_row_and_keys_move_between_rows(
    operator_page: Page, site: Site
):
    for name in ("job:a", "job:b", "job:c"):
        site.acquire(name, "worker-1", ttl=600)
    page = operator_page
    page.reload()
    expect(page.locator("#shortcuts")).to_contain_text("/ search")
    page.keyboard.press("/")
    expect(page.locator("#search-prefix")).to_be_focused()
    page.locator("#search-prefix").press("Escape")
    page.locator("h1").click()
    page.keyboard.press("j")
    expect(
        page.locator("#locks-table tbody tr").nth(0).locator("td.resource a")
    ).to_be_focused()
    page.keyboard.press("j")
    expect(
        page.locator("#locks-table tbody tr").nth(1).locator("td.resource a")
    ).to_be_focused()
    # Release job:b from its row with the keyboard; focus goes to job:c's row.
    row = page.locator("#locks-table tbody tr").nth(1)
    row_action(row, "Release…").focus()
    page.keyboard.press("Enter")
    panel = page.locator("#action-panel")
    expect(panel.get_by_label("Why")).to_be_focused()
    page.keyboard.press("Tab")
    expect(panel.get_by_label("Reason")).to_be_focused()
    page.keyboard.type("stuck")
    panel.get_by_role("button", name="Release worker-1’s lock").click()
    expect(page.locator("#messages .message-success")).to_contain_text("Released job:b")
    expect(page.locator("#locks-table tbody tr")).to_have_count(2)
    # Waited for: the page moves focus once the swapped table has settled,
    # which can come after the new row count is visible.
    expect(
        page.locator("#locks-table tbody tr").nth(1).locator("td.resource a")
    ).to_be_focused()
    # And it stays there through the table's next refresh (it went to <body>
    # a second after a release when the table was swapped): a lock acquired
    # elsewhere makes the next poll swap the table in.
    site.acquire("job:d", "worker-2", ttl=600)
    expect(page.locator("#locks-table tbody tr")).to_have_count(3, timeout=12_000)
    expect(page.locator("#locks-table td.resource a[title='job:c']")).to_be_focused()


def test_a_stuck_session_is_found_and_ended_from_the_sessions_page_in_four_actions(
    operator_page: Page, site: Site
):
    """A worker's 2 s session stopped its heartbeats: 1 Sessions, 2 its "End
    session…", 3 the reason, 4 confirm; its locks are free and focus is on
    the next row."""
    stuck = site.api.post("/api/v1/sessions", json={"owner": "w-stuck", "ttl": 2})
    assert stuck.status_code == 201, stuck.text
    stuck_id = stuck.json()["id"]
    for name in ("job:s1", "job:s2"):
        response = site.api.post(
            f"/api/v1/locks/{name}", json={"owner": "w-stuck", "session": stuck_id}
        )
        assert response.status_code == 200, response.text
    alive = site.api.post("/api/v1/sessions", json={"owner": "w-alive", "ttl": 600})
    deadline = time.monotonic() + 10
    while site.api.get(f"/api/v1/sessions/{stuck_id}").json()["ttl_remaining"] > 0:
        assert time.monotonic() < deadline, "the session did not run out"
        time.sleep(0.2)  # polled to a deadline: its 2 s ttl runs out
    page = operator_page
    page.get_by_role("link", name="Sessions").click()
    row = page.locator(f"#session-{stuck_id}")
    expect(row).to_contain_text("overdue by", timeout=5_000)
    row.get_by_role("link", name="End session… of w-stuck").click()
    panel = page.locator("#action-panel")
    panel.get_by_label("Reason").fill("worker wedged")
    panel.get_by_role("button", name="End the session and release its locks").click()
    expect(page.locator("#messages .message-success")).to_contain_text(
        "Ended the session of w-stuck"
    )
    expect(row).to_have_count(0)
    next_row = f"session-{alive.json()['id']}-end"
    expect(page.locator(f"#{next_row}")).to_be_focused()
    for name in ("job:s1", "job:s2"):
        [latest, *_] = site.events(name)
        assert latest["action"] == "released"
