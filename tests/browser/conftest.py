"""Browser tests: Playwright driving Debian's Chromium against a live server.

Never a downloaded browser: ``/usr/bin/chromium`` (the ``chromium`` package, which
``.ci/run`` installs). Without it the tests skip locally and fail under CI=true.

Every test gets its own server (a threaded Werkzeug server on a fresh file SQLite
database, CSRF on) with an operator account, and its own browser context. Any
console error, page error, failed request, HTTP error response or Content Security
Policy violation fails the test. A failing test leaves a screenshot and a trace
under ``test-artifacts/`` (gitignored).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, BrowserType, Page, Playwright, sync_playwright

from app.paths import PROJECT_ROOT
from tests.live_server import LiveServer, serve

CHROMIUM = Path(os.environ.get("LOCKKEEPER_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = PROJECT_ROOT / "test-artifacts"
IN_CI = os.environ.get("CI", "").lower() == "true"

OPERATOR = "olivia"
OPERATOR_PASSWORD = "correct horse battery"


def pytest_configure(config):
    # pytest-playwright's own defaults keep nothing; keep evidence of failures,
    # unless the command line asked for something else.
    option = config.option
    if getattr(option, "output", None) == "test-results":
        option.output = str(ARTIFACTS)
    if getattr(option, "screenshot", None) == "off":
        option.screenshot = "only-on-failure"
    if getattr(option, "tracing", None) == "off":
        option.tracing = "retain-on-failure"


# pytest-playwright keeps one Playwright for the whole session, and its sync API
# leaves an asyncio loop marked as running in the main thread for as long as it
# lives: an asyncio test that runs after a browser test in the same process then
# fails ("Cannot run the event loop while another loop is running"). So
# Playwright and its browser live while this package's tests run, and end before
# pytest moves on to any other test.
@pytest.fixture(scope="package")
def playwright(_pw_api_request_contexts) -> Iterator[Playwright]:
    started = sync_playwright().start()
    if _pw_api_request_contexts:
        _pw_api_request_contexts.instrument(started)
    yield started
    started.stop()


@pytest.fixture(scope="package")
def browser_type(playwright: Playwright, browser_name: str) -> BrowserType:
    return getattr(playwright, browser_name)


@pytest.fixture(scope="package")
def launch_browser(browser_type_launch_args, browser_type: BrowserType):
    def launch(**options) -> Browser:
        return browser_type.launch(**{**browser_type_launch_args, **options})

    return launch


@pytest.fixture(scope="package")
def browser(launch_browser) -> Iterator[Browser]:
    launched = launch_browser()
    yield launched
    launched.close()


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    if not CHROMIUM.exists():
        message = f"no Chromium at {CHROMIUM} (apt-get install chromium)"
        if IN_CI:
            pytest.fail(f"{message}; CI=true: a missing browser fails the run")
        pytest.skip(message)
    return {
        **browser_type_launch_args,
        "executable_path": str(CHROMIUM),
        "args": CHROMIUM_ARGS,
    }


@pytest.fixture(scope="session")
def base_url():
    """Shadows pytest-playwright's own, a session fixture defined as a method that
    pytest 9 warns about (an error here). Tests use absolute URLs of their server."""
    return None


@pytest.fixture
def browser_context_args():
    """Replaces pytest-playwright's own (a session fixture that asks for the
    Playwright above); its --device and --video options are not used here."""
    return {"accept_downloads": True}


# -- the server -------------------------------------------------------------


@dataclass
class Site:
    """The live server plus what a browser test does to it from outside."""

    server: LiveServer
    api: httpx.Client

    @property
    def url(self) -> str:
        return self.server.url

    def acquire(self, resource: str, owner: str, ttl: float = 120) -> dict:
        response = self.api.post(
            f"/api/v1/locks/{resource}", json={"owner": owner, "ttl": ttl}
        )
        assert response.status_code == 200, response.text
        return response.json()["lock"]

    def release(self, resource: str, owner: str) -> None:
        response = self.api.request(
            "DELETE", f"/api/v1/locks/{resource}", json={"owner": owner}
        )
        assert response.status_code == 204, response.text

    def events(self, resource: str) -> list[dict]:
        response = self.api.get(f"/api/v1/locks/{resource}/events")
        assert response.status_code == 200, response.text
        return response.json()["events"]


@pytest.fixture
def site_clock():
    """The server's clock: the real one, unless a test module overrides this
    fixture with a ``tests.clock.FakeClock`` it moves."""
    return None


@pytest.fixture
def site(make_app, site_clock) -> Iterator[Site]:
    from app.auth.service import create_user

    app = make_app(**({"LOCKKEEPER_CLOCK": site_clock} if site_clock else {}))
    with app.app_context():
        create_user(OPERATOR, OPERATOR_PASSWORD, "operator")
    with (
        serve(app) as server,
        httpx.Client(
            base_url=server.url, headers=server.auth_headers, timeout=10
        ) as api,
    ):
        yield Site(server, api)


# -- the browser ------------------------------------------------------------


@dataclass
class BrowserProblems:
    """Everything that went wrong in the page, as readable lines."""

    lines: list[str] = field(default_factory=list)
    # Requests the test itself cut short (a navigation away from a poll in flight).
    allowed_aborts: list[re.Pattern] = field(default_factory=list)


# Chromium reports CSP violations on the console; this catches them as events too,
# including ones the console message would not name (e.g. in report-only mode).
_CSP_LISTENER = """
document.addEventListener("securitypolicyviolation", (event) => {
  console.error(
    `CSP violation: ${event.violatedDirective} blocked ${event.blockedURI}`);
});
"""


@pytest.fixture
def problems(page: Page) -> Iterator[BrowserProblems]:
    found = BrowserProblems()
    page.add_init_script(_CSP_LISTENER)

    def on_console(message):
        if message.type == "error":
            found.lines.append(f"console error: {message.text} ({message.location})")

    def on_request_failed(request):
        failure = request.failure or ""
        if "ERR_ABORTED" in failure and any(
            p.search(request.url) for p in found.allowed_aborts
        ):
            return
        found.lines.append(f"request failed: {request.method} {request.url} {failure}")

    def on_response(response):
        if response.status >= 400:
            found.lines.append(
                f"HTTP {response.status}: {response.request.method} {response.url}"
            )

    page.on("console", on_console)
    page.on("pageerror", lambda error: found.lines.append(f"page error: {error}"))
    page.on("requestfailed", on_request_failed)
    page.on("response", on_response)
    yield found
    if found.lines:
        pytest.fail("the browser saw problems:\n" + "\n".join(found.lines))


@pytest.fixture
def operator_page(page: Page, site: Site, problems: BrowserProblems) -> Page:
    """A page logged in as the operator, on the overview."""
    page.set_default_timeout(10_000)
    page.goto(site.url + "/")
    page.get_by_label("Username").fill(OPERATOR)
    page.get_by_label("Password").fill(OPERATOR_PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.get_by_role("heading", name="Locks").wait_for()
    return page


def leave_for_blank(page: Page, problems: BrowserProblems) -> None:
    """Replace the page with ``about:blank``, so that nothing of it runs any more.

    For a test that counts a fresh page's requests: the page the login left
    open polls on the real clock, and Chromium drops a poll still in flight
    when its page is replaced without a ``requestfinished`` or
    ``requestfailed`` event, so a test that saw it sent waits for it forever.
    Left before the test listens, the old page has nothing left to send. (Should
    Chromium report such a poll as aborted after all, that is no fault.)"""
    problems.allowed_aborts.append(re.compile(r"[?&]live=1(&|$)"))
    page.goto("about:blank")


def row_action(row, name: str):
    """A row's action link, its menu opened first (a row shows one "Actions" menu)."""
    menu = row.locator("details.row-menu")
    if menu.get_attribute("open") is None:
        menu.locator("summary").click()
    return row.get_by_role("link", name=name)
