"""Regenerate the dashboard screenshots in this folder.

    .venv/bin/python docs/screenshots/make_screenshots.py

Serves the app on a throwaway SQLite database filled with demo locks (their
history written at earlier moments through a movable clock), logs in through the
real form with Debian's Chromium driven by Playwright, and writes
``<page>-<light|dark>.png`` at 1440×900, ``<page>-phone-<light|dark>.png`` at
390×844 (a phone) and ``<page>-1920-light.png`` at 1920×1080.
"""

from __future__ import annotations

import sys
import tempfile
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

from playwright.sync_api import sync_playwright
from werkzeug.serving import make_server

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from app import create_app  # noqa: E402
from app.auth.service import create_user  # noqa: E402
from app.extensions import lock_service  # noqa: E402

PASSWORD = "screenshot-password"
CHROMIUM_ARGS = [
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


class DemoClock:
    """The host clock shifted by ``offset``: history is written in the past."""

    def __init__(self) -> None:
        self.offset = timedelta(0)

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def at(self, minutes_ago: float) -> None:
        self.offset = -timedelta(minutes=minutes_ago)


def fill(app, clock: DemoClock) -> None:
    with app.app_context():
        create_user("admin", PASSWORD, "operator")
        locks = lock_service()
        history = "report:monthly-2026-05"
        clock.at(180)
        locks.acquire(history, "worker-a", ttl=600, actor="batch")
        for minutes in (172, 164):
            clock.at(minutes)
            locks.renew(history, "worker-a", ttl=600, actor="batch")
        clock.at(140)
        locks.acquire(history, "worker-b", ttl=1800, actor="batch")
        clock.at(115)
        locks.release(history, "worker-b", actor="batch")
        clock.at(90)
        locks.acquire(history, "worker-c", ttl=7200, actor="batch")
        # A busy lock: renewed every 20 s for an hour (folded into its grant).
        for step in range(180):
            clock.at(85 - step / 3)
            locks.renew(history, "worker-c", ttl=7200, actor="batch")
        clock.at(25)
        locks.claim(
            history,
            "operator:admin",
            3600,
            actor="admin",
            reason="worker-c hung on a locked table",
            force=True,
        )
        clock.at(40)
        locks.acquire("job:reindex", "indexer@host-9", ttl=300, actor="batch")
        clock.at(30)
        locks.acquire(
            "storage:compaction.tenant-0042.partition-2026-11-30-segment-17",
            "compactor-7@storage-node-12.eu-west.internal:48213:3f9a2c1d",
            ttl=240,
            actor="batch",
        )
        clock.at(12)
        locks.acquire("cache:warmup", "warmer-1", ttl=60, actor="batch")
        locks.acquire("billing:invoice-run", "billing-2", ttl=300, actor="batch")
        clock.at(4)
        locks.acquire("job:nightly-etl", "etl@host-3", ttl=7200, actor="batch")
        for n in range(1, 6):
            locks.acquire(f"queue:emails.{n}", f"mailer-{n}", ttl=900, actor="batch")
        clock.at(0)
        for prefix, hours, reason in (
            ("billing:", 2, "ledger migration"),
            ("report:", 1, "warehouse upgrade"),
            ("sync:", None, "partner API outage"),
        ):
            locks.freeze(
                prefix,
                actor="admin",
                reason=reason,
                duration=timedelta(hours=hours) if hours else None,
            )
        locks.acquire("job:42", "worker-7@host-2", ttl=12, actor="batch")
        # A semaphore of 5 (report builds sharing a licence), 3 holders taken at
        # different moments, and a cache read by two shared holders.
        for minutes, n in ((9, 1), (6, 2), (2, 3)):
            clock.at(minutes)
            locks.acquire(
                "build:licensed-reports", f"builder-{n}@host-{n + 4}", ttl=900,
                limit=5, actor="batch",
            )  # fmt: skip
        for minutes, n in ((7, 1), (3, 2)):
            clock.at(minutes)
            locks.acquire(
                "cache:catalog", f"reader-{n}", ttl=600, mode="shared", actor="batch"
            )
        # A writer waiting behind the two readers, and a reader behind it (the
        # places a waiting acquire holds in line, here without its request).
        clock.at(1)
        locks.queue.join("cache:catalog", "rebuilder@host-6", "workers", 3600)
        clock.at(0.5)
        locks.queue.join("cache:catalog", "reader-3", "workers", 3600, mode="shared")
        clock.at(0)
        locks.acquire("deploy:api", "ci-runner-18", ttl=1200, actor="ci")
        # A leader elected through a session, and a stuck session a host left
        # behind (its last heartbeat long ago, overdue).
        clock.at(30)
        stuck = locks.sessions.create("scheduler@host-4", 600, token="workers")
        locks.acquire(
            "leader:scheduler", "scheduler@host-4", session=stuck.id, token="workers"
        )
        clock.at(0)
        live = locks.sessions.create("election@host-2", 15, token="workers")
        locks.acquire(
            "leader:election", "election@host-2", session=live.id, token="workers"
        )


def main() -> None:
    with tempfile.TemporaryDirectory() as instance:
        clock = DemoClock()
        app = create_app(
            {
                "LOCKKEEPER_INSTANCE_PATH": instance,
                "LOCKKEEPER_BOOTSTRAP": False,
                "LOCKKEEPER_CLOCK": clock,
                "SECRET_KEY": "screenshots",
            }
        )
        fill(app, clock)
        server = make_server("127.0.0.1", 0, app, threaded=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        base = f"http://127.0.0.1:{server.server_port}"
        pages = {
            "overview": "/",
            "lock": "/locks/report:monthly-2026-05",
            "audit": "/audit",
            "semaphore": "/locks/build:licensed-reports",
            "shared": "/locks/cache:catalog",
            "sessions": "/sessions",
            "hosts": "/?group=host",
        }
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(
                    executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS
                )
                shots = [
                    (scheme, suffix, viewport)
                    for scheme in ("light", "dark")
                    for suffix, viewport in (
                        ("", {"width": 1440, "height": 900}),
                        ("-phone", {"width": 390, "height": 844}),
                    )
                ] + [("light", "-1920", {"width": 1920, "height": 1080})]
                for scheme, suffix, viewport in shots:
                    context = browser.new_context(
                        viewport=viewport,
                        color_scheme=scheme,
                        device_scale_factor=1,
                    )
                    page = context.new_page()
                    page.goto(f"{base}/login")
                    page.fill("#username", "admin")
                    page.fill("#password", PASSWORD)
                    page.click("button[type=submit]")
                    page.wait_for_url(f"{base}/")
                    for name, path in pages.items():
                        response = page.goto(base + path)
                        if response is None or response.status != 200:
                            print(f"skipped {name}: {path} is not there yet")
                            continue
                        page.wait_for_load_state("networkidle")
                        target = HERE / f"{name}{suffix}-{scheme}.png"
                        page.screenshot(path=str(target), full_page=True)
                        print(f"wrote {target.relative_to(HERE.parent.parent)}")
                    context.close()
                browser.close()
        finally:
            server.shutdown()


if __name__ == "__main__":
    main()
