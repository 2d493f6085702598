"""The lock page of a semaphore with three holders: one force-released by its
own button (a reason, the fence it shows), the other two stay."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import Site

pytestmark = pytest.mark.browser


def test_one_of_three_holders_force_released_by_its_own_button(
    operator_page: Page, site: Site
):
    fences = []
    for owner in ("w-1", "w-2", "w-3"):
        response = site.api.post(
            "/api/v1/locks/sem:b", json={"owner": owner, "ttl": 600, "limit": 3}
        )
        assert response.status_code == 200, response.text
        fences.append(response.json()["lock"]["fence"])
    page = operator_page
    page.goto(f"{site.url}/locks/sem:b")
    expect(page.locator("#holders-used")).to_have_text("3 of 3 places")
    expect(page.locator("#holders-table tbody tr")).to_have_count(3)

    page.locator(f"#holder-{fences[1]}-release").click()
    dialog = page.locator("#action-dialog")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("w-2")
    dialog.get_by_label("Reason").fill("w-2 is wedged")
    dialog.get_by_role("button", name=f"Release fence {fences[1]}").click()

    # The page shows the new holders before the next poll could.
    expect(page.locator("#holders-used")).to_have_text("2 of 3 places", timeout=2_000)
    rows = page.locator("#holders-table tbody tr")
    expect(rows).to_have_count(2)
    expect(page.locator(f"#holder-{fences[1]}")).to_have_count(0)
    expect(page.locator(f"#holder-{fences[0]}")).to_contain_text("w-1")
    expect(page.locator(f"#holder-{fences[2]}")).to_contain_text("w-3")
    forced = [e for e in site.events("sem:b") if e["action"] == "force_released"]
    assert [(e["owner"], e["fence"], e["reason"]) for e in forced] == [
        ("w-2", fences[1], "w-2 is wedged")
    ]
    held = site.api.get("/api/v1/locks/sem:b/holders").json()["holders"]
    assert [h["owner"] for h in held] == ["w-1", "w-3"]
