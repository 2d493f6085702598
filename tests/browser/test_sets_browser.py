"""A set in the browser: a member's lock page links to the set, whose page
lists its members; an operator releases the set as one from the lock page's
dialog, and the page shows the lock free before the next poll could."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import Site

pytestmark = pytest.mark.browser


def test_a_set_released_as_one_from_a_members_lock_page(
    operator_page: Page, site: Site
):
    members = [{"resource": "acct:1"}, {"resource": "acct:2", "mode": "shared"}]
    granted = site.api.post(
        "/api/v1/sets", json={"owner": "mover", "ttl": 600, "members": members}
    )
    assert granted.status_code == 200, granted.text
    set_id = granted.json()["set"]
    fence = granted.json()["locks"][0]["fence"]
    page = operator_page
    page.goto(f"{site.url}/locks/acct:1")
    expect(page.locator(f"#lock-set-{fence}")).to_contain_text(set_id)
    expect(page.locator("#history a.set-link")).to_have_count(1)

    page.locator(f"#lock-set-{fence}-release").click()
    dialog = page.locator("#action-dialog")
    expect(dialog).to_be_visible()
    expect(dialog.locator("#release-set-list li")).to_have_count(2)
    dialog.get_by_label("Reason").fill("the mover is wedged")
    dialog.get_by_role("button", name="Release the set (2 locks)").click()
    expect(page.locator("#lock-state")).to_contain_text("Not locked", timeout=2_000)
    expect(page.locator("#lock-sets")).to_have_count(0)

    page.goto(f"{site.url}/sets/{set_id}")
    expect(page.locator("#set-members-heading")).to_contain_text("0 of 2")
    expect(page.locator("#set-events tbody tr")).to_have_count(4)
