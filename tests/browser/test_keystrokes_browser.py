"""Keystrokes, keyboard only: an operator's two most common emergencies, counted
from the overview just loaded (focus on the page, nothing selected), with every
key pressed counted, each typed character included."""

from __future__ import annotations

import pytest
from playwright.sync_api import Locator, Page, expect

from tests.browser.conftest import Site

pytestmark = pytest.mark.browser

RELEASE_BUDGET = 12
FREEZE_BUDGET = 10
RELEASE_REASON = "Dead holder: its host or process is gone"


class CountedKeyboard:
    """``page.keyboard``, counting: a press is one key, a typed text one per
    character. The tests below touch the page through nothing else."""

    def __init__(self, page: Page) -> None:
        self.keyboard = page.keyboard
        self.count = 0

    def press(self, key: str) -> None:
        self.count += 1
        self.keyboard.press(key)

    def type(self, text: str) -> None:
        self.count += len(text)
        self.keyboard.type(text)


def confirm_with_a_usual_reason(
    keys: CountedKeyboard, dialog: Locator, letter: str, reason: str
) -> None:
    """From the dialog's reason picker (focused): its first letter, Enter."""
    why = dialog.get_by_label("Why")
    expect(why).to_be_focused()
    keys.press(letter)
    expect(why).to_have_value(reason)
    keys.press("Enter")


def three_prefixes(site: Site) -> None:
    """An overview of 40 locks over three prefixes, more than one page."""
    for n in range(1, 26):
        site.acquire(f"job:{n}", f"web-{n % 3}:{n}:a", ttl=3600)
    for n in range(1, 9):
        site.acquire(f"sync:eu-{n}", f"sync-{n}:1:b", ttl=3600)
    for n in range(1, 8):
        site.acquire(f"billing:{n}", f"db-{n}:1:c", ttl=3600)


def test_force_releasing_a_named_lock_takes_at_most_12_keystrokes(
    operator_page: Page, site: Site
):
    """A named lock: the operator knows its whole name (``job:17``, which no
    other lock's name starts with) and types all of it into the search. Then
    Enter (to the first row found), r (release), the first letter of a usual
    reason (d: the holder is dead), Enter (confirm): 11 keys."""
    three_prefixes(site)
    page = operator_page
    page.reload()
    keys = CountedKeyboard(page)

    keys.press("/")
    expect(page.locator("#search-prefix")).to_be_focused()
    keys.type("job:17")
    keys.press("Enter")
    found = page.locator("#locks-table tbody tr td.resource a")
    expect(found).to_have_text(["job:17"])
    expect(found.first).to_be_focused()
    keys.press("r")
    dialog = page.locator("#action-dialog")
    expect(dialog.get_by_role("heading")).to_contain_text("Force release job:17?")
    confirm_with_a_usual_reason(keys, dialog, "d", RELEASE_REASON)

    expect(page.locator("#messages .message-success")).to_contain_text(
        "Released job:17"
    )
    [latest, *_] = site.events("job:17")
    assert latest["action"] == "force_released"
    assert latest["reason"] == RELEASE_REASON
    assert site.events("job:1")[0]["action"] == "acquired"  # only the named one
    print(f"force release of a named lock: {keys.count} keystrokes")
    assert keys.count <= RELEASE_BUDGET


def test_freezing_a_prefix_takes_at_most_10_keystrokes(operator_page: Page, site: Site):
    """f (the freeze dialog, on its first empty field: the prefix), the prefix
    typed whole (``sync:``), Tab (to the reason), the first letter of a usual
    reason (m: maintenance), Enter (confirm; the freeze lasts until unfrozen,
    the form's default): 9 keys."""
    three_prefixes(site)
    page = operator_page
    page.reload()
    keys = CountedKeyboard(page)

    keys.press("f")
    dialog = page.locator("#action-dialog")
    expect(dialog.get_by_role("heading")).to_contain_text("Freeze a prefix?")
    expect(dialog.get_by_role("textbox", name="Prefix")).to_be_focused()
    keys.type("sync:")
    keys.press("Tab")
    confirm_with_a_usual_reason(keys, dialog, "m", "Maintenance")

    expect(page.locator("#messages .message-success")).to_contain_text(
        "Froze sync:: no new grants until unfrozen."
    )
    refused = site.api.post("/api/v1/locks/sync:eu-9", json={"owner": "sync-9"})
    assert refused.status_code == 423
    assert refused.json()["freeze"]["reason"] == "Maintenance"
    print(f"freeze of a prefix: {keys.count} keystrokes")
    assert keys.count <= FREEZE_BUDGET
